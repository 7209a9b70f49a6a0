"""The GPU first-contact check: every GPU-only path of the package, once, in a few minutes.

    bash scripts/gpu_check.sh                 # on a GPU node (or here: CPU twins + skips)
    python -m dapo_megatron.gpu_check --sections kernels,megatron_step --budget-s 300

Each section runs in a FRESH subprocess (a crash or a poisoned CUDA context costs one
section, not the run) under a timeout taken from one global budget (default 450 s, so the
whole check ends inside 8 minutes). A section returns a dict of figures and checks; a
failed check raises, and the runner records the traceback's last lines and goes on. On a
machine without CUDA, sections that have a CPU twin run it (gloo for NCCL, shared memory
for CUDA IPC, the CPU compatibility layer for Megatron) and the others are recorded as
skipped with the reason. The JSON (``--out``; default ``bench/results/gpu_check_<gpu>.json``,
``<gpu>`` = ``cpu`` without CUDA) holds the environment and one record per section:
``status`` (passed | failed | skipped | timeout), ``seconds``, ``reason`` or ``error``, and
the section's ``result``. The exit status is 1 when any section failed or timed out.

Sections (what each proves is in its module's docstring):
  env             versions, device, the measured copy bandwidth and bf16 GEMM rate
  kernels         the Triton logprob kernels against the chunked path at N=16384, H=4096,
                  V=151936 bf16 (forward and backward), timed against the three GEMMs
  pg_loss         the fused Triton PG loss against the float64 torch loss, timed
  ipc_transport   the refit's handle transport between two processes, byte-exact
  collectives     dapo_megatron.device.collectives on a one-rank NCCL group, communication forced
  megatron_step   one Megatron train step and one packed logprob pass at TP1 (local spec)
                  against an HF float64 reference
  memory_release  the colocated phase change returns the training peak to the driver
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SECTIONS: dict[str, tuple[str, float]] = {
    # name: (module:function, its own time limit in seconds)
    "env": ("dapo_megatron.gpu_check.kernels:env_section", 90),
    "kernels": ("dapo_megatron.gpu_check.kernels:logprob_section", 200),
    "pg_loss": ("dapo_megatron.gpu_check.kernels:pg_loss_section", 90),
    "ipc_transport": ("dapo_megatron.gpu_check.transport:ipc_section", 120),
    "collectives": ("dapo_megatron.gpu_check.transport:collectives_section", 90),
    "megatron_step": ("dapo_megatron.megatron.first_contact:megatron_step_section", 200),
    "memory_release": ("dapo_megatron.gpu_check.transport:memory_release_section", 60),
}


def _gpu_slug() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0).lower()
    for key in ("h200", "h100", "h20", "b200", "a100", "l40s", "a10"):
        if key in name:
            return key
    return "".join(c if c.isalnum() else "_" for c in name).strip("_") or "gpu"


def _run_child(name: str, limit_s: float) -> dict[str, Any]:
    """Run one section in a fresh interpreter; its record (status, seconds, result...)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as handle:
        result_path = handle.name
    cmd = [
        sys.executable,
        "-m",
        "dapo_megatron.gpu_check",
        "--child",
        SECTIONS[name][0],
        "--result",
        result_path,
    ]
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=REPO, timeout=limit_s, capture_output=True, text=True
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-1500:]
        return {
            "status": "timeout",
            "seconds": round(time.monotonic() - start, 1),
            "error": f"no result within {limit_s:.0f} s",
            "log_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail,
        }
    seconds = round(time.monotonic() - start, 1)
    try:
        record: dict[str, Any] = json.loads(Path(result_path).read_text() or "{}")
    except json.JSONDecodeError:
        record = {}
    finally:
        Path(result_path).unlink(missing_ok=True)
    if not record:
        record = {
            "status": "failed",
            "error": f"the section's process exited with {proc.returncode} before reporting",
        }
    record["seconds"] = seconds
    if record["status"] != "passed":
        record["log_tail"] = (proc.stdout + proc.stderr)[-2500:]
    return record


def _child(target: str, result_path: str) -> None:
    """In the section's own process: run ``module:function``, write its record."""
    import importlib

    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        result = func()
        if isinstance(result, str):  # a section that cannot run here says why
            record: dict[str, Any] = {"status": "skipped", "reason": result}
        else:
            record = {"status": "passed", "result": result}
    except Exception as exc:  # recorded, not raised: the runner goes on with the next section
        record = {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc()[-3000:],
        }
    Path(result_path).write_text(json.dumps(record, indent=1, default=str))


def _environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    for pkg in ("triton", "megatron.core", "transformers", "transformer_engine", "vllm", "ray"):
        try:
            module = __import__(pkg, fromlist=["__version__"])
            info[pkg] = getattr(module, "__version__", "installed")
        except Exception as exc:  # absent on the first-contact machine: recorded, not fatal
            info[pkg] = f"absent ({type(exc).__name__})"
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
    parser.add_argument("--budget-s", type=float, default=450.0, help="whole-run time budget")
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/...)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.result)
        return 0

    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    start = time.monotonic()
    report: dict[str, Any] = {"environment": _environment(), "budget_s": args.budget_s}
    sections: dict[str, Any] = {}
    for name in names:
        left = args.budget_s - (time.monotonic() - start)
        if left < 15:
            sections[name] = {"status": "skipped", "reason": f"budget spent ({left:.0f} s left)"}
        else:
            print(f"[gpu-check] {name} ...", flush=True)
            sections[name] = _run_child(name, min(SECTIONS[name][1], left))
        record = sections[name]
        detail = record.get("reason") or record.get("error") or ""
        print(
            f"[gpu-check] {name}: {record['status']} ({record.get('seconds', 0)} s) {detail}"[:400]
        )
    report["sections"] = sections
    report["seconds"] = round(time.monotonic() - start, 1)
    counts = {
        s: sum(r["status"] == s for r in sections.values())
        for s in ("passed", "failed", "skipped", "timeout")
    }
    report["summary"] = counts
    out = Path(args.out or REPO / "bench" / "results" / f"gpu_check_{_gpu_slug()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"[gpu-check] {counts} in {report['seconds']} s -> {out}")
    for name, record in sections.items():
        if record["status"] == "skipped":
            print(f"[gpu-check] skipped {name}: {record['reason']}")
    return 1 if counts["failed"] or counts["timeout"] else 0


if __name__ == "__main__":
    sys.exit(main())
