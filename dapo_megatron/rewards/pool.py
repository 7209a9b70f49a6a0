"""Score batches of responses in worker processes, each sample under a time limit.

A verifier can hang (math-verify on ``10^{10^{10^{10}}}`` evaluates a number with 10^10^10
digits), raise, or take its process down; none of that may stall or crash training. The
pool therefore owns a few long-lived worker processes and, per sample, a deadline:

* a worker that overruns the deadline of the sample it is on is killed and replaced; the
  sample scores 0 and counts as a timeout, the rest of its chunk goes back in the queue;
* a worker that dies (segfault, ``os._exit``, the OOM killer) costs only the sample it was
  on: that sample scores 0 and counts as an error, and the worker is replaced;
* an exception in the verifier is caught in the worker: score 0, counted as an error.

Deadlines are enforced from the parent with ``multiprocessing.connection.wait`` and
``Popen.kill``; nothing uses signals in the caller, so ``score_batch`` works from any thread,
inside a Ray actor included. Workers are fresh interpreters (see ``rewards.worker``), and a
worker reports ready only after a warm-up sample, so start-up never eats into a sample's limit.

Overhead: responses are clipped to the end the verifier reads before they are sent, samples
go out in chunks (one message out, one small reply per sample back), and cheap verifiers
(exact match, regexes over a bounded tail) skip the processes altogether.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import cast

from dapo_megatron.rewards.base import Verifier
from dapo_megatron.rewards.registry import get_verifier
from dapo_megatron.rewards.worker import (
    BOOTSTRAP,
    READY,
    STATUS_ERROR,
    STATUS_NO_ANSWER,
    STATUS_OK,
    STATUS_TIMEOUT,
    Outcome,
    judge_safely,
)

__all__ = ["VerifierPool", "VerifyResult"]

_MAX_CHUNK = 64
_STARTUP_TIMEOUT_S = 120.0
# Consecutive workers that die or hang before reporting ready: the verifier cannot run at all
# (an import error, a broken environment), which no amount of replacing will fix.
_MAX_STARTUP_FAILURES = 3


@dataclass
class VerifyResult:
    """Scores of a batch, in input order, and counts of what went wrong."""

    scores: list[float]
    """1.0 or 0.0 per sample; 0.0 for timeouts, errors and missing answers."""
    statuses: list[str]
    """One of the ``STATUS_*`` values of ``rewards.worker`` per sample."""
    answers: list[str | None]
    """The answer each verifier read (``None``: none found, or the sample failed)."""
    metrics: dict[str, float]
    """``reward/num_timeouts``, ``reward/num_errors``, ``reward/num_no_answer``,
    ``reward/verify_seconds`` (batch wall time), ``reward/sample_seconds_mean`` and
    ``reward/sample_seconds_max`` (per judged sample, timeouts excluded) and
    ``reward/num_worker_restarts``."""


class _Worker:
    """One worker process, its socket, and the samples it holds."""

    def __init__(self, verifier: Verifier, timeout_s: float, memory_limit_mb: int | None):
        parent_sock, child_sock = socket.socketpair()
        with child_sock:
            self.process = subprocess.Popen(
                [sys.executable, "-c", BOOTSTRAP, str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        # The parent now holds the only other end, so a dead worker reads as EOF.
        self.conn = Connection(parent_sock.detach())
        try:
            self.conn.send(sys.path)
            self.conn.send((verifier, timeout_s, memory_limit_mb))
        except BaseException:
            self.process.kill()
            self.conn.close()
            raise
        self.ready = False
        self.inflight: deque[int] = deque()
        """Sample indices sent and not answered yet, in the order the worker judges them."""
        self.since = time.monotonic()
        """Start of the current wait: the last message, the dispatch, or the process start."""

    def deadline(self, timeout_s: float) -> float:
        return self.since + (timeout_s if self.ready else _STARTUP_TIMEOUT_S)

    def busy(self) -> bool:
        """Whether the scheduler waits on it: starting up, or holding samples."""
        return bool(self.inflight) or not self.ready

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float = 0.0) -> None:
        """Kill the process (after ``grace_s`` to exit by itself) and close the socket."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        if self.alive():
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)
        self.conn.close()


class _Batch:
    """The state of one ``score_batch`` call."""

    def __init__(self, responses: list[str], ground_truths: list[str]):
        self.responses = responses
        self.ground_truths = ground_truths
        self.outcomes: list[Outcome | None] = [None] * len(responses)
        self.todo: deque[int] = deque(range(len(responses)))
        self.remaining = len(responses)
        self.restarts = 0

    def record(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        self.remaining -= 1

    def requeue(self, indices: deque[int]) -> None:
        self.todo.extendleft(reversed(indices))  # keep input order, ahead of fresh work


class VerifierPool:
    """Scores batches with a verifier, ``num_workers`` processes, ``timeout_s`` per sample.

    Cheap verifiers (``Verifier.cheap``), and any verifier when ``num_workers == 0``, run in
    the calling thread instead: no processes, no time limit. ``score_batch`` calls from several
    threads are serialised. Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        verifier: str | Verifier,
        *,
        num_workers: int,
        timeout_s: float,
        memory_limit_mb: int | None = 4096,
    ):
        """Start the workers (they warm up in the background; this does not wait for them).

        Args:
            verifier: a registered name ("math", "gsm8k", "arithmetic") or a ``Verifier``
                whose ``judge`` is a module-level function.
            num_workers: worker processes; 0 scores in the calling thread.
            timeout_s: per-sample time limit; a sample that overruns scores 0.
            memory_limit_mb: address-space cap of each worker (``None``: no cap).
        """
        self.verifier = get_verifier(verifier) if isinstance(verifier, str) else verifier
        try:
            pickle.dumps(self.verifier)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise ValueError(
                f"verifier {self.verifier.name!r} cannot be sent to a worker process; its judge "
                "must be a module-level function"
            ) from err
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.in_process = num_workers == 0 or self.verifier.cheap
        self._memory_limit_mb = memory_limit_mb
        self._lock = threading.Lock()
        self._closed = False
        self._startup_failures = 0
        self._workers: list[_Worker] = []
        if self.in_process:
            return
        self._workers = [self._start_worker() for _ in range(num_workers)]

    @property
    def num_workers(self) -> int:
        """Live worker processes (0 when scoring in-process)."""
        return len(self._workers)

    def score_batch(self, responses: Sequence[str], ground_truths: Sequence[str]) -> VerifyResult:
        """Score ``responses[i]`` against ``ground_truths[i]`` for every i.

        Whatever the verifier does, a sample holds a worker for at most ``timeout_s`` (then
        the worker is killed and a fresh one starts, about half a second of CPU), so a batch
        returns within about ``ceil(len / num_workers) * timeout_s`` plus restarts. Raises ``RuntimeError`` only when workers cannot start at all, or after close.
        Any exception out of a batch (that one, a ``KeyboardInterrupt``) closes the pool: its
        workers may still hold samples of the abandoned batch.
        """
        if len(responses) != len(ground_truths):
            raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
        start = time.perf_counter()
        with self._lock:
            if self._closed:
                raise RuntimeError("score_batch on a closed VerifierPool")
            if self.in_process:
                outcomes = [
                    judge_safely(self.verifier, r, g)
                    for r, g in zip(responses, ground_truths, strict=True)
                ]
                restarts = 0
            else:
                clipped = [self.verifier.clip(r) for r in responses]
                try:
                    outcomes, restarts = self._run(_Batch(clipped, list(ground_truths)))
                except BaseException:
                    self._stop_all()
                    raise
        return _result(outcomes, time.perf_counter() - start, restarts)

    def close(self) -> None:
        """Stop the workers. Idempotent."""
        with self._lock:
            self._stop_all()

    def _stop_all(self) -> None:
        self._closed = True
        for worker in self._workers:
            if not worker.inflight:  # an idle worker exits on None; a busy one is killed
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
        for worker in self._workers:
            worker.stop(grace_s=0.0 if worker.inflight else 1.0)
        self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the scheduling loop

    def _run(self, batch: _Batch) -> tuple[list[Outcome], int]:
        chunk_size = max(1, min(_MAX_CHUNK, math.ceil(len(batch.todo) / (4 * len(self._workers)))))
        while batch.remaining:
            for i, worker in enumerate(self._workers):
                if worker.ready and not worker.inflight and batch.todo:
                    self._dispatch(i, batch, chunk_size)
            waiting = [w for w in self._workers if w.busy()]
            now = time.monotonic()
            next_deadline = min(w.deadline(self.timeout_s) for w in waiting)
            # A worker's death shows as EOF on its socket, so the sockets are all we wait on.
            by_conn = {w.conn: w for w in waiting}
            for conn in wait(list(by_conn), timeout=max(0.0, next_deadline - now)):
                # wait() returns some of the objects it was given; its stub says any waitable.
                self._collect(by_conn[cast(Connection, conn)], batch)
            self._expire(batch)
        return [o for o in batch.outcomes if o is not None], batch.restarts

    def _dispatch(self, i: int, batch: _Batch, chunk_size: int) -> None:
        worker = self._workers[i]
        indices = [batch.todo.popleft() for _ in range(min(chunk_size, len(batch.todo)))]
        worker.inflight.extend(indices)
        worker.since = time.monotonic()
        try:
            worker.conn.send([(j, batch.responses[j], batch.ground_truths[j]) for j in indices])
        except OSError:
            # It died while idle: no sample is to blame, so all of them go back in the queue.
            batch.requeue(worker.inflight)
            worker.inflight.clear()
            self._replace(worker, batch)

    def _collect(self, worker: _Worker, batch: _Batch) -> None:
        """Read everything ``worker`` has sent; replace it if it died."""
        closed = False
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                worker.since = time.monotonic()
                if message == READY:
                    worker.ready = True
                    self._startup_failures = 0
                    continue
                index, outcome = message
                if worker.inflight and worker.inflight[0] == index:
                    worker.inflight.popleft()
                    batch.record(index, outcome)
        except (EOFError, OSError):
            closed = True  # its end of the socket is gone: it died or is dying
        if not closed and worker.alive():
            return
        if worker.inflight:
            # The sample it was on took it down (a segfault, os._exit, the OOM killer).
            index = worker.inflight.popleft()
            batch.record(index, Outcome(STATUS_ERROR, 0.0, None, time.monotonic() - worker.since))
            batch.requeue(worker.inflight)
            worker.inflight.clear()
        self._replace(worker, batch)

    def _expire(self, batch: _Batch) -> None:
        """Kill and replace every worker past its deadline."""
        now = time.monotonic()
        for worker in list(self._workers):
            if not worker.busy() or now < worker.deadline(self.timeout_s):
                continue
            if worker.inflight:
                index = worker.inflight.popleft()
                batch.record(index, Outcome(STATUS_TIMEOUT, 0.0, None, now - worker.since))
                batch.requeue(worker.inflight)
                worker.inflight.clear()
            self._replace(worker, batch)

    def _replace(self, worker: _Worker, batch: _Batch) -> None:
        if not worker.ready:
            self._startup_failures += 1
            if self._startup_failures >= _MAX_STARTUP_FAILURES:
                worker.stop()
                code = worker.process.poll()
                raise RuntimeError(
                    f"verifier {self.verifier.name!r}: {self._startup_failures} worker processes "
                    f"in a row died or hung before becoming ready (last exit code {code}); "
                    "check that the verifier module imports in a fresh interpreter"
                )
        worker.stop()
        self._workers[self._workers.index(worker)] = self._start_worker()
        batch.restarts += 1

    def _start_worker(self) -> _Worker:
        return _Worker(self.verifier, self.timeout_s, self._memory_limit_mb)


def _result(outcomes: list[Outcome], seconds: float, restarts: int) -> VerifyResult:
    judged = [o.seconds for o in outcomes if o.status != STATUS_TIMEOUT]
    counts = {s: 0 for s in (STATUS_OK, STATUS_NO_ANSWER, STATUS_ERROR, STATUS_TIMEOUT)}
    for outcome in outcomes:
        counts[outcome.status] += 1
    metrics = {
        "reward/num_timeouts": float(counts[STATUS_TIMEOUT]),
        "reward/num_errors": float(counts[STATUS_ERROR]),
        "reward/num_no_answer": float(counts[STATUS_NO_ANSWER]),
        "reward/verify_seconds": seconds,
        "reward/sample_seconds_mean": sum(judged) / len(judged) if judged else 0.0,
        "reward/sample_seconds_max": max(judged, default=0.0),
        "reward/num_worker_restarts": float(restarts),
    }
    return VerifyResult(
        scores=[o.score for o in outcomes],
        statuses=[o.status for o in outcomes],
        answers=[o.answer for o in outcomes],
        metrics=metrics,
    )
