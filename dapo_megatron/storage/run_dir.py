"""One run per run directory: an exclusive lock, and the policy for a directory in use.

``acquire_run_dir`` is called by the CLI before anything starts. It takes an exclusive
``fcntl.flock`` on ``RUN_DIR/.lock`` for the whole run, so two jobs never write the same
metrics, checkpoints and exports. The kernel drops the lock when its process dies however
it dies (SIGKILL, OOM killer, node reboot), so a stale lock needs no manual cleanup: the
next run takes it over and says whose it was (the lock file records pid, host and start
time of its holder; a clean release empties it). The descriptor is not inherited by
programs the run execs (Python opens files non-inheritable), so a Ray or vLLM process that
outlives the driver does not keep the lock.

Under the lock it then applies the existing-directory policy (``checkpointing.resume``:
``auto`` continues whatever run the directory holds, ``never`` refuses a directory that
holds one, rather than truncate its metrics or mix two runs' checkpoints) and deletes the
``.tmp-`` leftovers of saves that failed or were killed (safe now: no other process can be
saving into this run).

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
from dapo_megatron.storage.checkpoint_dirs import remove_interrupted_saves

__all__ = ["LOCK_FILE", "RunDirLock", "acquire_run_dir"]

LOCK_FILE = ".lock"
"""Lock file in the run directory: empty when released, else its holder as JSON."""
_HOLDER_WAIT_S = 1.0
"""How long a refused process waits for the holder to write its identity (it takes the
lock first, then writes: a start within the same second may read an empty file)."""


class RunDirLock:
    """The exclusive lock on a run directory, held until ``release`` (or process exit).

    Use it as a context manager, or call ``release()``. Attributes: ``run_dir``, ``path``
    (the lock file), ``previous`` (the holder, as recorded, of a lock left by a process
    that died without releasing it; None otherwise) and ``removed`` (the ``.tmp-``
    directories deleted at acquisition).
    """

    def __init__(self, run_dir: Path, fd: int, previous: dict[str, Any] | None) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_FILE
        self.previous = previous
        self.removed: list[Path] = []
        self._fd: int | None = fd
        self._pid = os.getpid()
        # A run that ends by an exception or sys.exit releases cleanly, so the next run's
        # "ended without releasing" line means what it says: the process was killed.
        atexit.register(self.release)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Empty the lock file and unlock it; idempotent. Only the acquiring process
        releases (a forked child that inherited the descriptor must not)."""
        if self._fd is None or os.getpid() != self._pid:
            return
        fd, self._fd = self._fd, None
        atexit.unregister(self.release)
        try:
            # Emptied (never deleted: a process that opened the old file before an unlink
            # could lock it while another locks a new one, and both would run).
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
) -> RunDirLock:
    """Lock ``run_dir`` (created if absent) for this process and check it may be used.

    Prints one line for a lock taken over from a dead process, and one per ``.tmp-``
    leftover deleted from the checkpoint directory.

    Args:
        run_dir: ``run.output_dir``.
        resume: ``checkpointing.resume``: ``never`` refuses a directory that already
            holds a run's files (anything but the lock file), ``auto`` continues it.
        checkpoint_dir: ``checkpointing.checkpoint_dir`` when set elsewhere (default
            ``run_dir/checkpoints``): also checked by ``never``, and cleaned of
            interrupted saves.

    Raises:
        ConfigError: another live process holds the lock (the message names it, when and
            where it started, and the fix), or ``resume="never"`` over a used directory.
    """
    run_dir = Path(run_dir)
    checkpoints = Path(checkpoint_dir) if checkpoint_dir is not None else run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(run_dir)
    try:
        if lock.previous is not None:
            print(
                f"[run-dir] previous run ({_describe(lock.previous)}) ended without releasing "
                f"its lock on {run_dir}; taking it over",
                flush=True,
            )
        if resume == "never":
            _refuse_used(run_dir, checkpoints)
        lock.removed = remove_interrupted_saves(checkpoints)
    except BaseException:
        lock.release()
        raise
    for path in lock.removed:
        print(f"[run-dir] removed {path} (left by a save that failed or was killed)", flush=True)
    return lock


def _lock(run_dir: Path) -> RunDirLock:
    """Take the lock of ``run_dir`` and record this process in it."""
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise ConfigError(_in_use_message(run_dir, _wait_for_holder(fd))) from None
        # Anything still recorded was written by a holder that never released the lock.
        previous = _read_holder(fd)
        _write_holder(fd)
    except BaseException:
        os.close(fd)
        raise
    return RunDirLock(run_dir, fd, previous)


def _write_holder(fd: int) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
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


def _in_use_message(run_dir: Path, holder: dict[str, Any] | None) -> str:
    return (
        f"run.output_dir = {run_dir} is in use by another dapo-train ({_describe(holder)}): "
        f"wait for it to finish, or set run.output_dir to another directory"
    )


def _refuse_used(run_dir: Path, checkpoints: Path) -> None:
    """ConfigError if ``run_dir`` or ``checkpoints`` already holds a run's files."""
    used = sorted(p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir())
    used = [name for name in used if name != LOCK_FILE]
    if used:
        shown = ", ".join(used[:4]) + (", ..." if len(used) > 4 else "")
        raise ConfigError(
            f"checkpointing.resume = never, but run.output_dir = {run_dir} already holds a "
            f"run ({shown}): set run.output_dir to a new directory, or "
            f"checkpointing.resume=auto to continue that run"
        )
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        raise ConfigError(
            f"checkpointing.resume = never, but checkpointing.checkpoint_dir = {checkpoints} "
            f"already holds checkpoints: set checkpointing.checkpoint_dir (or run.output_dir) "
            f"to a new directory, or checkpointing.resume=auto to continue that run"
        )
