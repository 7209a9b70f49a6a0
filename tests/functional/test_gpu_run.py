"""scripts/gpu_run.sh on a CPU (CI): the one-GPU end-to-end run with the tiny tiny-qwen3.

The same command that gives the GPU figures (bench/gpu_run.py) runs here with the CPU
defaults: dapo-train for three steps (two timed), the resume from step 1 that must match
steps 2 and 3 bit-exactly,
dapo-export loaded back by transformers, the transformers generate baseline. The JSON has
exactly the per-model keys of bench/gpu_run_figures.MODEL_KEYS. A second run is stopped by a
SIGTERM in its resume phase (as a device call's end would stop it): the timed figures stay
in the JSON, the resume's child is ended and the exit status is 0. (The hard stop's own
path, a child's timeout, is tested without a training run: tests/unit/bench.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gpu_run_figures as figures  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    env.pop("GPU_RUN_STARTED", None)  # the hard stop counts from this script's start
    return env


def test_gpu_run_script_on_cpu(tmp_path):
    out = tmp_path / "gpu_run.json"
    env = _env()
    proc = subprocess.run(
        [
            "bash",
            str(REPO / "scripts/gpu_run.sh"),
            "--out",
            str(out),
            "--steps",
            "3",
            "--work-dir",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["spec"] == "local spec, no Transformer Engine"
    assert result["mfu_peak"] is None and result["mfu_note"]
    assert list(result["models"]) == ["tiny-qwen3"]
    entry = result["models"]["tiny-qwen3"]
    assert list(entry) == list(figures.MODEL_KEYS)
    assert entry["model"] == "tiny-qwen3" and entry["params"] > 0
    assert entry["resume_bit_exact"] is True, result["details"]
    assert entry["export_ok"] is True, result["details"]
    for key in (
        "step_s",
        "generation_s",
        "logprob_s",
        "train_s",
        "generated_tokens_per_s",
        "train_tokens_per_s",
        "hf_generate_tokens_per_s",
    ):
        assert entry[key] > 0, (key, entry[key])
    assert entry["train_mfu"] is None and entry["logprob_mfu"] is None  # no CPU peak
    assert entry["peak_gib_measured"] is None  # no CUDA allocator
    planned = entry["peak_gib_planned"]
    assert planned["train"] > 0 and planned["logprob"] > 0, planned
    assert entry["phases_done"] == ["checkpoint", "timed", "resume", "export", "hf_generate"]
    assert entry["partial"] is False and result["status"] == "done"
    assert result["kernel_check"].startswith("skipped: no CUDA device")
    assert "tiny-qwen3" in proc.stdout and "resume_bit_exact" in proc.stdout  # the table
    logs = (tmp_path / "gpu_run_logs.txt").read_text()  # beside the JSON
    for name in ("timed.log", "resume2.log", "export.log", "logs/workers/policy_rank0.log"):
        assert "===== tiny-qwen3/" in logs and name in logs, name


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s"
        time.sleep(0.2)


def _timed_done(out: Path) -> bool:
    try:
        entry = json.loads(out.read_text())["models"].get("tiny-qwen3")
    except (OSError, ValueError):  # not yet written
        return False
    return entry is not None and "timed" in entry["phases_done"]


def test_gpu_run_stopped_in_a_phase_keeps_the_earlier_figures(tmp_path):
    out, work = tmp_path / "gpu_run.json", tmp_path / "work"
    with (tmp_path / "stdout.txt").open("w") as stdout:
        proc = subprocess.Popen(
            ["bash", str(REPO / "scripts/gpu_run.sh"), "--out", str(out), "--work-dir", str(work)],
            cwd=REPO,
            env=_env(),
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for(out.exists, 120, proc, "JSON at the start")
        assert json.loads(out.read_text())["status"] == "running"
        _wait_for(lambda: _timed_done(out), 400, proc, "timed figures")
        resume_log = work / "tiny-qwen3" / "resume1.log"
        _wait_for(resume_log.exists, 60, proc, "resume phase")
        time.sleep(2.0)  # its dapo-train is starting: the stop lands inside the phase
        (runner,) = [
            p for p in psutil.Process(proc.pid).children() if "gpu_run.py" in " ".join(p.cmdline())
        ]
        runner.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, (tmp_path / "stdout.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    result = json.loads(out.read_text())
    assert result["status"] == "stopped: SIGTERM"
    entry = result["models"]["tiny-qwen3"]
    assert entry["phases_done"] == ["checkpoint", "timed"] and entry["partial"] is True
    assert entry["step_s"] > 0 and entry["train_tokens_per_s"] > 0  # the timed run's figures
    assert entry["resume_bit_exact"] is None and entry["export_ok"] is None
    assert result["details"]["tiny-qwen3"]["errors"] == {"resume": "SIGTERM"}
    time.sleep(1.0)
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if str(work) in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert left == [], "the resume's processes outlived the stop"
    logs = (tmp_path / "gpu_run_logs.txt").read_text()
    assert "===== error: tiny-qwen3 resume" in logs and "tiny-qwen3/timed.log" in logs
