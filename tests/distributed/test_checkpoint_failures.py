"""Megatron dist checkpoints of the policy (dapo_megatron/megatron/checkpoint.py), on gloo:
what a failure leaves behind. Resume and resharding: test_checkpoint.py.

* crash safety: a rank SIGKILLed in the middle of writing a checkpoint leaves the previous
  one as ``latest_checkpoint``, loadable (there: DistributedOptimizer state saved at DP2
  into DP1); ``prune_checkpoints`` keeps the newest K and removes the leftovers;
* verified checkpoints: the marker lists every file's size and SHA-256 (hashed by both
  ranks), and the checkpoint verifies;
* a full disk (a real tiny tmpfs when this runs as root, else ENOSPC injected into the
  shard writers) makes the save raise one line, ``saving checkpoint to <path> failed:
  [Errno 28] No space left on device``, and leaves no ``.tmp`` directory.

Megatron is imported inside the rank functions only (the pytest process never needs it).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from checkpoint_ranks import (
    RankPolicy,
    TinyModel,
    init_ranks,
    layout,
    make_tiny_model,
)
from launch import run_distributed

from dapo_megatron.storage.checkpoint_dirs import (
    checkpoint_files,
    latest_checkpoint,
    prune_checkpoints,
    publish,
    read_marker,
    temporary_sibling,
    verify_checkpoint,
)

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return make_tiny_model(tmp_path_factory.mktemp("hf"))


# ------------------------------------------------------------------- crash safety


def _crash_worker(tiny: TinyModel, root: str) -> None:
    """DP2, distributed optimizer: save step 1; then rank 1 is SIGKILLed after writing its
    step-2 shards, before the checkpoint's metadata, marker and rename."""
    from megatron.core.dist_checkpointing.strategies.torch import (
        TorchDistSaveShardedStrategy,
    )

    from dapo_megatron.megatron.checkpoint import save_checkpoint

    dims = layout(dp=2)
    init_ranks(dims)
    policy = RankPolicy(tiny, dims, distributed_optimizer=True)
    policy.train_step(1)
    save_checkpoint(
        root,
        model=policy.model,
        optimizer=policy.optimizer,
        scheduler=policy.scheduler,
        extra_state={"step": 1},
        step=1,
    )
    policy.train_step(2)
    original = TorchDistSaveShardedStrategy.save

    def save_then_die(self: object, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        if torch.distributed.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    TorchDistSaveShardedStrategy.save = save_then_die
    save_checkpoint(
        root,
        model=policy.model,
        optimizer=policy.optimizer,
        scheduler=policy.scheduler,
        extra_state={"step": 2},
        step=2,
    )


def _load_after_crash_worker(tiny: TinyModel, root: str) -> dict:
    from dapo_megatron.megatron.checkpoint import load_checkpoint
    from dapo_megatron.megatron.distributed import destroy_parallel

    init_ranks(layout())
    # Saved at DP2: the distributed optimizer's state reshards over DP.
    policy = RankPolicy(tiny, layout(), distributed_optimizer=True)
    path = latest_checkpoint(root)
    extra = load_checkpoint(
        path, model=policy.model, optimizer=policy.optimizer, scheduler=policy.scheduler
    )
    adam = policy.optimizer.chained_optimizers[0].optimizer
    steps = sorted({float(state["step"]) for state in adam.state.values()})
    destroy_parallel()
    return {"path": str(path), "extra": extra, "adam_steps": steps}


def test_kill_during_save_keeps_previous_checkpoint(tiny: TinyModel, tmp_path: Path) -> None:
    root = tmp_path / "run"
    with pytest.raises(Exception, match="(?i)signal|exit|SIGKILL|terminated"):
        run_distributed(_crash_worker, 2, tiny, str(root), timeout=120)
    leftovers = sorted(p.name for p in root.iterdir())
    assert leftovers[0] == "step_000001" and leftovers[1].startswith("step_000002.tmp-")
    assert len(leftovers) == 2, leftovers
    partial = root / leftovers[1]
    assert any(partial.iterdir()) and not (partial / "complete.json").exists()
    # A step directory without marker (e.g. a copy interrupted by hand) is not a checkpoint.
    (root / "step_000003").mkdir()
    (root / "step_000003" / "common.pt").write_bytes(b"partial")
    assert latest_checkpoint(root) == root / "step_000001"
    # Saved by two ranks, each hashing a share of the files: the marker lists them all.
    marker = read_marker(root / "step_000001")
    assert sorted(marker["files"]) == checkpoint_files(root / "step_000001")
    assert any(name.endswith(".distcp") for name in marker["files"])
    assert verify_checkpoint(root / "step_000001") is None

    result = run_distributed(_load_after_crash_worker, 1, tiny, str(root))[0]
    assert result == {"path": str(root / "step_000001"), "extra": {"step": 1}, "adam_steps": [1.0]}

    deleted = prune_checkpoints(root, keep_last=1)
    assert sorted(p.name for p in deleted) == sorted([leftovers[1], "step_000003"])
    assert [p.name for p in root.iterdir()] == ["step_000001"]


def _fake_checkpoint(root: Path, step: int) -> Path:
    path = root / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "complete.json").write_text(json.dumps({"step": step}))
    return path


def test_latest_and_prune_keep_the_newest_complete(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    for step in (5, 10, 100, 1_000_000):  # numeric order, not name order beyond 6 digits
        _fake_checkpoint(tmp_path, step)
    (tmp_path / "step_000200.tmp-0badc0de").mkdir()
    (tmp_path / "step_000300").mkdir()  # no marker
    (tmp_path / "notes").mkdir()  # not ours: never touched
    assert latest_checkpoint(tmp_path) == tmp_path / "step_1000000"
    prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step_000100", "step_1000000"]
    with pytest.raises(ValueError, match="keep_last"):
        prune_checkpoints(tmp_path, keep_last=0)


def test_publish_replaces_a_checkpoint_of_the_same_step(tmp_path: Path) -> None:
    old = _fake_checkpoint(tmp_path, 7)
    new = temporary_sibling(old)
    new.mkdir()
    (new / "complete.json").write_text(json.dumps({"step": 7, "new": True}))
    assert latest_checkpoint(tmp_path) == old  # the .tmp- one is not a checkpoint yet
    publish(new, old)
    assert [p.name for p in tmp_path.iterdir()] == ["step_000007"]
    assert read_marker(old) == {"step": 7, "new": True}


# ------------------------------------------------------------------------ full disk

ENOSPC_LINE = "failed: [Errno 28] No space left on device"


class _FullDiskFile(io.FileIO):
    """A file on a disk with no space left: every write fails as the OS would fail it."""

    def write(self, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)


def _full_disk_worker(tiny: TinyModel, root: str, inject: bool) -> dict:
    """One rank saves into ``root``, on a full file system (or one faked full)."""
    from dapo_megatron.megatron.checkpoint import save_checkpoint
    from dapo_megatron.megatron.distributed import destroy_parallel
    from dapo_megatron.storage.checkpoint_dirs import CheckpointSaveError

    init_ranks(layout())
    policy = RankPolicy(tiny, layout(), distributed_optimizer=False)
    if inject:
        # The shard writers (forked from this process) open their files with the module's
        # `open`: shadow the builtin there.
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        filesystem_async.open = _FullDiskFile
    try:
        save_checkpoint(
            root,
            model=policy.model,
            optimizer=policy.optimizer,
            scheduler=policy.scheduler,
            extra_state={"step": 1},
            step=1,
        )
    except CheckpointSaveError as e:
        error = e
    else:
        raise AssertionError("the save into a full file system succeeded")
    destroy_parallel()
    return {"message": str(error), "errno": error.errno, "left": sorted(os.listdir(root))}


@contextlib.contextmanager
def _tiny_tmpfs(mount_point: Path, size: str) -> Iterator[bool]:
    """A tmpfs of ``size`` at ``mount_point`` if this process may mount one (root)."""
    mount_point.mkdir()
    if os.geteuid() != 0:
        yield False
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    try:
        yield mounted.returncode == 0
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(mount_point)], check=True)


# 256k: common.pt and metadata.json fit, the ~2 MB of shards do not (the forked writers get
# ENOSPC). "full": the disk is full before the save, so its first file, common.pt, fails:
# torch.save reports that as a RuntimeError without errno, which the saver tells apart
# from a bug by a write of its own.
@pytest.mark.parametrize("disk", ["256k", "full"])
def test_full_disk_is_a_one_line_error_without_leftovers(
    tiny: TinyModel, tmp_path: Path, disk: str
) -> None:
    with _tiny_tmpfs(tmp_path / "disk", "256k" if disk == "256k" else "4k") as real:
        if not real and disk == "full":
            pytest.skip("mounting a tmpfs needs root; the injected case covers the shards")
        if disk == "full":
            (tmp_path / "disk" / "filler").write_bytes(bytes(4096))
        root = tmp_path / "disk" / "checkpoints"
        result = run_distributed(_full_disk_worker, 1, tiny, str(root), not real, timeout=120)[0]
    assert result == {
        "message": f"saving checkpoint to {root / 'step_000001'} {ENOSPC_LINE}",
        "errno": errno.ENOSPC,
        "left": [],  # the failed save's .tmp directory is gone
    }
