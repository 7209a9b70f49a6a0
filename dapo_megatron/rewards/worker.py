"""The worker side of the verifier pool: judge samples sent over a socket, one reply each.

A worker is a fresh interpreter (``python -c BOOTSTRAP <fd>``), not a fork of the caller: the
caller may be a Ray actor full of threads, where ``fork`` is unsafe, and unlike
multiprocessing's spawn and forkserver, a fresh interpreter never re-runs the caller's
``__main__`` (a script without a main guard, Ray's worker entry point). Start-up, about half a
second with math-verify, happens off the clock: the worker judges a warm-up sample and only
then reports ready.

Protocol on the socket (``multiprocessing.connection`` framing, pickled messages):
parent -> worker: ``sys.path``, then ``(verifier, timeout_s, memory_limit_mb)``, then chunks
``[(index, response, ground_truth), ...]``, ``None`` to stop. worker -> parent: ``"ready"``,
then ``(index, Outcome)`` per sample, in chunk order.
"""

from __future__ import annotations

import contextlib
import math
import time
from multiprocessing.connection import Connection
from typing import NamedTuple

from dapo_megatron.rewards.base import Verifier

__all__ = [
    "BOOTSTRAP",
    "READY",
    "STATUS_ERROR",
    "STATUS_NO_ANSWER",
    "STATUS_OK",
    "STATUS_TIMEOUT",
    "Outcome",
    "judge_safely",
    "serve",
]

STATUS_OK = "ok"
"""An answer was found and judged (right or wrong)."""
STATUS_NO_ANSWER = "no_answer"
"""The response holds no answer in the verifier's format."""
STATUS_ERROR = "error"
"""The verifier raised, or its worker process died, on this sample."""
STATUS_TIMEOUT = "timeout"
"""The verifier overran the time limit on this sample; its worker was killed."""

READY = "ready"
"""The first message of a worker: warmed up, send work."""

BOOTSTRAP = (
    # Only the standard library until sys.path is the parent's: the package may be importable
    # only through paths the parent added (pytest's rootdir, a Ray runtime_env).
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:] = conn.recv()\n"
    "from dapo_megatron.rewards.worker import serve\n"
    "serve(conn)\n"
)
"""Code a worker interpreter runs (``python -c BOOTSTRAP <socket fd>``)."""


class Outcome(NamedTuple):
    """What happened to one sample."""

    status: str
    """One of the ``STATUS_*`` values."""
    score: float
    answer: str | None
    seconds: float
    """Time spent judging it (for a timeout: the time waited before the kill)."""


def judge_safely(verifier: Verifier, response: str, ground_truth: str) -> Outcome:
    """Judge one sample in this process; an exception becomes an ``error`` outcome."""
    start = time.perf_counter()
    try:
        score, answer = verifier.judge(response, ground_truth)
    except Exception:  # a verifier bug or a pathological input costs one sample, no more
        return Outcome(STATUS_ERROR, 0.0, None, time.perf_counter() - start)
    status = STATUS_NO_ANSWER if answer is None else STATUS_OK
    return Outcome(status, float(score), answer, time.perf_counter() - start)


def serve(conn: Connection) -> None:
    """Run a worker until the parent sends ``None`` or goes away."""
    verifier, timeout_s, memory_limit_mb = conn.recv()
    _configure_process(memory_limit_mb)
    judge_safely(verifier, *verifier.warmup)
    conn.send(READY)
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if chunk is None:
            return
        for index, response, ground_truth in chunk:
            _limit_cpu(2 * timeout_s + 1)
            conn.send((index, judge_safely(verifier, response, ground_truth)))


def _configure_process(memory_limit_mb: int | None) -> None:
    import signal

    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import resource
    except ImportError:  # not POSIX: no limits
        return
    # A verifier that segfaults or hits the CPU limit must not leave core files behind.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_limit_mb is not None:
        # A runaway big integer or sympy expansion then raises MemoryError here (an error
        # outcome) instead of driving the node into the OOM killer before the deadline.
        limit = memory_limit_mb * 1024 * 1024
        with contextlib.suppress(ValueError, OSError):  # not enforceable on this platform
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _limit_cpu(budget_s: float) -> None:
    # The parent kills a worker at the wall-clock deadline. This kernel-enforced CPU limit is
    # the backstop for when the parent is gone (SIGKILLed, OOM-killed): a worker stuck in C
    # code (a big-integer power holds the GIL, so no Python watchdog runs) is then stopped by
    # SIGXCPU instead of burning a core forever. CPU time never exceeds wall time in this
    # single-threaded loop, so it cannot fire before the parent's own kill.
    try:
        import resource
    except ImportError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(time.process_time() + budget_s)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
