"""Collecting results from groups of Ray actors without hanging on a dead or stuck one.

Workers of one group call collectives together: when one dies, the others block in the
collective, so waiting on all of them would hang the run. ``gather`` returns as soon as
any worker fails and names it, with three refinements:

* a survivor's collective error ("Connection reset by peer", a gloo/NCCL timeout) often
  reaches the controller before Ray reports the death that caused it; such an error is
  held for a grace period while Ray reports the group's other calls, and a death found
  then is what is raised (WorkerDied of the dead worker: the run restarts);
* a worker that gives no answer within the call timeout (``run.call_timeout_s``), or
  that still has none once a peer's collective timed out on it, is named as hung
  (WorkerHung: killed with its group, and the run restarts like after a death);
* the refs of the calls not collected after a failure are released with Ray's
  "Unhandled error" printing off: the one-line error already says what happened.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from dapo_megatron.controller.actors import preemption

# How long a survivor's collective error waits for Ray to report the death behind it
# (usually well under a second; seconds on a loaded node).
DEATH_GRACE_S = 30.0

# The longest one ray.wait blocks: the preemption deadline is checked in between.
POLL_S = 1.0

# The process's call timeout (``run.call_timeout_s``), set once by the controller at the
# start of a run (``set_call_timeout``): every gather times out, the ones in modules that
# do not hold the config too. None: no timeout (library use, unit tests).
_call_timeout_s: float | None = None
# The policy's collective timeout (``run.collective_timeout_s``): a held collective error
# never waits longer than it, so a small test timeout keeps the grace small too.
_collective_timeout_s: float | None = None

# Words in the text of an error raised by a collective because of a peer (gloo, NCCL,
# torch.distributed's store), not by the rank's own bug.
_PEER_ERROR_MARKERS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "timed out",
    "timeout",
    "gloo",
    "nccl",
)


class WorkerFailure(RuntimeError):
    """A worker died or raised; the message names which."""


class WorkerDied(WorkerFailure):
    """A worker process is gone (killed, crashed): the run can restart from a checkpoint.
    A worker that merely raised is a bug or bad input, not restarted."""


class WorkerHung(WorkerDied):
    """A worker stopped answering (stuck, stopped, a collective that never completes): its
    group is killed and the run restarts from a checkpoint, as after a death."""


def first_line(error: BaseException) -> str:
    """The first line of an error's text: Ray's actor-death messages run over many lines
    (class name, actor id, pid, ip, ...), which the run's one-line errors leave out."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# The end of a worker's traceback kept in the controller's error: the failing frames and
# the exception are at the end; a deep Megatron stack above them would drown the console.
WORKER_TRACEBACK_CHARS = 6000


def raised_text(name: str, error: ray.exceptions.RayTaskError) -> str:
    """The error of a worker call that raised: its one line (the name and the exception's
    repr), then the worker's own traceback (Ray's ``traceback_str``), which otherwise lives
    only in the worker's log, in a run directory a caller may already have deleted."""
    head = f"{name} raised: {error.cause!r}"
    trace = (getattr(error, "traceback_str", None) or "").strip()
    if not trace:
        return head
    if len(trace) > WORKER_TRACEBACK_CHARS:
        trace = "..." + trace[-WORKER_TRACEBACK_CHARS:]
    body = "\n".join(f"  | {line}" for line in trace.splitlines())
    return f"{head}\n  worker traceback:\n{body}"


class RestartsExhausted(WorkerFailure):
    """A worker died once more after ``run.max_restarts`` restarts: the run gives up."""

    def __init__(self, failure: WorkerFailure, max_restarts: int) -> None:
        super().__init__(
            f"{failure}; restarts exhausted (run.max_restarts = {max_restarts} restart(s) "
            f"already used)"
        )
        self.max_restarts = max_restarts


def set_call_timeout(call_timeout_s: float | None, collective_timeout_s: float | None) -> None:
    """The run's ``run.call_timeout_s`` and ``run.collective_timeout_s`` for every gather of
    this process (the controller sets them once per run)."""
    global _call_timeout_s, _collective_timeout_s
    _call_timeout_s, _collective_timeout_s = call_timeout_s, collective_timeout_s


def is_peer_error(cause: BaseException | None) -> bool:
    """Whether a worker's exception is a collective failing because of a peer."""
    if cause is None:
        return False
    if type(cause).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError"):
        return True
    text = str(cause).lower()
    return any(marker in text for marker in _PEER_ERROR_MARKERS)


def _grace_s() -> float:
    if _collective_timeout_s is None:
        return DEATH_GRACE_S
    return min(DEATH_GRACE_S, _collective_timeout_s)


# The calls a failed gather left uncollected: read once their workers are killed
# (``settle_abandoned``), so that Ray never reports their errors as unhandled.
_abandoned: list[ray.ObjectRef[Any]] = []


def _release(refs: Sequence[ray.ObjectRef[Any]]) -> None:
    """Keep a failed gather's uncollected refs for ``settle_abandoned``: freed unread, a
    ref holding an error makes Ray print "Unhandled error" with the worker's traceback
    (another rank's copy of the failure just raised as one line)."""
    _abandoned.extend(refs)


def abandon(refs: Sequence[ray.ObjectRef[Any]]) -> None:
    """Calls whose results nobody waits for (a shutdown's): read by ``settle_abandoned``, so
    a dead worker's error is not reported as unhandled."""
    _release(refs)


def settle_abandoned(timeout_s: float = 10.0) -> None:
    """Read the results of the calls failed gathers left behind (after their workers were
    killed, they all end within moments), so their errors count as handled."""
    refs = list(_abandoned)
    _abandoned.clear()
    if not refs:
        return
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in ready:
        with contextlib.suppress(Exception):
            ray.get(ref, timeout=0)


def _wait_one(
    refs: list[ray.ObjectRef[Any]], deadline: float | None
) -> tuple[list[ray.ObjectRef[Any]], list[ray.ObjectRef[Any]]]:
    """``ray.wait`` for one of ``refs`` until ``deadline`` (monotonic; None: none), in
    slices of at most POLL_S, between which the preemption deadline is checked
    (controller/actors/preemption.py: a SIGTERM's grace period ends even a wait for a hung
    worker)."""
    while True:
        preemption.check_deadline()
        left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
        ready, rest = ray.wait(refs, num_returns=1, timeout=max(0.0, left))
        if ready or (deadline is not None and time.monotonic() >= deadline):
            return ready, rest


def gather(
    refs: Sequence[ray.ObjectRef[Any]],
    describe: Callable[[int], str],
    *,
    timeout_s: float | None = None,
) -> list[Any]:
    """ray.get of one ref per worker, raising on the first worker that fails.

    The results are ``Any``: Ray actor method calls are dynamic (``handle.method.remote``
    has no static type), so callers annotate what the worker method returns.

    Args:
        refs: one pending call per worker, in worker order.
        describe: worker index -> how to name it in an error ("policy rank 3 (tp_rank 1)").
        timeout_s: the longest wait for all of them (default: the run's
            ``run.call_timeout_s``, see ``set_call_timeout``).
    """
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    limit = _call_timeout_s if timeout_s is None else timeout_s
    deadline = None if limit is None else time.monotonic() + limit
    try:
        while pending:
            ready, pending = _wait_one(pending, deadline)
            if not ready:
                names = ", ".join(describe(index[r]) for r in pending)
                raise WorkerHung(
                    f"{names} gave no answer within {limit:g} s (run.call_timeout_s); "
                    f"killed with its group"
                )
            ref = ready[0]
            try:
                results[index[ref]] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                raise WorkerDied(f"{describe(index[ref])} died: {first_line(e)}") from None
            except ray.exceptions.RayTaskError as e:
                failure = WorkerFailure(raised_text(describe(index[ref]), e))
                if is_peer_error(e.cause) and pending:
                    witness = f"{describe(index[ref])} ({_short(e.cause)})"
                    _raise_behind_peer_error(witness, pending, index, describe)
                raise failure from e.cause
    except BaseException:
        _release(pending)
        raise
    return results


def _short(cause: BaseException | None) -> str:
    """A collective error in a few words: gloo's text starts with a source location
    ("[.../pair.cc:537] Read error ...") and ends with advice; the middle is the news."""
    text = first_line(cause) if cause is not None else "?"
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". ")[0][:160]


def _raise_behind_peer_error(
    witness: str,
    pending: list[ray.ObjectRef[Any]],
    index: dict[ray.ObjectRef[Any], int],
    describe: Callable[[int], str],
) -> None:
    """A worker's collective failed because of a peer (``witness``: that worker and its
    error): wait (``_grace_s``) for the other calls of the group and raise what caused it,
    a death (WorkerDied) or a worker that never answered (WorkerHung); returns when
    neither is found (the failure stands)."""
    grace = _grace_s()
    waiting = list(pending)
    deadline = time.monotonic() + grace
    while waiting:
        ready, waiting = _wait_one(waiting, deadline)
        if not ready:
            break
        pending.remove(ready[0])
        try:
            ray.get(ready[0])
        except ray.exceptions.RayActorError as death:
            raise WorkerDied(f"{describe(index[ready[0]])} died: {first_line(death)}") from None
        except ray.exceptions.RayTaskError:
            pass  # another survivor that saw the same broken collective
    if waiting:
        names = ", ".join(describe(index[r]) for r in waiting)
        timeout = "" if _collective_timeout_s is None else f"{_collective_timeout_s:g} s, "
        raise WorkerHung(
            f"{names} stopped responding: the collective of {witness} failed waiting for "
            f"it ({timeout}run.collective_timeout_s) and it gave no answer within {grace:g} s "
            f"more; killed with its group"
        ) from None
