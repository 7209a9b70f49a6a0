"""A content fingerprint of the training data, stored in every checkpoint.

A resume must train on the data the checkpoint was trained on: the sampler's state (epoch,
position, seed) indexes into the prompts, so a file whose rows changed (even with the
same row count) would silently continue on other prompts. The controller's checkpoint
state records ``data_fingerprint`` of ``data.train_path`` (controller/loop.py ``_save``),
and the pre-flight check (planning/resume_check.py) compares it with the file on disk
before anything starts.

The fingerprint is the SHA-256 of the file's bytes, read in 1 MiB chunks (constant memory;
~1 s per GB), computed once per process: the pre-flight check and every save of one run
share it (a file changed while the run trains is not what it loaded at the start).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from dapo_megatron.config.schema_data import DataConfig

DATA_STATE_KEY = "data"
"""Key of the fingerprint in the controller's checkpoint state (controller/loop.py)."""
_CHUNK = 1 << 20
_CACHE: dict[Path, dict[str, Any]] = {}
"""Fingerprints computed by this process, by resolved path."""


def file_fingerprint(path: str | Path) -> dict[str, Any]:
    """``{"path", "bytes", "sha256"}`` of one file, streamed; cached for the process."""
    resolved = Path(path).resolve()
    if resolved not in _CACHE:
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        with open(resolved, "rb", buffering=0) as f:
            while count := f.readinto(buffer):
                digest.update(view[:count])
                size += count
        _CACHE[resolved] = {"path": str(path), "bytes": size, "sha256": digest.hexdigest()}
    return dict(_CACHE[resolved])


def data_fingerprint(data: DataConfig) -> dict[str, Any] | None:
    """The fingerprint of the run's training prompts: ``data.train_path``'s; None for the
    generated tasks, arithmetic and remainder (their prompts follow from the config and
    the seed)."""
    if data.format in ("arithmetic", "remainder") or data.train_path is None:
        return None
    return file_fingerprint(data.train_path)


def same_data(recorded: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether two fingerprints describe the same content (the path may differ: a copy of
    the file elsewhere is the same data)."""
    return bool(recorded.get("sha256") == now["sha256"] and recorded.get("bytes") == now["bytes"])
