"""Issue 30 cases 2 and 3: the lock covers every directory a run writes, and a used run
directory with nothing to resume from is refused (dapo_megatron/storage/run_dir.py).

Case 2 runs a REAL second process that holds its run's locks with a save in progress in a
checkpoint directory another run then names; case 3 leaves a finished run's real outputs
(metrics.jsonl rows, an hf/ export) in a directory a second run is pointed at.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.storage.run_dir import LOCK_FILE, acquire_run_dir

REPO = Path(__file__).resolve().parents[2]

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
