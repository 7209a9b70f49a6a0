"""Remove the shared-memory files a test session's killed processes left behind.

vLLM's engine processes (``psm_*`` from multiprocessing.shared_memory, ``vllm_dist_*``,
``sem.mp-*`` semaphores) and our handle-transport buffers (``dapo-refit-*``) name files in
/dev/shm; a process killed by a test (SIGKILL runs no cleanup) leaves them there, hundreds
of MB per vLLM engine. At the end of a session, the files of these kinds that appeared
during it and that no live process maps or holds open are removed. Files that existed
before the session, or that belong to other programs, are never touched.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHM = Path("/dev/shm")
PREFIXES = ("psm_", "vllm_dist_", "sem.mp-", "dapo-refit-")


def ours(directory: Path = SHM) -> set[str]:
    """Names in ``directory`` of the kinds this module cleans."""
    if not directory.is_dir():
        return set()
    return {p.name for p in directory.iterdir() if p.name.startswith(PREFIXES)}


def paths_in_use() -> set[str]:
    """Every file path some live process maps or holds open (the ones we can read)."""
    used: set[str] = set()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (pid_dir / "maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6:
                    used.add(parts[5].removesuffix(" (deleted)"))
        with contextlib.suppress(OSError):
            for fd in (pid_dir / "fd").iterdir():
                with contextlib.suppress(OSError):
                    used.add(os.readlink(fd))
    return used


def remove_leftovers(before: set[str], directory: Path = SHM) -> list[str]:
    """Remove the files of our kinds created since ``before`` that nothing uses; returns
    their names."""
    new = ours(directory) - before
    if not new:
        return []
    used = paths_in_use()
    removed = []
    for name in sorted(new):
        path = directory / name
        if str(path) in used:
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(name)
    return removed
