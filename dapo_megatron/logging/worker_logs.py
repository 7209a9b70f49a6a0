"""Worker output in files under the run directory, not on the user's console.

A policy rank or a generation engine prints what its libraries print: Megatron's and
Transformer Engine's warnings, Ray's worker banners, NCCL/gloo notes, one copy per rank.
Forwarded to the driver (Ray's ``log_to_driver``) they bury the controller's few lines;
left in Ray's session directory (``/tmp/ray/session_*/logs``) nobody finds them. So each
worker sends its stdout and stderr, at the file-descriptor level (C libraries and child
processes included), to ``<run_dir>/logs/workers/<name>.log``, named once on the console.

A worker's real error still reaches the console: an exception raised in a worker method
travels to the controller with its traceback (Ray's RayTaskError), which reports it; a
process that dies without one (a segfault, the OOM killer) is reported by the controller
as a lost worker, and its last words are in its log file.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

__all__ = ["WORKER_LOG_SUBDIR", "in_ray_actor", "redirect_worker_output", "worker_log_dir"]

WORKER_LOG_SUBDIR = Path("logs") / "workers"
"""Where, under the run directory, the workers' output files are."""

_log = logging.getLogger(__name__)


def worker_log_dir(run_dir: Path) -> Path:
    """The directory of the workers' output files of the run in ``run_dir``."""
    return Path(run_dir) / WORKER_LOG_SUBDIR


def in_ray_actor() -> bool:
    """True in a Ray actor's process; False in the driver, a test or an export rank
    (whose output is the caller's own and must stay where it is)."""
    if "ray" not in sys.modules:  # never imported: certainly not a Ray worker
        return False
    import ray

    if not ray.is_initialized():
        return False
    try:
        return ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # an older or half-initialised runtime context: leave output alone
        return False


def redirect_worker_output(run_dir: Path, name: str) -> Path | None:
    """In a Ray actor, send this process's stdout and stderr to
    ``<run_dir>/logs/workers/<name>.log`` (appended: a restarted worker's output follows
    the one it replaces); returns the file, or None when not in an actor or the file
    cannot be opened (the output then stays with Ray, with a warning).
    """
    if not in_ray_actor():
        return None
    path = worker_log_dir(run_dir) / f"{name}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as err:
        _log.warning("worker output stays in Ray's logs: cannot open %s: %s", path, err)
        return None
    # Flush first: what Python buffered so far belongs to the old descriptors.
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return path
