"""The run-directory lock (dapo_megatron/storage/run_dir.py) between REAL processes: a second live
process is refused with one line naming the holder; the lock of a SIGKILLed process is taken
over and reported; ``checkpointing.resume=never`` refuses a directory that holds a run;
interrupted saves are removed once the lock is held.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.storage.run_dir import LOCK_FILE, acquire_run_dir

REPO = Path(__file__).resolve().parents[2]

# Acquires the lock the way the CLI does (ConfigError -> "error: ..." on stderr, exit 2),
# says "locked", then holds it until killed or its stdin closes.
_HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from dapo_megatron.config.errors import ConfigError
    from dapo_megatron.storage.run_dir import acquire_run_dir

    try:
        lock = acquire_run_dir(Path(sys.argv[1]), resume="auto")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print("locked", flush=True)
    sys.stdin.read()
    """
)


def _start(run_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(run_dir)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _holding(run_dir: Path) -> subprocess.Popen[str]:
    """A live process that holds the lock of ``run_dir``."""
    proc = _start(run_dir)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == "locked\n", proc.communicate(timeout=30)
    return proc


def test_a_second_live_process_gets_a_one_line_error(tmp_path: Path) -> None:
    with acquire_run_dir(tmp_path, resume="auto"):
        out, err = _start(tmp_path).communicate(timeout=60)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"error: run.output_dir = {tmp_path} is in use by another dapo-train "
        f"(pid {os.getpid()}, host {socket.gethostname()}, started 20"
    )
    assert lines[0].endswith("): wait for it to finish, or set run.output_dir to another directory")


def test_lock_of_a_killed_process_is_taken_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = _holding(tmp_path)
    try:
        with pytest.raises(
            ConfigError, match=f"in use by another dapo-train \\(pid {holder.pid}, "
        ):
            acquire_run_dir(tmp_path, resume="auto")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)
    lock = acquire_run_dir(tmp_path, resume="auto")
    try:
        assert lock.previous is not None and lock.previous["pid"] == holder.pid
        out = capsys.readouterr().out
        assert out == (
            f"[run-dir] previous run (pid {holder.pid}, host {socket.gethostname()}, started "
            f"{lock.previous['started']}) ended without releasing its lock on {tmp_path}; "
            f"taking it over\n"
        )
    finally:
        lock.release()


def test_a_clean_release_is_not_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = _holding(tmp_path)
    holder.communicate(input="", timeout=30)  # stdin closed: exits normally (atexit release)
    assert holder.returncode == 0
    assert (tmp_path / LOCK_FILE).read_text() == ""
    with acquire_run_dir(tmp_path, resume="auto") as lock:
        assert lock.previous is None and lock.held
    assert not lock.held
    assert capsys.readouterr().out == ""


def test_resume_never_refuses_a_directory_that_holds_a_run(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError) as caught:
        acquire_run_dir(tmp_path, resume="never")
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"checkpointing.resume = never, but run.output_dir = {tmp_path} already holds a run "
        f"(checkpoints/, metrics.jsonl): set run.output_dir to a new directory, or "
        f"checkpointing.resume=auto to continue that run"
    )
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched
    (tmp_path / "checkpoints" / "step_000001").mkdir()  # auto needs one to continue from
    (tmp_path / "checkpoints" / "step_000001" / "complete.json").write_text("{}")
    with acquire_run_dir(tmp_path, resume="auto"):  # the refusal released the lock
        pass


def test_resume_never_checks_a_checkpoint_dir_outside_the_run_dir(tmp_path: Path) -> None:
    elsewhere = tmp_path / "ckpt"
    (elsewhere / "step_000002").mkdir(parents=True)
    with pytest.raises(
        ConfigError, match="checkpointing.resume = never, but checkpointing.checkpoint_dir"
    ):
        acquire_run_dir(tmp_path / "run", resume="never", checkpoint_dir=elsewhere)


@pytest.mark.parametrize("resume", ["auto", "never"])
def test_an_empty_or_absent_directory_is_fine(tmp_path: Path, resume: str) -> None:
    (tmp_path / "empty").mkdir()
    for run_dir in (tmp_path / "empty", tmp_path / "absent" / "run"):
        with acquire_run_dir(run_dir, resume=resume) as lock:  # type: ignore[arg-type]
            assert lock.held and (run_dir / LOCK_FILE).exists()
        # Its own lock file does not make a directory used.
        acquire_run_dir(run_dir, resume="never").release()


def test_interrupted_saves_are_removed_once_the_lock_is_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = tmp_path / "checkpoints"
    leftover = checkpoints / "step_000004.tmp-0badc0de"
    leftover.mkdir(parents=True)
    (leftover / "__0_0.distcp").write_bytes(b"partial")
    (checkpoints / "step_000002").mkdir()
    (tmp_path / "metrics.jsonl").write_text("")
    with acquire_run_dir(tmp_path, resume="auto") as lock:
        assert lock.removed == [leftover]
    assert sorted(p.name for p in checkpoints.iterdir()) == [LOCK_FILE, "step_000002"]
    assert capsys.readouterr().out == (
        f"[run-dir] removed {leftover} (left by a save that failed or was killed)\n"
    )
