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

REPO = Path(__file__).resolve().parents[3]

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


# ---------------------------------------------------------------------------------------
# Issue 30 cases 2 and 3: the lock covers every directory a run writes, and a used run
# directory with nothing to resume from is refused.
#
# Case 2 runs a REAL second process that holds its run's locks with a save in progress in a
# checkpoint directory another run then names; case 3 leaves a finished run's real outputs
# (metrics.jsonl rows, an hf/ export) in a directory a second run is pointed at.

# Locks a run directory and its checkpoint directory as dapo-train does, starts a save
# (its .tmp- directory), says "saving", then holds the locks until its stdin closes.
_SAVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from dapo_megatron.storage.run_dir import acquire_run_dir

    run_dir, checkpoints = Path(sys.argv[1]), Path(sys.argv[2])
    lock = acquire_run_dir(run_dir, resume="auto", checkpoint_dir=checkpoints)
    (checkpoints / "step_000015.tmp-0123abcd").mkdir()
    (checkpoints / "step_000015.tmp-0123abcd" / "__0_0.distcp").write_bytes(b"shard")
    print("saving", flush=True)
    sys.stdin.read()
    """
)


def test_a_second_run_sharing_the_checkpoint_dir_is_refused_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared-checkpoints"
    first = subprocess.Popen(
        [sys.executable, "-c", _SAVER, str(tmp_path / "run-a"), str(shared)],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert first.stdout is not None and first.stdout.readline() == "saving\n"
        with pytest.raises(ConfigError) as caught:
            acquire_run_dir(tmp_path / "run-b", resume="auto", checkpoint_dir=shared)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(
            f"checkpointing.checkpoint_dir = {shared} is in use by another dapo-train "
            f"(pid {first.pid}, host "
        )
        assert f"run.output_dir = {tmp_path / 'run-a'}): two runs must not share it" in message
        assert "set checkpointing.checkpoint_dir to a directory of this run's own" in message
        # The live run's save in progress is still there, and run-b's lock was let go.
        assert (shared / "step_000015.tmp-0123abcd" / "__0_0.distcp").read_bytes() == b"shard"
        with acquire_run_dir(tmp_path / "run-b", resume="auto"):
            pass
    finally:
        first.communicate(input="", timeout=30)
    # Once the first run has ended, the directory is free again.
    with acquire_run_dir(tmp_path / "run-b", resume="auto", checkpoint_dir=shared) as lock:
        assert lock.paths == [tmp_path / "run-b" / LOCK_FILE, shared / LOCK_FILE]


def test_the_default_checkpoint_dir_of_a_live_run_is_locked_too(tmp_path: Path) -> None:
    # run-b names run-a's own (default) checkpoint directory: run-a's run-dir lock alone
    # would not see it.
    with (
        acquire_run_dir(tmp_path / "run-a", resume="auto"),
        pytest.raises(ConfigError, match="checkpointing.checkpoint_dir = .* is in use"),
    ):
        acquire_run_dir(
            tmp_path / "run-b", resume="auto", checkpoint_dir=tmp_path / "run-a/checkpoints"
        )


def test_the_export_dir_is_locked(tmp_path: Path) -> None:
    with acquire_run_dir(tmp_path / "run", resume="auto", export_dir=tmp_path / "run/hf") as lock:
        assert tmp_path / "run/hf" / LOCK_FILE in lock.paths
        with pytest.raises(ConfigError, match=r"checkpoint_dir = .*/run/hf is in use"):
            acquire_run_dir(
                tmp_path / "other",
                resume="auto",
                checkpoint_dir=tmp_path / "run/hf",  # absurd, but it must not be shared
            )


def _finished_run_without_checkpoints(run_dir: Path) -> None:
    """What a run with checkpointing.enabled=false leaves: metrics rows and its export."""
    (run_dir / "hf" / "step_000003").mkdir(parents=True)
    (run_dir / "hf" / "step_000003" / "model.safetensors").write_bytes(b"first run")
    (run_dir / "config.yaml").write_text("run: {}\n")
    (run_dir / "metrics.jsonl").write_text('{"step":1}\n{"step":2}\n{"step":3}\n')


def test_a_used_run_dir_without_a_checkpoint_is_refused_and_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _finished_run_without_checkpoints(run_dir)
    with pytest.raises(ConfigError) as caught:
        acquire_run_dir(run_dir, resume="auto", export_dir=run_dir / "hf")
    assert str(caught.value) == (
        f"run.output_dir = {run_dir} already holds a run (metrics.jsonl, hf/) but "
        f"{run_dir / 'checkpoints'} has no checkpoint to continue it from, so starting here "
        f"would overwrite it: set run.output_dir to a new directory, or delete {run_dir} to "
        f"start afresh"
    )
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 3
    assert (run_dir / "hf/step_000003/model.safetensors").read_bytes() == b"first run"


def test_a_start_that_wrote_nothing_does_not_make_the_dir_used(tmp_path: Path) -> None:
    # A refused or failed start leaves config.yaml, lock files and empty directories only.
    run_dir = tmp_path / "run"
    with acquire_run_dir(run_dir, resume="auto", export_dir=run_dir / "hf"):
        (run_dir / "config.yaml").write_text("run: {}\n")
        (run_dir / "metrics.jsonl").write_text("")
    with acquire_run_dir(run_dir, resume="auto", export_dir=run_dir / "hf"):
        pass
    with pytest.raises(ConfigError, match="already holds a run .config.yaml"):
        acquire_run_dir(run_dir, resume="never")
