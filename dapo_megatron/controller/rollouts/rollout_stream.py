"""Overlapped rollouts (``rollout.max_staleness = K >= 1``): engines generate while the
policy trains.

A background thread keeps generation requests in flight on the split-mode engines (spread
over them; at most one per weight version), scores each request as it completes and
queues its groups, tagged with the policy version of the weights that generated them. The
training loop takes a batch per step (``take``): groups are fed to dynamic sampling as
they arrive, and a group more than K versions behind the step is dropped (counted) or its
prompt generated again (``rollout.stale_groups``). The dynamic sampler's carry cache
applies the same bound to carried groups: one mechanism.

How much is generated ahead: data generated at engine version w can train steps w .. w+K,
so the budget is ``(w + K + 1 - next_step)`` steps' groups, counting the kept and carried
groups not yet trained and the groups expected (at the running keep rate) from prompts
drawn but not yet filtered, each only for the steps its version can still train. When
that falls short, the next request asks for the shortfall over the keep rate plus two
binomial standard deviations, capped by ``prompts_per_request``
(``RolloutPlanner.request_size``): a keep rate of 0.3 draws ~3.3x the prompts, and
requests shrink near the end of a step instead of overshooting it (a surplus more than K
versions old is lost). A step that waits with nothing coming always gets a request for
what it lacks.

The budget, the engines' version and when a transfer is queued (weight updates happen
between requests, pipelined) are the ``OverlapSchedule``'s (controller/rollouts/overlap.py), which
the stream tells what it has drawn and asks how much to draw next. Requests are never aborted: in-flight work is finished, and aborting would waste
the partial generation (the megatron backend cannot abort mid-request).

Ordering: every submission (requests, the transfer) is made under the stream's lock, so
the queue order on each engine is the version order: no engine generates a request with
weights other than the version it is tagged with. A request submitted behind a refit may
wait there for the trainer, so the engines' busy time is their own
(``GenerationGroup.timed_results``), not the time since submission.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingStats
from dapo_megatron.controller.actors.policy_group import PolicyGroup
from dapo_megatron.controller.context import RunContext
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.overlap import OverlapSchedule, TransferEngines
from dapo_megatron.controller.rollouts.response_cap import capped
from dapo_megatron.controller.rollouts.rollout_groups import RolloutGroup
from dapo_megatron.controller.rollouts.rollout_planner import RolloutPlanner
from dapo_megatron.shared.sampling import Sample, SamplingParams

# How often a waiting call wakes to look for an error of the generation thread.
_POLL_S = 0.5


class StreamEngines(TransferEngines, Protocol):
    """What the stream and its overlap schedule need of split-mode engines
    (GenerationGroup)."""

    def submit(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Any]: ...

    def timed_results(self, refs: Sequence[Any]) -> tuple[list[list[Sample]], float]: ...


@dataclass
class _Request:
    prompt_indices: list[int]
    version: int
    refs: list[Any]


@dataclass
class _Completed:
    prompt_indices: list[int]
    version: int
    groups: list[RolloutGroup]
    metrics: dict[str, float]


class RolloutStream:
    """The overlapped rollout source of one training attempt (module docstring)."""

    def __init__(
        self,
        ctx: RunContext,
        engines: StreamEngines,
        policy: PolicyGroup,
        *,
        version: int,
        pending_prompts: Sequence[int] = (),
    ) -> None:
        """Start generating for the step trained at ``version`` (the engines hold that
        version's weights); ``pending_prompts`` (from a checkpoint) are generated first.
        ``schedule`` holds the budget and the transfers of ``policy``'s new weights into the
        engines."""
        config = ctx.config
        self.ctx = ctx
        self.engines = engines
        self.planner = RolloutPlanner(ctx, pending_prompts=pending_prompts)
        self.max_staleness = config.rollout.max_staleness
        self.regenerate = config.rollout.stale_groups == "regenerate"
        self.schedule = OverlapSchedule(ctx, engines, policy, self, version=version)
        self._cond = self.schedule.lock
        self._completed: deque[_Completed] = deque()
        self._in_flight: deque[_Request] = deque()  # in engine queue order
        self._scoring: _Request | None = None  # a finished request being scored
        self._in_hand: _Completed | None = None  # popped, not yet given to dynamic sampling
        self._paused = False
        self._stopping = False
        self._error: BaseException | None = None
        self._busy_s = 0.0  # the engines' own generation seconds, cumulative
        self._thread = threading.Thread(target=self._run, name="rollout-stream", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ generation thread

    def pending(self) -> list[tuple[int, int]]:
        """(version, prompts) of the requests drawn and not yet given to dynamic sampling:
        in flight, being scored, queued, in the training thread's hand (under the lock)."""
        pending: list[_Request | _Completed] = [*self._in_flight, *self._completed]
        pending += [r for r in (self._scoring, self._in_hand) if r is not None]
        return [(r.version, len(r.prompt_indices)) for r in pending]

    def idle(self) -> bool:
        """Nothing in flight, being scored, queued or in hand (under the lock)."""
        nothing_coming = not (self._in_flight or self._completed)
        return nothing_coming and self._scoring is None and self._in_hand is None

    def _next_request_size(self) -> int:
        """Prompts of the next request (0 = none now): the schedule's budget shortfall at
        the engines' version (``OverlapSchedule.request_size``), one request per version in
        flight, none while paused or stopping."""
        if self._stopping or self._paused:
            return 0
        version = self.schedule.engine_version
        if any(r.version == version for r in self._in_flight):
            return 0  # one request per version in flight: the next is sized on its results
        return self.schedule.request_size()

    def _start_request(self, size: int) -> _Request:
        """Draw the next ``size`` prompts and submit them (under the lock)."""
        version = self.schedule.engine_version
        draw = self.planner.next_request(size, version)
        indices = draw.prompt_indices
        prompts = [self.ctx.train.input_ids[i] for i in indices]
        refs = self.engines.submit(prompts, capped(self.ctx.config, draw.sampling, prompts))
        request = _Request(indices, version, refs)
        self._in_flight.append(request)
        return request

    def top_up(self) -> None:
        """Submit the next request if the budget allows (under the lock). Called by whichever
        thread changes what the budget depends on, so a refit or a waiting step submits at
        once rather than when the generation thread next runs."""
        self._submit_next()
        if self.schedule.poll():  # the engines are done with their weights: transfer queued
            self._submit_next()  # queued behind the transfer: the new weights
        self._cond.notify_all()

    def _submit_next(self) -> None:
        size = self._next_request_size()
        if size:
            self._start_request(size)

    def _run(self) -> None:
        """Wait for the oldest request in flight, queue its scored groups; repeat."""
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._in_flight:
                        self.top_up()
                        if not self._in_flight:
                            self._cond.wait(_POLL_S)
                    if self._stopping:
                        return
                    current = self._in_flight[0]
                samples, seconds = self.engines.timed_results(current.refs)
                with self._cond:
                    self._busy_s += seconds
                    self._in_flight.popleft()
                    self._scoring = current
                    # The next request starts before this one is scored: the engines do
                    # not wait for the verifier.
                    self.top_up()
                    self._cond.notify_all()
                groups, metrics = steps.score_groups(
                    self.ctx, self.ctx.train, current.prompt_indices, samples, current.version
                )
                metrics["timing/generate_s"] = seconds
                metrics["num_generated_tokens"] = float(
                    sum(s.response_length for g in samples for s in g)
                )
                with self._cond:
                    self._completed.append(
                        _Completed(current.prompt_indices, current.version, groups, metrics)
                    )
                    self._scoring = None
                    self._cond.notify_all()
        except BaseException as error:  # noqa: BLE001 - handed to the training thread
            with self._cond:
                self._error = error
                self._in_flight.clear()
                self._scoring = None
                self._cond.notify_all()

    # -------------------------------------------------------------------- training thread

    def raise_error(self) -> None:
        """Re-raise a failure of the generation thread in the calling thread."""
        if self._error is not None:
            raise self._error

    def _pop(self) -> _Completed:
        """The oldest completed request; tops up before waiting (consuming, or dropping a
        stale request, changes the budget, and the generation thread only re-checks it
        when woken)."""
        with self._cond:
            while not self._completed:
                self.raise_error()
                self.top_up()
                if not self._completed:
                    self._cond.wait(_POLL_S)
            item = self._completed.popleft()
            self._in_hand = item
            return item

    def _release(self, regenerate: Sequence[int] = ()) -> None:
        """The popped request is counted by dynamic sampling now (or dropped as stale):
        the generation thread may re-check its budget."""
        with self._cond:
            self._in_hand = None
            self.planner.generate_again(regenerate)
            self._cond.notify_all()

    def take(self, step: int) -> tuple[list[RolloutGroup], DynamicSamplingStats, dict[str, float]]:
        """The batch of the step trained at policy version ``step``: completed groups, in
        completion order, through dynamic sampling until it is full (waiting for more when
        needed)."""
        dynamic = self.ctx.dynamic
        totals = {"timing/generate_s": 0.0, "timing/reward_s": 0.0, "num_generated_tokens": 0.0}
        stale = 0
        with self._cond:  # the generation thread sizes requests from the sampler's state
            dynamic.start_step(version=step)
            self.schedule.filling(step)
            self.top_up()
        try:
            while not dynamic.is_complete():
                item = self._pop()
                with self._cond:  # outcomes in completion order, stale ones included
                    self.planner.record(item.prompt_indices, item.groups, item.version)
                if dynamic.is_stale(item.version):
                    stale += len(item.groups)
                    self._release(item.prompt_indices if self.regenerate else ())
                    continue
                for key, value in item.metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
                try:
                    with self._cond:
                        self.planner.add(item.groups, item.version)
                finally:
                    self._release()
        except BaseException:
            with self._cond:
                self.schedule.filled(step)
                self._cond.notify_all()
            raise
        with self._cond:  # the batch leaves the budget as the next step enters it
            groups, stats = dynamic.finish_step()
            self.schedule.filled(step)
            self._cond.notify_all()
        totals["rollout/stale_groups_dropped"] = float(stale)
        with self._cond:  # the generation thread draws (decides) under the lock
            totals.update(self.ctx.skipper.end_step())
        return groups, stats, totals

    def _pause(self) -> float:
        """Stop submitting and let the request in flight finish; returns the seconds waited."""
        started = time.perf_counter()
        with self._cond:
            self._paused = True
            while self._in_flight or self._scoring is not None:
                self.raise_error()
                self._cond.wait(_POLL_S)
            self.raise_error()
        return time.perf_counter() - started

    def _resume(self) -> None:
        with self._cond:
            self._paused = False
            self.top_up()
            self._cond.notify_all()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Engines idle (nothing in flight, nothing being scored): validate or save."""
        self._pause()
        try:
            yield
        finally:
            self._resume()

    def engine_busy_s(self) -> float:
        """The engines' own seconds generating training rollouts, cumulative (a request
        counts when it completes)."""
        with self._cond:
            return self._busy_s

    def state(self) -> dict[str, Any]:
        """For a checkpoint (while paused): the prompts drawn but not trained on. Their
        samples are not saved; a resumed run generates them again with its own weights."""
        with self._cond:
            pending = [i for c in self._completed for i in c.prompt_indices]
            return {"pending_prompts": pending + self.planner.pending_prompts()}

    def close(self) -> None:
        """Stop submitting. A request in flight is abandoned with the engines (the thread
        is a daemon and ends when its wait returns or fails)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=0.1)
