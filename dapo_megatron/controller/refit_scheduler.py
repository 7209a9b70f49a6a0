"""When the overlapped loop's weight transfers run (``rollout.max_staleness = K >= 1``).

The synchronous loop refits between steps and needs no scheduler. In the overlapped loop
the engines keep generating while the policy trains, so the transfer of new weights must
find its place in each engine's queue: after the last request the current weights should
still generate, before the first that the new weights must generate. The loop tells the
scheduler three things and nothing else:

- ``arm(version)``: the train step that makes ``version``'s weights has been submitted;
  queue their transfer as soon as the engines have nothing left to generate with the
  current weights (the rollout stream's budget at their version is met, counting what is
  in flight). The transfer then follows the last such request on each engine without
  waiting for the controller to score it.
- ``start(version)``: the loop wants the transfer now (queued behind the train step);
  ``start_early`` (the policy still trains) returns None while the budget at the current
  version is open, as the engines would rather keep generating with it (K >= 2).
- ``finish(refit)``: wait for it, run validation on the new weights if asked (``hold``:
  before any training request), and let generation continue.

Ray runs one submitter's calls to an actor in order (docs.ray.io, "Actor Task Execution
Order"), so the policy ranks send as soon as their queued train step is done, each engine
receives as soon as the requests queued before it are finished, and the request the
stream submits next, right behind the receive, is generated with the new weights. Every
submission, requests and transfers alike, is made under the stream's lock, so the queue
order on each engine is the version order (docs/ARCHITECTURE.md, "The refit").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dapo_megatron.controller.policy_group import PolicyGroup


class PendingTransfer(Protocol):
    """A submitted weight transfer (refitter.PendingRefit)."""

    def finish(self) -> float: ...


class TransferEngines(Protocol):
    """What the scheduler needs of split-mode engines (GenerationGroup)."""

    def start_refit(self, policy: PolicyGroup) -> PendingTransfer: ...

    @property
    def queues_refits(self) -> bool:
        """Whether ``start_refit`` only submits calls (else it waits for the policy)."""
        ...


class Stream(Protocol):
    """What the scheduler needs of the rollout stream; every call is made holding
    ``lock``."""

    @property
    def lock(self) -> threading.Condition:
        """Held for every submission and budget decision."""
        ...

    def budget_met(self) -> bool:
        """Nothing is left to generate with the engines' current weights."""
        ...

    def switch_version(self, version: int) -> None:
        """A transfer to ``version`` is queued: requests submitted from now on are tagged
        (and generated) with it."""
        ...

    def top_up(self) -> None:
        """Submit what the budget allows now (the scheduler changed it)."""
        ...

    def raise_error(self) -> None:
        """Re-raise a failure of the generation thread."""
        ...


@dataclass
class ScheduledRefit:
    """A transfer started by the scheduler; pass it to ``finish``."""

    transfer: PendingTransfer
    version: int
    """The policy version the engines hold once it is done."""
    hold: bool
    """No request is submitted until ``finish`` (validation runs first)."""


class RefitScheduler:
    """The transfers of one overlapped training attempt (module docstring)."""

    def __init__(self, engines: TransferEngines, policy: PolicyGroup, stream: Stream) -> None:
        self._engines = engines
        self._policy = policy
        self._stream = stream
        self._lock = stream.lock
        # The version the submitted train step is making (and its hold), until submitted;
        # then the submitted transfer, until finish.
        self._armed: tuple[int, bool] | None = None
        self._started: ScheduledRefit | None = None

    @property
    def holds_requests(self) -> bool:
        """A transfer with validation after it is queued: no training request until then
        (read under the stream's lock)."""
        return self._started is not None and self._started.hold

    def poll(self) -> bool:
        """Submit the armed transfer if the engines are done with their current weights
        and the transfer would only be queued (called by the stream under its lock
        whenever the budget may have changed); True when it was submitted."""
        if self._armed is None or self._started is not None:
            return False
        if not (self._engines.queues_refits and self._stream.budget_met()):
            return False
        self._submit()
        return True

    def arm(self, version: int, *, hold: bool = False) -> None:
        """The train step just submitted makes ``version``'s weights; ``hold``: validation
        runs on them before any training request."""
        with self._lock:
            self._armed = (version, hold)
            self._stream.top_up()

    def start(self, version: int, *, hold: bool = False) -> ScheduledRefit:
        """The transfer to ``version``: the one already queued, or queue it now (and the
        stream's next request behind it unless ``hold``)."""
        with self._lock:
            self._stream.raise_error()
            if self._started is None:
                if self._armed is None:
                    self._armed = (version, hold)
                self._submit()
                self._stream.top_up()
            return self._checked(version)

    def start_early(self, version: int, *, hold: bool = False) -> ScheduledRefit | None:
        """``start`` while the policy still trains: None, and nothing submitted, while the
        engines still have work at their current version (they would rather keep
        generating with it, K >= 2, than wait behind the transfer)."""
        with self._lock:
            self._stream.raise_error()
            if self._started is None:
                if self._armed is None:
                    self._armed = (version, hold)
                if not (self._engines.queues_refits and self._stream.budget_met()):
                    return None
                self._submit()
                self._stream.top_up()
            return self._checked(version)

    def _checked(self, version: int) -> ScheduledRefit:
        assert self._started is not None
        assert self._started.version == version, "a refit to another version is queued"
        return self._started

    def finish(
        self, refit: ScheduledRefit, then: Callable[[], dict[str, float]] | None = None
    ) -> dict[str, float]:
        """Wait for a started transfer; run ``then`` (validation) on the new weights before
        the engines generate anything else if the refit holds requests."""
        try:
            metrics = {"timing/refit_s": refit.transfer.finish()}
            if then is not None:
                metrics.update(then())
        finally:
            with self._lock:
                self._started = None
                self._stream.top_up()
        return metrics

    def _submit(self) -> None:
        """Submit the armed transfer (under the lock, so no request is submitted between
        its calls: the queue order on every engine is the version order)."""
        assert self._armed is not None
        version, hold = self._armed
        self._armed = None
        self._started = ScheduledRefit(self._engines.start_refit(self._policy), version, hold)
        self._stream.switch_version(version)
