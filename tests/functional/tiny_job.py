"""Running the tiny recipe as a subprocess, for the functional tests (import: `tiny_job`).

The command is `dapo-train` through the test's own Python (so the checkout's package is
used), with Ray's token auth off (no cluster credentials on a test machine).
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

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"


def train_command(run_dir: Path, model_dir: Path, *overrides: str) -> list[str]:
    """dapo-train on the tiny recipe writing to run_dir, the model created in model_dir."""
    return [
        sys.executable,
        "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config",
        str(TINY),
        f"run.output_dir={run_dir}",
        f"policy.model_name_or_path={model_dir}",
        *overrides,
    ]


def job_env() -> dict[str, str]:
    return dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_and_wait_for(cmd: list[str], path: Path, *, capture: bool) -> subprocess.Popen:
    """Start cmd in its own session and return once `path` exists (or the job ended)."""
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    proc = subprocess.Popen(
        cmd,
        env=job_env(),
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT if capture else subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        # A shell that starts the test run in the background (`cmd &`) ignores SIGINT, and
        # Python keeps an inherited SIG_IGN: the run would then never see a test's Ctrl-C.
        # Ctrl-C at a terminal reaches a run with the default disposition; so does this one.
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 600
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def actor_pids(actor_class: str, driver: int) -> list[int]:
    """Pids of the live Ray actor processes of a class (their title is ray::<class>...)
    started by the run whose driver is ``driver``: a run another test left behind must
    never be the one a test kills."""
    pids = []
    for p in psutil.Process(driver).children(recursive=True):
        try:
            if f"ray::{actor_class}" in " ".join(p.cmdline()):
                pids.append(p.pid)
        except psutil.Error:  # exited meanwhile
            continue
    return pids


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}
