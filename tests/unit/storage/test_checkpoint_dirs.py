"""Verified checkpoints (dapo_megatron/storage/checkpoint_dirs.py), on real files: the marker lists
every file's size and SHA-256; ``find_resumable`` skips damaged checkpoints (a shard
truncated with os.truncate, a flipped byte, a missing file), saying which file and why,
falls back to the newest one that verifies, refuses to start afresh over checkpoints none
of which verifies, and accepts markers written before file lists (unverified, said so).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest

from dapo_megatron.storage.checkpoint_dirs import (
    MARKER,
    CheckpointError,
    CheckpointSaveError,
    NoVerifiedCheckpointError,
    find_resumable,
    latest_checkpoint,
    read_marker,
    remove_interrupted_saves,
    verify_checkpoint,
    write_marker,
)

SHARD = "model/__0_0.distcp"


def _checkpoint(root: Path, step: int, *, marker: bool = True) -> Path:
    """A checkpoint-like directory of real files (one over 1 MiB: several hash chunks)."""
    path = root / f"step_{step:06d}"
    (path / "model").mkdir(parents=True)
    (path / SHARD).write_bytes(os.urandom(2 * (1 << 20) + 123))
    (path / "model" / "__0_1.distcp").write_bytes(os.urandom(5000))
    (path / "common.pt").write_bytes(b"common" * 10)
    (path / "extra_state.pt").write_bytes(b"")
    if marker:
        write_marker(path, {"format_version": 1, "step": step})
    return path


def test_marker_records_size_and_sha256_of_every_file(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, 2)
    marker = read_marker(path)
    assert marker is not None and marker["step"] == 2 and marker["checksum"] == "sha256"
    names = ["common.pt", "extra_state.pt", SHARD, "model/__0_1.distcp"]
    assert sorted(marker["files"]) == sorted(names)
    for name in names:
        data = (path / name).read_bytes()
        assert marker["files"][name] == {
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    assert verify_checkpoint(path) is None


def test_truncated_shard_falls_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    good = _checkpoint(tmp_path, 2)
    bad = _checkpoint(tmp_path, 4)
    size = (bad / SHARD).stat().st_size
    os.truncate(bad / SHARD, 1234)
    path, lines = find_resumable(tmp_path)
    assert path == good
    assert lines == [f"[resume] skipping {bad}: {SHARD}: size 1234 != {size} recorded"]


def test_flipped_byte_of_the_same_size_is_a_checksum_mismatch(tmp_path: Path) -> None:
    good = _checkpoint(tmp_path, 2)
    bad = _checkpoint(tmp_path, 4)
    recorded = json.loads((bad / MARKER).read_text())["files"][SHARD]["sha256"]
    with open(bad / SHARD, "r+b") as f:
        f.seek(1 << 20)  # in the second 1 MiB chunk
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    actual = hashlib.sha256((bad / SHARD).read_bytes()).hexdigest()
    path, lines = find_resumable(tmp_path)
    assert path == good
    assert lines == [
        f"[resume] skipping {bad}: {SHARD}: sha256 {actual[:16]} != {recorded[:16]} recorded"
    ]


def test_missing_files_are_named_and_counted(tmp_path: Path) -> None:
    bad = _checkpoint(tmp_path, 4)
    (bad / "common.pt").unlink()
    (bad / "model" / "__0_1.distcp").unlink()
    assert verify_checkpoint(bad) == "common.pt: missing (and 1 more file)"


def test_no_checkpoint_that_verifies_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    for step in (2, 4):
        os.truncate(_checkpoint(tmp_path, step) / SHARD, 10)
    with pytest.raises(NoVerifiedCheckpointError) as caught:
        find_resumable(tmp_path)
    message = str(caught.value)
    assert isinstance(caught.value, CheckpointError) and "\n" not in message
    assert message.startswith(f"no checkpoint in {tmp_path} passes verification (step_000004: ")
    assert f"step_000002: {SHARD}: size 10 != " in message
    assert message.endswith("move or delete these checkpoints to start the run afresh")
    # Still there: nothing was deleted on the way.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002", "step_000004"]


def test_marker_without_file_list_is_accepted_unverified(tmp_path: Path) -> None:
    old = tmp_path / "step_000003"
    old.mkdir()
    (old / "common.pt").write_bytes(b"x")
    (old / MARKER).write_text(json.dumps({"format_version": 1, "step": 3}))
    path, lines = find_resumable(tmp_path)
    assert path == old
    assert lines == [
        f"[resume] {old}: {MARKER} lists no files (written by an older version): resuming "
        f"from it without verifying them"
    ]


def test_step_directories_without_marker_are_reported_not_fatal(tmp_path: Path) -> None:
    assert find_resumable(tmp_path / "absent") == (None, [])
    assert find_resumable(tmp_path) == (None, [])
    partial = _checkpoint(tmp_path, 6, marker=False)
    (tmp_path / "step_000001.tmp-0badc0de").mkdir()  # an interrupted save: not looked at
    skipped = (
        f"[resume] skipping {partial}: no {MARKER} (an unfinished save or copy, not a checkpoint)"
    )
    assert find_resumable(tmp_path) == (None, [skipped])
    good = _checkpoint(tmp_path, 4)
    (tmp_path / "step_000005").mkdir()
    (tmp_path / "step_000005" / MARKER).write_text("[1, 2]")  # JSON, but not a marker
    path, lines = find_resumable(tmp_path)
    assert path == good == latest_checkpoint(tmp_path)
    assert lines == [
        skipped,
        f"[resume] skipping {tmp_path / 'step_000005'}: {MARKER} is not a JSON object",
    ]


def test_remove_interrupted_saves_deletes_only_tmp_directories(tmp_path: Path) -> None:
    good = _checkpoint(tmp_path, 2)
    leftover = tmp_path / "step_000004.tmp-1a2b3c4d"
    (leftover / "model").mkdir(parents=True)
    (leftover / SHARD).write_bytes(b"partial")
    (tmp_path / "notes.tmp-abc").mkdir()  # not named like ours: kept
    assert remove_interrupted_saves(tmp_path) == [leftover]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.tmp-abc", good.name]
    assert remove_interrupted_saves(tmp_path / "absent") == []


def test_save_error_is_one_line_and_survives_pickling(tmp_path: Path) -> None:
    error = CheckpointSaveError.from_os_error(
        tmp_path / "step_000004", OSError(28, "No space left on device", "/x/__0_0.distcp")
    )
    expected = f"saving checkpoint to {tmp_path / 'step_000004'} failed: [Errno 28] No space left on device"
    assert str(error) == expected
    copy = pickle.loads(pickle.dumps(error))  # Ray sends it from the worker to the controller
    assert type(copy) is CheckpointSaveError and str(copy) == expected and copy.errno == 28
