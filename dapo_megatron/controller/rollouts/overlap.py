"""The overlapped loop's schedule (``rollout.max_staleness = K >= 1``), in one object.

The engines keep generating while the policy trains. Three things then depend on each
other, and ``OverlapSchedule`` holds all of them; the first two under one lock, ``lock``,
which the rollout stream's generation thread takes too:

- the request budget: the engines' version w (the weights a request submitted now is
  generated with) and the step the stream fills next. Data generated at version w can
  train steps w .. w + K, so the stream keeps ``(w + K + 1 - next_step)`` steps' groups
  coming (controller/rollouts/rollout_stream.py has the sizing);
- the refit: armed once the train step that makes the next weights is submitted, started
  (the transfer queued on every engine) once the engines have nothing left to generate
  with their current weights, finished by the loop;
- the next step, taken early: its batch, taken while this step trains, and its train step,
  queued behind the refit so the policy goes from one step to the next without a
  controller round trip. Only the training thread touches these two (no lock: it must not
  block the generation thread while it submits to the policy).

Ray runs one submitter's calls to an actor in order (docs.ray.io, "Actor Task Execution
Order"), so the policy ranks send as soon as their queued train step is done, each engine
receives as soon as the requests queued before it are finished, and the request the
stream submits next, right behind the receive, is generated with the new weights. Every
submission, requests and transfers alike, is made under the lock, so the queue order on
each engine is the version order (docs/ARCHITECTURE.md, "The refit").

One step s of the loop (controller/loop.py ``_overlapped_steps``), event by event:
``batch(s)`` (taken early, or now), ``train(batch, s)`` (submitted, unless queued already),
``arm(s + 1)`` (the transfer may be queued as soon as the budget at version s is met),
``take_next(s + 1)`` (the next batch; the refit started early and the next train step
queued behind it when the engines are done), ``train_result()``, ``refit(s + 1)`` (queued
now if not yet, waited for, validation on the new weights before any request).
The stream's events: ``filling(s)``/``filled(s)`` around its ``take``, ``poll()`` whenever
the budget may have changed, ``request_size()``.
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
    """What the schedule needs of the rollout stream (RolloutStream): its batches, what it
    has drawn and not yet given to dynamic sampling (``pending``: (version, prompts) per
    request; ``idle``: none), and ``top_up`` (submit what the budget allows now)."""

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
    version: int
    """The policy version the engines hold once it is done."""
    hold: bool
    """No request is submitted until ``finish`` (validation runs first)."""


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
        """The engines hold ``version``'s weights, and the step trained at ``version`` is
        the next one the stream fills."""
        self._ctx = ctx
        self._engines = engines
        self._policy = policy
        self._stream = stream
        self._k = ctx.config.rollout.max_staleness
        self.lock = threading.Condition()
        """Held for every submission (requests and transfers) and every budget decision."""
        # The request budget.
        self.engine_version = version
        self.next_step = version
        self.waiting = False  # the loop waits in the stream's take for ``next_step``
        # The refit: the version the submitted train step is making (and its hold), until
        # submitted; then the submitted transfer, until finish.
        self._armed: tuple[int, bool] | None = None
        self._started: ScheduledRefit | None = None
        # The training thread's: the next step's batch taken early, its train step queued
        # behind the refit, and the train step running now.
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
        """Submit the train step of ``step`` (after the passes its batch needs), unless it
        was queued behind the refit already; the passes' metrics."""
        if self._queued is not None:
            self._training, self._queued = self._queued, None
            return {"timing/logprob_s": 0.0}  # queued only when no pass is needed
        metrics = steps.passes_before_training(self._ctx, self._policy, taken.batch)
        self._training = steps.start_train(self._ctx, self._policy, taken.batch, step)
        return metrics

    def take_next(self, version: int) -> None:
        """While the policy trains: take the batch of step ``version``; when the engines
        are done with their current weights, start the refit to ``version`` and queue the
        batch's train step behind it."""
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
        """A batch taken for the next step, or its queued train step, exists: a checkpoint
        now would miss it."""
        return self._next is not None or self._queued is not None

    def _queue_training(self, prepared: steps.Prepared, step: int) -> steps.PendingTrain | None:
        """The train step of ``step``, submitted now (it runs after the refit submitted
        before it) when its batch needs no pass first; else None (``train`` runs the
        passes, then submits it)."""
        config = self._ctx.config
        if config.dapo.loss.kl_coef > 0 or steps.needs_old_logprobs(config, prepared.batch):
            return None
        return steps.start_train(self._ctx, self._policy, prepared.batch, step)

    # ------------------------------------------------------------------- the refit

    @property
    def holds_requests(self) -> bool:
        """A transfer with validation after it is queued: no training request until then
        (read under the lock)."""
        return self._started is not None and self._started.hold

    def arm(self, version: int, *, hold: bool = False) -> None:
        """The train step just submitted makes ``version``'s weights; ``hold``: validation
        runs on them before any training request."""
        with self.lock:
            self._armed = (version, hold)
            self._stream.top_up()

    def poll(self) -> bool:
        """Submit the armed transfer if the engines are done with their current weights
        and the transfer would only be queued (the stream calls it under the lock whenever
        the budget may have changed); True when it was submitted."""
        if self._armed is None or self._started is not None:
            return False
        if not (self._engines.queues_refits and self.budget_met()):
            return False
        self._submit()
        return True

    def start(self, version: int, *, hold: bool = False) -> ScheduledRefit:
        """The transfer to ``version``: the one already queued, or queue it now (and the
        stream's next request behind it unless ``hold``)."""
        refit = self._start(version, hold, early=False)
        assert refit is not None
        return refit

    def start_early(self, version: int, *, hold: bool = False) -> ScheduledRefit | None:
        """``start`` while the policy still trains: None, and nothing submitted, while the
        engines still have work at their current version (they would rather keep
        generating with it, K >= 2, than wait behind the transfer)."""
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
        """Wait for a started transfer; run ``then`` (validation) on the new weights before
        the engines generate anything else if the refit holds requests."""
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
        """Submit the armed transfer (under the lock, so no request is submitted between
        its calls); requests submitted from now on are generated with its weights."""
        assert self._armed is not None
        version, hold = self._armed
        self._armed = None
        self._started = ScheduledRefit(self._engines.start_refit(self._policy), version, hold)
        self.engine_version = version

    # ------------------------------------------------------------ the request budget

    def filling(self, step: int) -> None:
        """The stream's ``take`` of ``step`` starts (under the lock): the budget counts
        from it, and a step that waits with nothing coming gets a request."""
        self.next_step, self.waiting = step, True

    def filled(self, step: int) -> None:
        """The batch of ``step`` is out, or its take failed (under the lock): the next
        step enters the budget."""
        self.next_step, self.waiting = step + 1, False

    def request_size(self) -> int:
        """Prompts of the stream's next request at the engines' version (0 = none now;
        ``RolloutPlanner.request_size`` adds the headroom over the shortfall)."""
        if self.holds_requests:
            return 0
        planner = self._stream.planner
        keep = planner.keep_estimate()
        return planner.request_size(self._deficit(keep), keep)

    def budget_met(self) -> bool:
        """Nothing is left to generate with the engines' current weights (under the lock)."""
        return self._deficit(self._stream.planner.keep_estimate()) <= 1e-6

    def _deficit(self, keep: float) -> float:
        """Groups the budget still lacks at the engines' version."""
        dynamic = self._ctx.dynamic
        steps_ahead = self.engine_version + self._k + 1 - self.next_step
        deficit = steps_ahead * dynamic.num_prompts_per_step - self._expected_groups(keep)
        if self.waiting and self._stream.idle():
            deficit = max(deficit, dynamic.num_prompts_per_step - dynamic.num_kept_groups, 1)
        return deficit

    def _expected_groups(self, keep: float) -> float:
        """Groups the budget counts: groups kept for the next step, carried groups, and
        those expected at keep rate ``keep`` from prompts drawn but not yet given to dynamic
        sampling.

        Data of version v trains steps up to v + K only, so each version counts up to the
        slots left in the steps it can still fill: a surplus beyond the last of them (or
        data already too old for the next step) will be dropped, and budgeting it as if
        it could wait would leave a later step short. Carried groups age the same way: at
        K = 1 the surplus of one step is too old for the step after the next, and counting
        it there left that step to wait for a whole request with the next weights."""
        dynamic = self._ctx.dynamic
        by_version: dict[int, float] = {}
        for version, prompts in self._stream.pending():
            by_version[version] = by_version.get(version, 0.0) + prompts * keep
        for version in dynamic.carried_versions:
            by_version[version] = by_version.get(version, 0.0) + 1.0
        # Kept groups are the next step's already (carried in, or new and fresh enough).
        filled = float(dynamic.num_kept_groups)
        for version in sorted(by_version):
            slots = (version + self._k + 1 - self.next_step) * dynamic.num_prompts_per_step
            filled = max(filled, min(slots, filled + by_version[version]))
        return filled
