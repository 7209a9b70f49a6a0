"""Trace the rank roles of a recipe, each in a process of its own with the shim preloaded.

A role is a rank whose memory differs from the others': each pipeline stage (its layers,
the embedding on the first, the output layer and logprob head on the last, the 1F1B
in-flight count). TP ranks of a stage hold equal shards; CP ranks equal halves of every
sequence (the load-balanced split gives each two chunks of one size); EP ranks equal expert
counts; DP ranks equal shards. So one rank per stage is traced: tensor, context, expert and
data-parallel rank 0 of it.

The rank itself runs in ``python -m dapo_megatron.megatron.fake_trace`` (the planner never
imports Megatron). A trace that cannot run reports one line naming the op and module where
it stopped; the plan still prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.planning.step_time import TracedRank
from dapo_megatron.planning.trace.shim import ShimUnavailable, build_shim

TRACE_TIMEOUT_S = 600
"""Per role; a 70B stage traces in about a minute on 2 cores."""


@dataclass(frozen=True)
class Role:
    """One traced rank."""

    name: str
    """How reports name it ("stage 0", ...)."""
    rank: int
    """Global rank in the policy world."""
    stage: int
    """Its pipeline stage."""


@dataclass(frozen=True)
class RoleTrace:
    """What the rank process measured (fake_trace/rank.py's JSON), or why it could not."""

    role: Role
    """The traced rank."""
    phases: dict[str, Any]
    """Phase -> {peak_bytes, categories, resident_bytes, trace_s}; empty on failure."""
    wall_s: float
    """Wall time of the whole rank process (start-up, build, both phases)."""
    error: str | None = None
    """One line: the op and module where the trace stopped."""
    ops: TracedRank | None = None
    """FLOPs and bytes of every op of the traced phases (the step-time estimate's basis)."""


def roles(dims: ParallelDims) -> list[Role]:
    """One rank per pipeline stage (module docstring). Megatron orders ranks tp-cp-ep-dp-pp
    (parallel_state.initialize_model_parallel's default order): the stage is the outermost
    coordinate, so stage k starts at rank k x world/PP."""
    per_stage = dims.world_size // dims.pp
    out = []
    for stage in range(dims.pp):
        extra = []
        if dims.cp > 1:
            extra.append("CP rank 0")
        if dims.ep > 1:
            extra.append("EP rank 0")
        name = f"stage {stage}" + (f" ({', '.join(extra)})" if extra else "")
        out.append(Role(name=name, rank=stage * per_stage, stage=stage))
    return out


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def failure_line(stderr: str) -> str:
    """The op and module of a failed trace, from its traceback: the error's last line and
    the innermost frame in dapo_megatron or megatron."""
    lines = [ln.removeprefix("[rank0]: ") for ln in stderr.strip().splitlines()]
    error = next((ln for ln in reversed(lines) if re.match(r"^\w[\w.]*(Error|Exception)", ln)), "")
    where = ""
    for ln in lines:
        m = _FRAME.search(ln)
        if m and ("dapo_megatron" in m.group(1) or "megatron/core" in m.group(1)):
            short = m.group(1).split("site-packages/")[-1].split("/work/")[-1]
            where = f"{short}:{m.group(2)} ({m.group(3)})"
    if not error:
        error = lines[-1] if lines else "no output"
    return f"{error[:300]} at {where or 'an unknown place'}"


def trace_role(
    recipe: Path,
    overrides: list[str],
    role: Role,
    *,
    micro_batches: int,
    gpu_bytes: int,
    timeout_s: float = TRACE_TIMEOUT_S,
) -> RoleTrace:
    """Run one role's trace; never raises for a failing trace (``RoleTrace.error``)."""
    try:
        shim = build_shim()
    except ShimUnavailable as error:
        return RoleTrace(role, {}, 0.0, error=str(error))
    with tempfile.TemporaryDirectory(prefix="dapo-trace-") as tmp:
        spec = Path(tmp) / "spec.json"
        out = Path(tmp) / "out.json"
        spec.write_text(
            json.dumps(
                {
                    "recipe": str(recipe),
                    "overrides": list(overrides),
                    "rank": role.rank,
                    "micro_batches": micro_batches,
                    "gpu_bytes": gpu_bytes,
                }
            )
        )
        env = dict(os.environ, LD_PRELOAD=str(shim), PYTHONWARNINGS="ignore")
        cmd = [sys.executable, "-m", "dapo_megatron.megatron.fake_trace", str(spec), str(out)]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return RoleTrace(role, {}, timeout_s, error=f"no result within {timeout_s:.0f} s")
        if done.returncode != 0 or not out.exists():
            return RoleTrace(role, {}, 0.0, error=failure_line(done.stderr))
        result = json.loads(out.read_text())
    ops = TracedRank.from_json(result["ops"]) if "ops" in result else None
    return RoleTrace(role, result["phases"], float(result["wall_s"]), ops=ops)
