"""Collecting results from groups of Ray actors without hanging on a dead one.

Workers of one group call collectives together: when one dies, the others block in the
collective forever, so waiting on all of them would hang the run. ``gather`` returns as
soon as any worker fails and names it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray


class WorkerFailure(RuntimeError):
    """A worker died or raised; the message names which."""


class WorkerDied(WorkerFailure):
    """A worker process is gone (killed, crashed): the run can restart from a checkpoint.
    A worker that merely raised is a bug or bad input, not restarted."""


def first_line(error: BaseException) -> str:
    """The first line of an error's text: Ray's actor-death messages run over many lines
    (class name, actor id, pid, ip, ...), which the run's one-line errors leave out."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class RestartsExhausted(WorkerFailure):
    """A worker died once more after ``run.max_restarts`` restarts: the run gives up."""

    def __init__(self, failure: WorkerFailure, max_restarts: int) -> None:
        super().__init__(
            f"{failure}; restarts exhausted (run.max_restarts = {max_restarts} restart(s) "
            f"already used)"
        )
        self.max_restarts = max_restarts


def gather(refs: Sequence[ray.ObjectRef[Any]], describe: Callable[[int], str]) -> list[Any]:
    """ray.get of one ref per worker, raising on the first worker that fails.

    The results are ``Any``: Ray actor method calls are dynamic (``handle.method.remote``
    has no static type), so callers annotate what the worker method returns.

    Args:
        refs: one pending call per worker, in worker order.
        describe: worker index -> how to name it in an error ("policy rank 3 (tp_rank 1)").
    """
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ref = ready[0]
        try:
            results[index[ref]] = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise WorkerDied(f"{describe(index[ref])} died: {first_line(e)}") from None
        except ray.exceptions.RayTaskError as e:
            raise WorkerFailure(f"{describe(index[ref])} raised: {e.cause!r}") from e.cause
    return results
