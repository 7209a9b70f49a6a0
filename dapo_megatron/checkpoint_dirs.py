"""Names, completion markers, discovery and pruning of checkpoint directories.

The file-system side of ``megatron/checkpoint.py``, kept free of torch and Megatron imports so that
the controller (which never imports Megatron) can find the checkpoint to resume from and
prune old ones. A run's checkpoint root holds:

* ``step_<step:06d>/``: a complete checkpoint, with the ``complete.json`` marker;
* ``step_<step:06d>.tmp-<hex>/``: a save in progress, or the leftover of an interrupted one;
* possibly a ``step_...`` directory without marker (a partial copy): never a checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

MARKER = "complete.json"
"""Written last into a checkpoint: a step directory without it is not a checkpoint."""

_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_DIR = re.compile(r"^step_\d+\.tmp-[0-9a-f]+$")


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint of optimizer step ``step``."""
    if step < 0:
        raise ValueError(f"step = {step}: must be >= 0")
    return f"step_{step:06d}"


def temporary_sibling(final: Path) -> Path:
    """A fresh ``<final>.tmp-<hex>`` path next to ``final`` (what ``prune`` treats as stale)."""
    return final.with_name(f"{final.name}.tmp-{secrets.token_hex(4)}")


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (it must survive a crash right after)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def publish(tmp: Path, final: Path) -> None:
    """Give the finished checkpoint ``tmp`` its name ``final`` atomically (one process).

    An existing ``final`` (the same step saved again) is replaced: moved aside under a
    ``.tmp-`` name first, because rename() cannot replace a non-empty directory. A kill
    between the two renames leaves both under ``.tmp-`` names: the previous step's
    checkpoint is then the latest, never a mix of the two.
    """
    stale = None
    if final.exists():
        stale = temporary_sibling(final)
        final.rename(stale)
    tmp.rename(final)
    # The renames live in the parent directory's entries: make them durable too.
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)


def read_marker(path: str | Path) -> dict[str, Any] | None:
    """The metadata of a complete checkpoint directory, or None if it is not one."""
    try:
        return json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def complete_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete checkpoint under ``directory``, oldest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and read_marker(child) is not None:
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The complete checkpoint of the highest step under ``directory``, or None.

    Ignores ``.tmp-`` directories (interrupted saves) and step directories without the
    ``complete.json`` marker. Reads only the file system: call it anywhere.
    """
    complete = complete_checkpoints(directory)
    return complete[-1][1] if complete else None


def prune_checkpoints(directory: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints, and every leftover of
    an interrupted save (``.tmp-`` directories, step directories without marker).

    Call it from one process (rank 0 or the controller), and not while a save is in
    progress: its ``.tmp-`` directory would be deleted. Entries that are not named like
    checkpoints are never touched. Returns the deleted paths.

    Raises:
        ValueError: ``keep_last < 1``.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last = {keep_last}: must be >= 1 (the checkpoint to resume)")
    root = Path(directory)
    if not root.is_dir():
        return []
    keep = {path for _, path in complete_checkpoints(root)[-keep_last:]}
    deleted = []
    for child in sorted(root.iterdir()):
        ours = _STEP_DIR.match(child.name) or _TMP_DIR.match(child.name)
        if ours and child.is_dir() and child not in keep:
            # Renamed first (atomic): a prune killed mid-delete must not leave a half-deleted
            # directory that still carries its marker.
            doomed = child if _TMP_DIR.match(child.name) else temporary_sibling(child)
            if doomed != child:
                child.rename(doomed)
            shutil.rmtree(doomed)
            deleted.append(child)
    return deleted
