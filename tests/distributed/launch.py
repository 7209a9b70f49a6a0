"""Run a function in N local gloo processes (a minimal torchrun for tests).

``run_distributed(fn, world_size, *args)`` spawns ``world_size`` processes with RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (a free port) set, calls
``fn(*args)`` in each, and returns the per-rank return values. A failing rank makes the
call raise with the child's traceback; the other ranks are terminated (they would
otherwise hang in a collective). Ranks that use no CPU time for ``timeout`` seconds (scaled
by the machine's speed, tests/waits.py) are killed: ranks that compute are never cut off
by a busy machine, ranks blocked in a collective or asleep are.

``fn`` must be importable by the children (a module-level function of a test module).

The ranks fork from Python's forkserver, which imports torch and Megatron-Core once for the
whole session (``set_forkserver_preload``): a spawned rank imported them again for every
call, ~5-10 s per call on a 2-core machine, and the suite makes ~60 calls. The server is a
fresh interpreter (started by exec, not forked from pytest), so the ranks fork from a
process with no threads and no process group. A rank gets the caller's environment and
working directory as they are at the call (a forked rank would otherwise have the server's).
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
import waits

# Only third-party modules: ours are imported by the ranks themselves (Triton decides
# interpreted or compiled when a kernel module is imported, from TRITON_INTERPRET).
mp.set_forkserver_preload(["torch", "megatron.core", "megatron.core.parallel_state"])


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    port: int,
    out_dir: str,
    args: tuple,
    env: dict[str, str],
    cwd: str,
) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    # N processes on a couple of cores: one intra-op thread each avoids oversubscription.
    torch.set_num_threads(1)
    result = fn(*args)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


def run_distributed(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 180.0
) -> list[Any]:
    """Call ``fn(*args)`` in ``world_size`` spawned processes; returns results by rank.

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank raised (message holds its
            traceback).
        torch.multiprocessing.ProcessExitedException: a rank died (signal, exit code).
        TimeoutError: the ranks used no CPU time for ``timeout`` seconds (scaled).
    """
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _child,
            args=(fn, world_size, free_port(), out_dir, args, dict(os.environ), os.getcwd()),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        pids = [p.pid for p in context.processes]
        try:
            # join() blocks up to 1 s per poll and raises as soon as a rank failed.
            waits.wait_until(
                lambda: context.join(timeout=1.0), what=f"{fn.__name__} on {world_size} ranks",
                idle_s=timeout, progress=waits.cpu_progress(lambda: pids), poll_s=0,
            )  # fmt: skip
        except waits.WaitTimeout as idle:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
            raise TimeoutError(str(idle)) from None
        return [
            torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)
        ]
