"""Running the tiny recipe as a subprocess, for the functional tests (import: `tiny_job`).

The command is `dapo-train` through the test's own Python (so the checkout's package is
used), with Ray's token auth off (no cluster credentials on a test machine). Every wait on
a run is sized by its progress (tests/waits.py): a new output line or a file of its run
directory written resets an idle limit of IDLE_S, scaled by the machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import waits

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
# A run on a quiet 2-core machine prints a line or writes a file of its run directory every
# few seconds; its longest silences (Ray's start, a lost node's verdict from the GCS) last
# well under a minute. Scaled by waits.speed_factor() at each wait.
IDLE_S = 120.0


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


def run_dir_of(cmd: list[str]) -> Path | None:
    """The run.output_dir a dapo-train command names, if any."""
    found = [a.split("=", 1)[1] for a in cmd if a.startswith("run.output_dir=")]
    return Path(found[-1]) if found else None


def progress_of(cmd: list[str], *paths: Path) -> list[waits.Progress]:
    """A run's progress besides its output: the files of its run directory (and of paths)."""
    run_dir = run_dir_of(cmd)
    roots = [*([run_dir] if run_dir is not None else []), *paths]
    return [waits.files_progress(*roots)] if roots else []


def run_job(
    cmd: list[str], *, env: dict[str, str] | None = None, progress_paths: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run cmd to its end from the checkout (stdout and stderr apart), waited on by its
    progress: a run that goes quiet for the idle limit is killed with its session."""
    return waits.run(
        cmd, idle_s=IDLE_S, what="the run's exit", progress=progress_of(cmd, *progress_paths),
        cwd=REPO, env=job_env() if env is None else env,
    )  # fmt: skip


def finish(proc: subprocess.Popen, what: str = "the run's exit") -> str:
    """Wait for a started run to exit while it progresses; its whole output."""
    return waits.communicate(proc, what=what, idle_s=IDLE_S, progress=progress_of(proc.args))


def wait_line(proc: subprocess.Popen, prefix: str | tuple[str, ...]) -> str:
    """The first line of a started run's output that starts with prefix."""
    return waits.wait_line(
        proc, lambda x: x.startswith(prefix), what=f"a line {prefix!r}", idle_s=IDLE_S,
        progress=progress_of(proc.args),
    )  # fmt: skip


def start_and_wait_for(
    cmd: list[str], path: Path, *, capture: bool, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start cmd in its own session and return once `path` exists (or the job ended). Its
    output, when captured, is read from the start (waits.output_of): finish() returns it."""
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    proc = subprocess.Popen(
        cmd,
        env=job_env() if env is None else env,
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
    output = waits.output_of(proc)  # read from the start: the pipe must never fill
    try:
        waits.wait_until(
            lambda: path.exists() or proc.poll() is not None, what=f"{path}", idle_s=IDLE_S,
            progress=[lambda: len(output.lines) if output else 0, *progress_of(cmd)],
            details=lambda: output.tail() if output else "(output not captured)",
        )  # fmt: skip
    except BaseException:  # idle, or the test interrupted: never leave the run behind
        waits.kill_group(proc)
        raise
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
