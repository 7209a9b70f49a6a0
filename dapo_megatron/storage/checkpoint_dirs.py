"""Names, completion markers, discovery and pruning of checkpoint directories.

The file-system side of ``megatron/checkpoint.py``, kept free of torch and Megatron imports so that
the controller (which never imports Megatron) can find the checkpoint to resume from and
prune old ones. A run's checkpoint root holds:

* ``step_<step:06d>/``: a complete checkpoint, with the ``complete.json`` marker;
* ``step_<step:06d>.tmp-<hex>/``: a save in progress, or the leftover of an interrupted one;
* possibly a ``step_...`` directory without marker (a partial copy): never a checkpoint.

The marker lists every other file of the checkpoint with its size and SHA-256, so that a
resume can tell a damaged checkpoint (a truncated or corrupted shard, a missing file) from a
good one: ``find_resumable`` returns the newest checkpoint whose files match its marker,
with one line per newer checkpoint it skipped and why. Markers written before file lists
existed are accepted without verification.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MARKER = "complete.json"
"""Written last into a checkpoint: a step directory without it is not a checkpoint."""

_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_DIR = re.compile(r"^step_\d+\.tmp-[0-9a-f]+$")

CHECKSUM = "sha256"
"""The hashlib algorithm of the marker's file checksums (recorded in the marker)."""
_CHUNK = 1 << 20
"""Files are hashed in 1 MiB reads: constant memory whatever the shard size."""
_HASH_THREADS = 8
"""hashlib and file reads release the GIL: a few threads overlap I/O and hashing."""


class CheckpointError(RuntimeError):
    """A checkpoint problem the user must act on; the message is one line that says which
    path and why (the CLI prints it as ``error: ...`` without a traceback)."""


class CheckpointSaveError(CheckpointError):
    """Writing a checkpoint failed for an OS reason (disk full, quota, permissions, I/O).

    ``path`` is the checkpoint being saved; ``errno``/``strerror`` the OS error found in the
    failure (on any rank). The save's ``.tmp-`` directory has been removed.
    """

    def __init__(self, path: str | Path, errno: int | None, strerror: str) -> None:
        reason = strerror if errno is None else f"[Errno {errno}] {strerror}"
        super().__init__(f"saving checkpoint to {path} failed: {reason}")
        self.path = str(path)
        self.errno = errno
        self.strerror = strerror

    @classmethod
    def from_os_error(cls, path: str | Path, error: OSError) -> CheckpointSaveError:
        """The save error of ``path`` caused by ``error`` (its file name left out: the
        message names the checkpoint)."""
        return cls(path, error.errno, error.strerror or str(error))

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in Ray workers and pickled to the controller: rebuild from the fields,
        # not from the formatted message (the default would call cls(message)).
        return (type(self), (self.path, self.errno, self.strerror))


class NoVerifiedCheckpointError(CheckpointError):
    """The checkpoint directory holds checkpoints, but none whose files match its marker.

    A run does not silently start afresh then: its first saves and pruning would replace
    the damaged checkpoints, which the user may still want to repair or inspect.
    """


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
    """The metadata of a complete checkpoint directory, or None if it is not one (no
    marker, or one that is not a JSON object)."""
    marker, _ = _load_marker(Path(path))
    return marker


def _load_marker(root: Path) -> tuple[dict[str, Any] | None, str]:
    """The marker of ``root``, or None and why it is unusable."""
    try:
        text = (root / MARKER).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"no {MARKER} (an unfinished save or copy, not a checkpoint)"
    except OSError as e:
        return None, f"{MARKER} unreadable: {e.strerror or e}"
    try:
        marker = json.loads(text)
    except ValueError as e:
        return None, f"{MARKER} is not valid JSON ({e})"
    if not isinstance(marker, dict):
        return None, f"{MARKER} is not a JSON object"
    return marker, ""


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


def remove_interrupted_saves(directory: str | Path) -> list[Path]:
    """Delete the ``.tmp-`` directories under ``directory``: saves that failed or were
    killed, and checkpoints moved aside by an interrupted ``publish``. Returns them.

    Call it at the start of a run, once no save can be in progress (the run directory's
    lock is held): a live save's ``.tmp-`` directory would be deleted under it.
    """
    root = Path(directory)
    if not root.is_dir():
        return []
    removed = []
    for child in sorted(root.iterdir()):
        if _TMP_DIR.match(child.name) and child.is_dir():
            shutil.rmtree(child)
            removed.append(child)
    return removed


# ----------------------------------------------------------- file lists and checksums


def checkpoint_files(directory: str | Path) -> list[str]:
    """The relative POSIX paths of every file under ``directory`` but the marker, sorted."""
    root = Path(directory)
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file() and path.relative_to(root).as_posix() != MARKER
    )


def describe_file(path: str | Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of one file, read in 1 MiB chunks.

    The size is the number of bytes hashed, so the two always describe the same content.
    """
    digest = hashlib.new(CHECKSUM)
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while count := f.readinto(buffer):
            digest.update(view[:count])
            size += count
    return {"size": size, CHECKSUM: digest.hexdigest()}


def describe_files(directory: str | Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``describe_file`` of each relative path in ``names`` under ``directory``, by name."""
    root = Path(directory)
    names = list(names)
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(_HASH_THREADS, len(names))) as pool:
        described = pool.map(lambda name: describe_file(root / name), names)
        return dict(zip(names, described, strict=True))


def write_marker(
    directory: str | Path,
    metadata: dict[str, Any],
    files: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write ``directory``'s ``complete.json``: ``metadata`` plus the file list; returns it.

    Call it last, once every file of the checkpoint is written: ``files`` describes them
    (``describe_files``; the saver computes it on all ranks in parallel), or None to hash
    every file under ``directory`` here.
    """
    if files is None:
        files = describe_files(directory, checkpoint_files(directory))
    marker = {**metadata, "checksum": CHECKSUM, "files": files}
    write_durably(Path(directory) / MARKER, json.dumps(marker, indent=2).encode())
    return marker


# ------------------------------------------------------------------------ resume


def verify_checkpoint(path: str | Path) -> str | None:
    """Why the checkpoint ``path`` cannot be trusted, or None when it can.

    Checks the marker, then every file it lists: present, of the recorded size (all of
    them first: cheap), then of the recorded checksum. A marker without a file list (an
    older version's) is trusted without checks: see ``has_file_list``. The reason names
    the first bad file and how many others are bad, e.g.
    ``model/__0_0.distcp: size 1234 != 5678 recorded (and 2 more files)``.
    """
    root = Path(path)
    marker, problem = _load_marker(root)
    if marker is None:
        return problem
    files = marker.get("files")
    if files is None:
        return None
    if (
        not isinstance(files, dict)
        or not all(isinstance(entry, dict) for entry in files.values())
        or marker.get("checksum") != CHECKSUM
    ):
        return f"{MARKER} has a file list this version cannot check"
    problems = _size_problems(root, files)
    if problems:
        return _first_of(problems)
    # The pre-flight check and the controller's resume verify the same checkpoint in one
    # process: hash it once (the cache is keyed by every file's size, mtime and inode).
    signature = _signature(root, files)
    cached = _VERIFIED.get(root.resolve())
    if cached is not None and cached[0] == signature:
        return cached[1]
    verdict = _first_of(_checksum_problems(root, files))
    _VERIFIED[root.resolve()] = (signature, verdict)
    return verdict


_VERIFIED: dict[Path, tuple[tuple[Any, ...], str | None]] = {}
"""verify_checkpoint's checksum verdicts in this process, with the files' signature."""


def _signature(root: Path, files: dict[str, dict[str, Any]]) -> tuple[Any, ...]:
    entries = []
    for name in sorted([MARKER, *files]):
        st = (root / name).stat()
        entries.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(entries)


def _first_of(problems: list[str]) -> str | None:
    if not problems:
        return None
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more file{'s' if more > 1 else ''})" if more else "")


def has_file_list(path: str | Path) -> bool:
    """Whether ``path``'s marker lists its files (markers of older versions do not)."""
    marker = read_marker(path)
    return marker is not None and "files" in marker


def _size_problems(root: Path, files: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    for name in sorted(files):
        try:
            size = (root / name).stat().st_size
        except FileNotFoundError:
            problems.append(f"{name}: missing")
            continue
        except OSError as e:
            problems.append(f"{name}: {e.strerror or e}")
            continue
        if size != files[name].get("size"):
            problems.append(f"{name}: size {size} != {files[name].get('size')} recorded")
    return problems


def _checksum_problems(root: Path, files: dict[str, dict[str, Any]]) -> list[str]:
    names = sorted(files)
    try:
        actual = describe_files(root, names)
    except OSError as e:
        name = os.path.relpath(e.filename, root) if e.filename else "a file"
        return [f"{name}: unreadable: {e.strerror or e}"]
    problems = []
    for name in names:
        recorded = files[name].get(CHECKSUM)
        if actual[name][CHECKSUM] != recorded:
            problems.append(
                f"{name}: {CHECKSUM} {actual[name][CHECKSUM][:16]} != {str(recorded)[:16]} recorded"
            )
    return problems


def find_resumable(directory: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint under ``directory`` whose files match its marker, and the
    lines to print about the way there.

    Checkpoints are tried newest first; each one that fails verification, and each newer
    ``step_`` directory that is not a checkpoint (no readable marker), gets a line
    ``[resume] skipping <path>: <reason>``. A checkpoint accepted without verification (a
    marker from before file lists) gets a line saying so. ``.tmp-`` directories are not
    looked at (``remove_interrupted_saves`` deletes them at start).

    Returns:
        ``(None, lines)`` when ``directory`` holds no checkpoint (absent, empty, or only
        ``step_`` directories without a readable marker, which ``latest_checkpoint``
        ignores too): the run starts afresh.

    Raises:
        NoVerifiedCheckpointError: there are checkpoints but none verifies. The run
            must not start afresh over them (its saves and pruning would delete them):
            the one-line message names the directory, each checkpoint and its reason,
            and the fix (restore the files, or move or delete the checkpoints).
    """
    root = Path(directory)
    if not root.is_dir():
        return None, []
    lines: list[str] = []
    failed: list[str] = []
    for _, path in sorted(_step_dirs(root), reverse=True):
        problem = verify_checkpoint(path)
        if problem is None:
            if not has_file_list(path):
                lines.append(
                    f"[resume] {path}: {MARKER} lists no files (written by an older version): "
                    f"resuming from it without verifying them"
                )
            return path, lines
        lines.append(f"[resume] skipping {path}: {problem}")
        if read_marker(path) is not None:
            failed.append(f"{path.name}: {problem}")
    if failed:
        raise NoVerifiedCheckpointError(
            f"no checkpoint in {root} passes verification ({'; '.join(failed)}): restore "
            f"their files, or move or delete these checkpoints to start the run afresh"
        )
    return None, lines


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_<N>`` directory, with or without marker."""
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return found
