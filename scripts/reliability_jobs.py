"""The faults of scripts/reliability_cases.py that need a running job: each case starts the
tiny recipe, injects its fault for real (a signal, a stopped process, a full disk, a lost
node) and returns what the user sees: the exit status, the seconds from the fault to the
exit and the line that names the outcome.

Each case is a function (tmp directory, model directory) -> JobOutcome, listed in
JOB_CASES; reliability_cases.py runs them after the cases that fail before any worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
# A job that keeps running until the fault: long, no periodic checkpoint after step 1.
LONG_JOB = [
    "dapo.max_num_steps=1000",
    "sft_warmup.num_steps=30",
    "dapo.dynamic_sampling.max_gen_batches=0",
    "checkpointing.save_period=1",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "logger.progress_bar=false",
    "logger.plots=false",
    "checkpointing.export_hf=false",
]


@dataclass
class JobOutcome:
    rc: int
    seconds: float
    """From the fault to the exit."""
    output: str


def env() -> dict[str, str]:
    return dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


def start(run_dir: Path, model: Path, *overrides: str) -> subprocess.Popen[str]:
    """The tiny job in its own session, returned once it has logged a step."""
    cmd = [
        sys.executable,
        "-m",
        "dapo_megatron.cli",
        "--config",
        str(TINY),
        f"run.output_dir={run_dir}",
        f"policy.model_name_or_path={model}",
        *LONG_JOB,
        *overrides,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and metrics.read_text().strip():
            break
        time.sleep(0.1)
    return proc


def workers(proc: subprocess.Popen[str], actor_class: str = "PolicyWorker") -> list[int]:
    """Pids of this job's Ray actors of a class (other jobs on the machine may run some)."""
    return [
        p.pid
        for p in psutil.Process(proc.pid).children(recursive=True)
        if f"ray::{actor_class}" in " ".join(p.cmdline())
    ]


def finish(proc: subprocess.Popen[str], fault_at: float, timeout: float = 600) -> JobOutcome:
    output, _ = proc.communicate(timeout=timeout)
    return JobOutcome(proc.returncode, time.monotonic() - fault_at, output)


def preemption(tmp: Path, model: Path) -> JobOutcome:
    """SIGTERM to dapo-train in the middle of a run (what slurm/ray.sub forwards)."""
    proc = start(tmp / "preempted", model, "checkpointing.save_period=1000")
    fault_at = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    return finish(proc, fault_at)


JOB_CASES: list[tuple[str, Callable[[Path, Path], JobOutcome]]] = [
    ("SIGTERM mid-run (Slurm preemption / time limit)", preemption),
]


def shown(outcome: JobOutcome) -> str:
    """The lines a user reads first: errors, preemption and restart lines."""
    keys = ("error:", "preempted:", "interrupted:", "[restart", "Traceback", "Unhandled")
    lines = [x for x in outcome.output.splitlines() if x.startswith(keys)]
    return " | ".join(lines[:3]) if lines else outcome.output.strip().splitlines()[-1]
