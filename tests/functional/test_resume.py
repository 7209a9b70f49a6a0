"""A run killed with SIGKILL and resumed reaches the same metrics as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
COMMON = [
    "dapo.max_num_steps=4",
    "sft_warmup.num_steps=30",
    "checkpointing.save_period=2",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "logger.progress_bar=false",
    "logger.plots=false",
]
# Compared exactly: everything computed from the rollouts and the update, not wall time.
KEYS = (
    "loss",
    "grad_norm",
    "reward/acc",
    "reward/shaped_mean",
    "policy/entropy",
    "dynamic_sampling/keep_rate",
    "dynamic_sampling/num_gen_batches",
    "response_length/mean",
    "clipfrac/upper",
)


def _command(run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config",
        str(REPO / "recipes" / "dapo-tiny-cpu.yaml"),
        f"run.output_dir={run_dir}",
        f"policy.model_name_or_path={run_dir.parent / 'model'}",
        *COMMON,
    ]


def _env() -> dict[str, str]:
    return dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


def _metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    straight = tmp_path / "straight"
    out = subprocess.run(
        _command(straight), env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _command(killed),
        env=_env(),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    marker = killed / "checkpoints" / "step_000002" / "complete.json"
    deadline = time.monotonic() + 600
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the run never wrote its step-2 checkpoint"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Ray workers, mid-run
    proc.wait()
    assert not (killed / "checkpoints" / "step_000004").exists(), "killed too late"
    out = subprocess.run(
        _command(killed), env=_env(), cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[resume]" in out.stdout

    want, got = _metrics(straight), _metrics(killed)
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]  # no duplicated or lost step
    for step in (3, 4):
        for key in KEYS:
            assert got[step][key] == want[step][key], (step, key, got[step][key], want[step][key])


def _policy_worker_pids() -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "ray::PolicyWorker" in line]


def test_worker_death_restarts_from_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [*_command(run_dir), "dapo.max_num_steps=6"]
    proc = subprocess.Popen(
        cmd,
        env=_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    marker = run_dir / "checkpoints" / "step_000002" / "complete.json"
    deadline = time.monotonic() + 600
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = _policy_worker_pids()
    assert marker.exists() and pids, "no checkpoint or no worker to kill"
    os.kill(pids[-1], signal.SIGKILL)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    assert "[restart 1/2] policy rank" in output and "died" in output
    assert "[resume]" in output and "step_000002" in output
    assert sorted(_metrics(run_dir)) == [1, 2, 3, 4, 5, 6]
