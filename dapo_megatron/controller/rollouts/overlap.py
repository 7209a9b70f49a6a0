"""The overlapped loop's schedule (``rollout.max_staleness = K >= 1``), in one object.

The engines keep generating while the policy trains. ``OverlapSchedule`` holds three
interdependent things; the first two under one lock, ``lock``, which the rollout stream's
generation thread takes too:

- the request budget: the engines' version w (the weights a request submitted now is
  generated with) and the step the stream fills next. Data of version w trains steps
  w .. w + K, so the stream keeps ``(w + K + 1 - next_step)`` steps' groups coming
  (controller/rollouts/rollout_stream.py has the sizing);
- the refit: armed once the train step making the next weights is submitted, started (the
  transfer queued on every engine) once the engines have nothing left to generate with
  their current weights, finished by the loop;
- the next step, taken early: its batch, taken while this step trains, and its train step,
  queued behind the refit (no controller round trip between steps). Only the training
  thread touches these two, without the lock: submitting to the policy must not block the
  generation thread.

Ray runs one submitter's calls to an actor in order (docs.ray.io, "Actor Task Execution
Order"): the policy ranks send once their queued train step is done, each engine receives
once the requests queued before it are finished, and the stream's next request, right
behind the receive, gets the new weights. Every submission (requests and transfers) is made
under the lock, so each engine's queue order is the version order (docs/ARCHITECTURE.md,
"The refit").

Step s of the loop (controller/loop.py ``_overlapped_steps``): ``batch(s)`` (taken early,
or now), ``train(batch, s)`` (unless queued already), ``arm(s + 1)`` (the transfer may be
queued once the budget at version s is met), ``take_next(s + 1)`` (the next batch; the
refit started early and the next train step queued behind it when the engines are done),
``train_result()``, ``refit(s + 1)`` (queued now if not yet, waited for, validation on the
new weights before any request). The stream calls ``filling(s)``/``filled(s)`` around its
``take``, ``poll()`` whenever the budget may have changed, and ``request_size()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingStats
from dapo_megatron.controller.actors.policy_group import PolicyGroup
from dapo_megatron.controller.context import RunContext
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.rollout_groups import RolloutGroup
from dapo_megatron.controller.rollouts.rollout_planner import RolloutPlanner


class PendingTransfer(Protocol):
    """A submitted weight transfer (refitter.PendingRefit)."""

    def finish(self) -> float: ...


class TransferEngines(Protocol):
    """What the schedule needs of split-mode engines (GenerationGroup)."""

    def start_refit(self, policy: PolicyGroup) -> PendingTransfer: ...

    @property
    def queues_refits(self) -> bool:
        """Whether ``start_refit`` only submits calls (else it waits for the policy)."""
        ...


class Stream(Protocol):
    """What the schedule needs of RolloutStream: batches, ``pending`` ((version, prompts)
    per request not yet given to dynamic sampling; ``idle``: none) and ``top_up``."""

    planner: RolloutPlanner

    def take(
        self, step: int
    ) -> tuple[list[RolloutGroup], DynamicSamplingStats, dict[str, float]]: ...

    def pending(self) -> list[tuple[int, int]]: ...
    def idle(self) -> bool: ...
    def top_up(self) -> None: ...
    def raise_error(self) -> None: ...


@dataclass
class ScheduledRefit:
    """A transfer started by the schedule; pass it to ``finish``."""

    transfer: PendingTransfer
    version: int  # the policy version the engines hold once it is done
    hold: bool  # no request is submitted until ``finish`` (validation runs first)


class OverlapSchedule:
    """The overlapped loop's state of one training attempt (module docstring)."""

    def __init__(
        self,
        ctx: RunContext,
        engines: TransferEngines,
        policy: PolicyGroup,
        stream: Stream,
        *,
        version: int,
    ) -> None:
        """The engines hold ``version``'s weights; the stream fills step ``version`` next."""
        self._ctx = ctx
        self._engines = engines
        self._policy = policy
        self._stream = stream
        self._k = ctx.config.rollout.max_staleness
        self.lock = threading.Condition()
        """Held for every submission (requests and transfers) and every budget decision."""
        # The request budget (under the lock); ``waiting``: the loop waits in the stream's
        # take for ``next_step``.
        self.engine_version, self.next_step, self.waiting = version, version, False
        # The refit (under the lock): (version, hold) armed until submitted, then the
        # transfer until finish.
        self._armed: tuple[int, bool] | None = None
        self._started: ScheduledRefit | None = None
        # The training thread's only (no lock): the early batch, its queued train step, and
        # the train step running now.
        self._next: steps.Prepared | None = None
        self._queued: steps.PendingTrain | None = None
        self._training: steps.PendingTrain | None = None

    # ------------------------------------------------------------- the loop's events

    def batch(self, step: int) -> steps.Prepared:
        """The batch of ``step``: the one taken early, or take it now."""
        taken = self._next or steps.prepare(self._ctx, self._stream, step)
        self._next = None
        return taken

    def train(self, taken: steps.Prepared, step: int) -> dict[str, float]:
        """Submit the train step of ``step`` after its passes, unless queued already."""
        if self._queued is not None:
            self._training, self._queued = self._queued, None
            return {"timing/logprob_s": 0.0}  # queued only when no pass is needed
        metrics = steps.passes_before_training(self._ctx, self._policy, taken.batch)
        self._training = steps.start_train(self._ctx, self._policy, taken.batch, step)
        return metrics

    def take_next(self, version: int) -> None:
        """While the policy trains: take step ``version``'s batch; once the engines are
        done, start the refit to ``version`` and queue the batch's train step behind it."""
        self._next = steps.prepare(self._ctx, self._stream, version)
        if self.start_early(version) is not None:
            self._queued = self._queue_training(self._next, version)

    def train_result(self) -> dict[str, float]:
        """Wait for the running train step; its metrics."""
        training, self._training = self._training, None
        assert training is not None, "no train step submitted"
        return training.result()

    def refit(
        self, version: int, then: Callable[[], dict[str, float]] | None = None
    ) -> dict[str, float]:
        """The engines get ``version``'s weights: the transfer queued already, or queue it
        now (and the next batch's train step behind it); wait for it and run ``then``."""
        refit = self.start(version)
        if self._next is not None and self._queued is None:
            self._queued = self._queue_training(self._next, version)
        return self.finish(refit, then=then)

    @property
    def holds_next(self) -> bool:
        """The next step's batch or train step exists: a checkpoint now would miss it."""
        return self._next is not None or self._queued is not None

    def _queue_training(self, prepared: steps.Prepared, step: int) -> steps.PendingTrain | None:
        """The train step of ``step``, submitted now (behind the refit) if its batch needs
        no pass first; else None (``train`` runs the passes, then submits it)."""
        config = self._ctx.config
        if config.dapo.loss.kl_coef > 0 or steps.needs_old_logprobs(config, prepared.batch):
            return None
        return steps.start_train(self._ctx, self._policy, prepared.batch, step)

    # ------------------------------------------------------------------- the refit

    @property
    def holds_requests(self) -> bool:
        """A transfer with validation after it is queued: no request until then (lock)."""
        return self._started is not None and self._started.hold

    def arm(self, version: int, *, hold: bool = False) -> None:
        """The train step just submitted makes ``version``'s weights (``hold``: validate
        them before any training request)."""
        with self.lock:
            self._armed = (version, hold)
            self._stream.top_up()

    def poll(self) -> bool:
        """Submit the armed transfer if the engines are done with their weights and it
        would only be queued (called under the lock); True when submitted."""
        if self._armed is None or self._started is not None:
            return False
        if not (self._engines.queues_refits and self.budget_met()):
            return False
        self._submit()
        return True

    def start(self, version: int, *, hold: bool = False) -> ScheduledRefit:
        """The transfer to ``version``: already queued, or queue it now."""
        refit = self._start(version, hold, early=False)
        assert refit is not None
        return refit

    def start_early(self, version: int, *, hold: bool = False) -> ScheduledRefit | None:
        """``start`` while the policy trains: None (nothing submitted) while the engines
        still have work at their current version (K >= 2: better than waiting)."""
        return self._start(version, hold, early=True)

    def _start(self, version: int, hold: bool, *, early: bool) -> ScheduledRefit | None:
        with self.lock:
            self._stream.raise_error()
            if self._started is None:
                if self._armed is None:
                    self._armed = (version, hold)
                if early and not (self._engines.queues_refits and self.budget_met()):
                    return None
                self._submit()
                self._stream.top_up()
            started = self._started
            assert started is not None and started.version == version, "another refit queued"
            return started

    def finish(
        self, refit: ScheduledRefit, then: Callable[[], dict[str, float]] | None = None
    ) -> dict[str, float]:
        """Wait for a started transfer; run ``then`` (validation) on the new weights, before
        any request if the refit holds them."""
        try:
            metrics = {"timing/refit_s": refit.transfer.finish()}
            if then is not None:
                metrics.update(then())
        finally:
            with self.lock:
                self._started = None
                self._stream.top_up()
        return metrics

    def _submit(self) -> None:
        """Submit the armed transfer (under the lock: no request between its calls)."""
        assert self._armed is not None
        (version, hold), self._armed = self._armed, None
        self._started = ScheduledRefit(self._engines.start_refit(self._policy), version, hold)
        self.engine_version = version

    # ------------------------------------------------------------ the request budget

    def filling(self, step: int) -> None:
        """The stream's ``take`` of ``step`` starts (under the lock; see ``_deficit``)."""
        self.next_step, self.waiting = step, True

    def filled(self, step: int) -> None:
        """``step``'s take is done or failed (under the lock): the next enters the budget."""
        self.next_step, self.waiting = step + 1, False

    def request_size(self) -> int:
        """Prompts of the stream's next request at the engines' version (0 = none now)."""
        if self.holds_requests:
            return 0
        keep = (planner := self._stream.planner).keep_estimate()
        return planner.request_size(self._deficit(keep), keep)

    def budget_met(self) -> bool:
        """Nothing is left to generate with the engines' current weights (under the lock)."""
        return self._deficit(self._stream.planner.keep_estimate()) <= 1e-6

    def _deficit(self, keep: float) -> float:
        """Groups the budget still lacks at the engines' version (from ``next_step``; a step
        waiting with nothing coming gets a request)."""
        dynamic = self._ctx.dynamic
        steps_ahead = self.engine_version + self._k + 1 - self.next_step
        deficit = steps_ahead * dynamic.num_prompts_per_step - self._expected_groups(keep)
        if self.waiting and self._stream.idle():
            deficit = max(deficit, dynamic.num_prompts_per_step - dynamic.num_kept_groups, 1)
        return deficit

    def _expected_groups(self, keep: float) -> float:
        """Groups the budget counts: kept for the next step, carried, and expected at keep
        rate ``keep`` from prompts drawn but not yet given to dynamic sampling.

        Data of version v trains steps up to v + K only, so each version counts up to the
        slots left in the steps it can still fill: a surplus beyond them (or data too old
        for the next step) is dropped, and budgeting it would leave a later step short.
        Carried groups age alike: at K = 1 one step's surplus is too old for the step after
        the next, and counting it there made that step wait a whole request."""
        dynamic = self._ctx.dynamic
        by_version: dict[int, float] = {}
        for version, prompts in self._stream.pending():
            by_version[version] = by_version.get(version, 0.0) + prompts * keep
        for version in dynamic.carried_versions:
            by_version[version] = by_version.get(version, 0.0) + 1.0
        filled = float(dynamic.num_kept_groups)  # the next step's already
        for version in sorted(by_version):
            slots = (version + self._k + 1 - self.next_step) * dynamic.num_prompts_per_step
            filled = max(filled, min(slots, filled + by_version[version]))
        return filled
