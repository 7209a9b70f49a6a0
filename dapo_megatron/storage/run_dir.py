"""One run per run directory: exclusive locks, and the policy for a directory in use.

``acquire_run_dir`` is called by the CLI before anything starts. It takes an exclusive
``fcntl.flock`` on ``.lock`` in every directory the run writes (the run directory, the
checkpoint directory, the HF export directory) for the whole run, so two jobs never write
the same metrics, checkpoints and exports: two runs with different run directories but one
``checkpointing.checkpoint_dir`` would otherwise delete each other's saves in progress and
resume from each other's checkpoints. The kernel drops the lock when its process dies however
it dies (SIGKILL, OOM killer, node reboot), so a stale lock needs no manual cleanup: the
next run takes it over and says whose it was (the lock file records pid, host and start
time of its holder; a clean release empties it). The descriptor is not inherited by
programs the run execs (Python opens files non-inheritable), so a Ray or vLLM process that
outlives the driver does not keep the lock.

Under the locks it then applies the existing-directory policy (``checkpointing.resume``:
``auto`` continues the run the directory holds from its checkpoint, ``never`` refuses a
directory that holds one; a directory that holds a run's outputs but no checkpoint to
continue it from is refused under both, rather than truncate its metrics or mix two runs'
exports) and deletes the ``.tmp-`` leftovers of saves that failed or were killed (safe now:
no other process can be saving into this checkpoint directory).

Stdlib only (the controller and the CLI import it). ``flock`` on NFS is mapped to POSIX
record locks by Linux (since 2.6.12), which NFS propagates between clients.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.storage.checkpoint_dirs import complete_checkpoints, remove_interrupted_saves

__all__ = [
    "LOCK_FILE",
    "RunDirLock",
    "acquire_run_dir",
    "unresumable_run_problem",
    "used_dir_problem",
]

LOCK_FILE = ".lock"
"""Lock file in the run directory: empty when released, else its holder as JSON."""
RUN_KEY = "run.output_dir"
CHECKPOINT_KEY = "checkpointing.checkpoint_dir"
EXPORT_KEY = "the HF export directory (checkpointing.export_hf)"
_FIX = {
    RUN_KEY: "wait for it to finish, or set run.output_dir to another directory",
    CHECKPOINT_KEY: "two runs must not share it (each would delete the other's saves in "
    "progress and resume from its checkpoints): set checkpointing.checkpoint_dir to a "
    "directory of this run's own, or wait for the other run to finish",
    EXPORT_KEY: "wait for it to finish, or set run.output_dir to another directory",
}
"""The fix each in-use message gives, by the directory's key."""
_HOLDER_WAIT_S = 1.0
"""How long a refused process waits for the holder to write its identity (it takes the
lock first, then writes: a start within the same second may read an empty file)."""


class RunDirLock:
    """The exclusive locks of a run's directories, held until ``release`` (or process exit).

    Use it as a context manager, or call ``release()``. Attributes: ``run_dir``, ``path``
    (the run directory's lock file), ``paths`` (every lock file held: run, checkpoint and
    export directories), ``previous`` (the holder, as recorded, of a run-directory lock
    left by a process that died without releasing it; None otherwise) and ``removed`` (the
    ``.tmp-`` directories deleted at acquisition).
    """

    def __init__(self, run_dir: Path, fd: int, previous: dict[str, Any] | None) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_FILE
        self.paths = [self.path]
        self.previous = previous
        self.removed: list[Path] = []
        self._fds: list[int] = [fd]
        self._pid = os.getpid()
        # A run that ends by an exception or sys.exit releases cleanly, so the next run's
        # "ended without releasing" line means what it says: the process was killed.
        atexit.register(self.release)

    @property
    def held(self) -> bool:
        """Whether this object still holds its locks."""
        return bool(self._fds)

    def add(self, path: Path, fd: int) -> None:
        """Hold the lock of one more directory (released with the others)."""
        self.paths.append(path)
        self._fds.append(fd)

    def release(self) -> None:
        """Empty the lock files and unlock them; idempotent. Only the acquiring process
        releases (a forked child that inherited the descriptors must not)."""
        if not self._fds or os.getpid() != self._pid:
            return
        fds, self._fds = self._fds, []
        atexit.unregister(self.release)
        for fd in reversed(fds):
            try:
                # Emptied (never deleted: a process that opened the old file before an
                # unlink could lock it while another locks a new one, and both would run).
                os.ftruncate(fd, 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def acquire_run_dir(
    run_dir: Path,
    *,
    resume: Literal["auto", "never"],
    checkpoint_dir: Path | None = None,
    export_dir: Path | None = None,
) -> RunDirLock:
    """Lock ``run_dir`` (created if absent) and the other directories the run writes for
    this process, and check they may be used.

    Prints one line for a lock taken over from a dead process, and one per ``.tmp-``
    leftover deleted from the checkpoint directory.

    Args:
        run_dir: ``run.output_dir``.
        resume: ``checkpointing.resume``: ``never`` refuses a directory that already
            holds a run's files (anything but lock files), ``auto`` continues it from its
            checkpoint (and refuses it when there is none: ``unresumable_run_problem``).
        checkpoint_dir: ``checkpointing.checkpoint_dir`` (default ``run_dir/checkpoints``):
            locked too, also checked by ``never``, and cleaned of interrupted saves.
        export_dir: where the run exports HF checkpoints (``run_dir/hf`` with
            ``checkpointing.export_hf``), locked too; None when the run exports nothing.

    Raises:
        ConfigError: another live process holds one of the locks (the message names the
            directory, the holder and its run directory, and the fix), ``resume="never"``
            over a used directory, or a used directory with nothing to resume from.
    """
    run_dir = Path(run_dir)
    checkpoints = Path(checkpoint_dir) if checkpoint_dir is not None else run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunDirLock(run_dir, *_lock(run_dir, RUN_KEY, run_dir))
    try:
        if lock.previous is not None:
            print(
                f"[run-dir] previous run ({_describe(lock.previous)}) ended without releasing "
                f"its lock on {run_dir}; taking it over",
                flush=True,
            )
        # Checked before the other locks create their directories inside the run dir.
        if resume == "never" and (problem := used_dir_problem(run_dir, checkpoints)):
            raise ConfigError(problem)
        others = [(checkpoints, CHECKPOINT_KEY)]
        if export_dir is not None:
            others.append((Path(export_dir), EXPORT_KEY))
        for directory, key in others:
            if directory.resolve() == run_dir.resolve():
                continue  # already held
            directory.mkdir(parents=True, exist_ok=True)
            fd, _ = _lock(directory, key, run_dir)
            lock.add(directory / LOCK_FILE, fd)
        if resume == "auto" and (problem := unresumable_run_problem(run_dir, checkpoints)):
            raise ConfigError(problem)
        # Only now: no other live run can be saving into this checkpoint directory.
        lock.removed = remove_interrupted_saves(checkpoints)
    except BaseException:
        lock.release()
        raise
    for path in lock.removed:
        print(f"[run-dir] removed {path} (left by a save that failed or was killed)", flush=True)
    return lock


def unresumable_run_problem(run_dir: Path, checkpoints: Path) -> str | None:
    """Why ``run_dir`` cannot be used by ``checkpointing.resume=auto``, or None.

    A directory holding a run's outputs (metrics.jsonl rows, exports under hf/) without a
    complete checkpoint to continue that run from (``checkpointing.enabled = false``, or a
    run stopped before its first save) would be started afresh over them: its metrics
    truncated and its exports mixed with the new run's. The pre-flight check and the
    locked start both ask this (whether a checkpoint verifies is find_resumable's question).
    """
    outputs = _run_outputs(run_dir)
    if not outputs or complete_checkpoints(checkpoints):
        return None
    return (
        f"run.output_dir = {run_dir} already holds a run ({', '.join(outputs)}) but "
        f"{checkpoints} has no checkpoint to continue it from, so starting here would "
        f"overwrite it: set run.output_dir to a new directory, or delete {run_dir} to start "
        f"afresh"
    )


def _run_outputs(run_dir: Path) -> list[str]:
    """The outputs of an earlier run in ``run_dir``: a metrics.jsonl with content, HF
    exports. (config.yaml alone is written by any start, even one that then failed.)"""
    outputs = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        outputs.append(metrics.name)
    hf = run_dir / "hf"
    if hf.is_dir() and any(child.name != LOCK_FILE for child in hf.iterdir()):
        outputs.append("hf/")
    return outputs


def _lock(directory: Path, key: str, run_dir: Path) -> tuple[int, dict[str, Any] | None]:
    """Take the lock of ``directory`` (``key``: the config key naming it in errors) and
    record this process and its run directory in it; returns the descriptor and the
    holder left recorded by a process that died holding it."""
    path = directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise ConfigError(_in_use_message(directory, key, _wait_for_holder(fd))) from None
        # Anything still recorded was written by a holder that never released the lock.
        previous = _read_holder(fd)
        _write_holder(fd, run_dir)
    except BaseException:
        os.close(fd)
        raise
    return fd, previous


def _write_holder(fd: int, run_dir: Path) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_dir": str(run_dir),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    os.fsync(fd)


def _read_holder(fd: int) -> dict[str, Any] | None:
    """The holder recorded in the lock file, or None if it is empty (or not ours)."""
    data = os.pread(fd, 4096, 0)
    if not data.strip():
        return None
    try:
        holder = json.loads(data)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _wait_for_holder(fd: int) -> dict[str, Any] | None:
    """The live holder's record; it may still be writing it, so wait a moment."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while (holder := _read_holder(fd)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return holder


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "pid unknown"
    return (
        f"pid {holder.get('pid', '?')}, host {holder.get('host', '?')}, "
        f"started {holder.get('started', '?')}"
    )


def _in_use_message(directory: Path, key: str, holder: dict[str, Any] | None) -> str:
    owner = ""
    if key != RUN_KEY and holder and "run_dir" in holder:
        owner = f", run.output_dir = {holder['run_dir']}"
    return (
        f"{key} = {directory} is in use by another dapo-train ({_describe(holder)}{owner}): "
        f"{_FIX[key]}"
    )


def used_dir_problem(run_dir: Path, checkpoints: Path) -> str | None:
    """Why ``checkpointing.resume=never`` refuses these directories (``run_dir`` or
    ``checkpoints`` already holds a run's files), or None."""
    if not run_dir.is_dir():
        return None
    used = sorted(
        p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir() if not _only_lock(p)
    )
    if used:
        shown = ", ".join(used[:4]) + (", ..." if len(used) > 4 else "")
        return (
            f"checkpointing.resume = never, but run.output_dir = {run_dir} already holds a "
            f"run ({shown}): set run.output_dir to a new directory, or "
            f"checkpointing.resume=auto to continue that run"
        )
    if checkpoints.is_dir() and any(c.name != LOCK_FILE for c in checkpoints.iterdir()):
        return (
            f"checkpointing.resume = never, but checkpointing.checkpoint_dir = {checkpoints} "
            f"already holds checkpoints: set checkpointing.checkpoint_dir (or run.output_dir) "
            f"to a new directory, or checkpointing.resume=auto to continue that run"
        )
    return None


def _only_lock(path: Path) -> bool:
    """Whether ``path`` is a lock file, or a directory holding nothing but one (left by
    an earlier start that wrote nothing): neither makes a directory used."""
    if path.name == LOCK_FILE:
        return True
    return path.is_dir() and [child.name for child in path.iterdir()] == [LOCK_FILE]
