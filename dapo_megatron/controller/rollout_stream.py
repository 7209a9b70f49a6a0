"""Overlapped rollouts (``rollout.max_staleness = K >= 1``): engines generate while the
policy trains.

A background thread keeps one generation request in flight on the split-mode engines
(spread over them), scores each request as it completes and queues its groups, tagged with
the policy version of the weights that generated them. The training loop takes a batch per
step (``take``): groups are fed to dynamic sampling as they arrive, and a group more than K
versions behind the step is dropped (counted) or its prompt generated again
(``rollout.stale_groups``). The dynamic sampler's carry cache applies the same bound to
carried groups: one mechanism.

How much is generated ahead: data generated at engine version w can train steps w .. w+K,
so the budget is ``(w + K + 1 - next_step)`` steps' groups, counting the kept groups not
yet trained and the groups expected (at the running keep rate) from prompts drawn but not
yet filtered. When that falls short, the next request asks for the shortfall over the keep
rate plus two binomial standard deviations (``_prompts_for``), capped by
``prompts_per_request``: a keep rate of 0.3 draws ~3.3x the prompts, and requests shrink
near the end of a step instead of overshooting it (a surplus more than K versions old is
lost). A step that waits with nothing coming always gets a request for what it lacks.

Weight updates happen between requests: ``refit`` stops new submissions, lets the request
in flight FINISH (its samples are kept, tagged with the old version), then refits and
resumes. The cost is the trainer waiting for the rest of that one request (reported as
``timing/refit_wait_s``). At K = 1 there is usually none: the budget closes once the
next step's groups are generated, before the trainer finishes; larger K (or a smaller
``prompts_per_request``) trades more requests for shorter waits. Aborting and
resubmitting would waste the partial generation instead, and the megatron backend cannot
abort mid-request.

Ordering: the refit is submitted only after the request in flight has returned, so no
engine ever generates a request with weights other than the version it is tagged with.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingStats
from dapo_megatron.controller import steps
from dapo_megatron.controller.context import RunContext, round_seed
from dapo_megatron.controller.policy_group import PolicyGroup
from dapo_megatron.controller.rollout import RolloutGroup
from dapo_megatron.generation.base import Sample, SamplingParams

# How often a waiting call wakes to look for an error of the generation thread.
_POLL_S = 0.5
# Seeds of overlapped requests live apart from the synchronous rounds' (round_seed).
_REQUEST_SEED_OFFSET = 20_000
# The lowest keep rate the budget plans for: below it a step waits for top-up requests
# rather than the stream drawing ever more prompts ahead.
_MIN_KEEP = 0.05
# Standard deviations of the keep count a request plans for (~2% of steps come up short).
_HEADROOM_SD = 2.0


def _prompts_for(groups: float, keep: float) -> float:
    """Prompts to draw for ``groups`` kept groups at keep rate ``keep``: the expected number
    plus ``_HEADROOM_SD`` standard deviations of the binomial keep count, so that a step is
    rarely short. Unlike a synchronous round's headroom (``batch_multiplier: auto``) this
    stays small: a surplus more than K versions old is lost, while a short step only waits
    for one more (small) request."""
    expected = groups / keep
    return expected + _HEADROOM_SD * math.sqrt(expected * keep * (1.0 - keep)) / keep


class StreamEngines(Protocol):
    """What the stream needs of split-mode engines (GenerationGroup)."""

    def submit(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Any]: ...

    def results(self, refs: Sequence[Any]) -> list[list[Sample]]: ...

    def refit(self, policy: PolicyGroup) -> float: ...

    def refit_metrics(self) -> dict[str, float]: ...


@dataclass
class _Request:
    prompt_indices: list[int]
    version: int
    refs: list[Any]
    submitted: float


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
        *,
        version: int,
        pending_prompts: Sequence[int] = (),
    ) -> None:
        """Start generating for the step trained at ``version`` (the engines hold that
        version's weights); ``pending_prompts`` (from a checkpoint) are generated first."""
        config = ctx.config
        self.ctx = ctx
        self.engines = engines
        self.max_staleness = config.rollout.max_staleness
        self.regenerate = config.rollout.stale_groups == "regenerate"
        # None: no cap, a request is the budget's whole shortfall (about a step's prompts).
        self.request_size: int | None = config.rollout.prompts_per_request
        self._cond = threading.Condition()
        self._completed: deque[_Completed] = deque()
        self._retry: deque[int] = deque(int(i) for i in pending_prompts)
        self._in_flight: _Request | None = None
        self._scoring = 0  # prompts of a finished request being scored
        self._in_hand = 0  # prompts of a popped request not yet given to dynamic sampling
        self._paused = False
        self._stopping = False
        self._error: BaseException | None = None
        self._engine_version = version
        self._next_step = version
        self._waiting = False
        self._requests = 0
        self._busy_s = 0.0  # engine time with a request in flight, cumulative
        self._thread = threading.Thread(target=self._run, name="rollout-stream", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ generation thread

    def _keep_estimate(self) -> float:
        """Expected share of prompts that yield a kept group: the dynamic sampler's running
        keep rate (before any step, its multiplier's guess), at least ``_MIN_KEEP``."""
        dynamic = self.ctx.dynamic
        if not dynamic.enabled:
            return 1.0
        ema = dynamic.keep_rate_ema
        keep = ema if ema is not None else dynamic.num_prompts_per_step / dynamic.round_prompts()
        return max(keep, _MIN_KEEP)

    def _expected_groups(self, keep: float) -> float:
        """Kept groups not yet trained on, or expected from prompts drawn but not yet given
        to dynamic sampling (in flight, being scored, queued, in the training thread's
        hand) at keep rate ``keep``."""
        dynamic = self.ctx.dynamic
        in_flight = len(self._in_flight.prompt_indices) if self._in_flight else 0
        queued = sum(len(c.prompt_indices) for c in self._completed)
        drawn = in_flight + self._scoring + queued + self._in_hand
        return dynamic.num_carried_groups + dynamic.num_kept_groups + drawn * keep

    def _next_request_size(self) -> int:
        """Prompts of the next request (0 = none now).

        The budget is ``(w + K + 1 - next_step)`` steps' groups; when the groups expected
        fall short of it, a request asks for the shortfall (``_prompts_for``: with a
        little headroom), up to ``prompts_per_request``. So requests shrink near the end
        of a step instead of overshooting it. A step that waits with nothing coming asks
        for the groups it still lacks, whatever the budget.
        """
        if self._stopping or self._paused or self._in_flight is not None:
            return 0
        dynamic = self.ctx.dynamic
        keep = self._keep_estimate()
        steps_ahead = self._engine_version + self.max_staleness + 1 - self._next_step
        deficit = steps_ahead * dynamic.num_prompts_per_step - self._expected_groups(keep)
        if self._waiting and not (self._completed or self._scoring or self._in_hand):
            deficit = max(deficit, dynamic.num_prompts_per_step - dynamic.num_kept_groups, 1)
        if deficit <= 1e-6:
            return 0
        size = max(1, math.ceil(_prompts_for(deficit, keep) - 1e-6))
        return size if self.request_size is None else min(self.request_size, size)

    def _can_submit(self) -> bool:
        return self._next_request_size() > 0

    def _start_request(self, size: int) -> _Request:
        """Draw the next ``size`` prompts and submit them (under the lock)."""
        ctx, config = self.ctx, self.ctx.config
        indices = [self._retry.popleft() for _ in range(min(size, len(self._retry)))]
        if len(indices) < size:
            indices += ctx.sampler.next_indices(size - len(indices))
        sampling = SamplingParams.from_generation_config(
            config.generation,
            n=config.dapo.num_generations_per_prompt,
            eos_token_ids=ctx.eos_ids,
            seed=round_seed(
                config.run.seed, self._engine_version, _REQUEST_SEED_OFFSET + self._requests
            ),
        )
        self._requests += 1
        refs = self.engines.submit([ctx.train.input_ids[i] for i in indices], sampling)
        self._in_flight = _Request(indices, self._engine_version, refs, time.perf_counter())
        return self._in_flight

    def _top_up(self) -> None:
        """Submit the next request if the budget allows (under the lock). Called by whichever
        thread changes what the budget depends on, so a refit or a waiting step submits at
        once rather than when the generation thread next runs."""
        size = self._next_request_size()
        if size:
            self._start_request(size)
            self._cond.notify_all()

    def _run(self) -> None:
        """Wait for the request in flight, queue its scored groups; repeat."""
        try:
            while True:
                with self._cond:
                    while not self._stopping and self._in_flight is None:
                        self._top_up()
                        if self._in_flight is None:
                            self._cond.wait(_POLL_S)
                    if self._stopping:
                        return
                    current = self._in_flight
                    assert current is not None
                samples = self.engines.results(current.refs)
                finished = time.perf_counter()
                with self._cond:
                    self._busy_s += finished - current.submitted
                    self._in_flight = None
                    self._scoring = len(current.prompt_indices)
                    # The next request starts before this one is scored: the engines do
                    # not wait for the verifier.
                    self._top_up()
                    self._cond.notify_all()
                groups, metrics = steps.score_groups(
                    self.ctx, self.ctx.train, current.prompt_indices, samples, current.version
                )
                metrics["timing/generate_s"] = finished - current.submitted
                metrics["num_generated_tokens"] = float(
                    sum(s.response_length for g in samples for s in g)
                )
                with self._cond:
                    self._completed.append(
                        _Completed(current.prompt_indices, current.version, groups, metrics)
                    )
                    self._scoring = 0
                    self._cond.notify_all()
        except BaseException as error:  # noqa: BLE001 - handed to the training thread
            with self._cond:
                self._error = error
                self._in_flight = None
                self._scoring = 0
                self._cond.notify_all()

    # -------------------------------------------------------------------- training thread

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _pop(self) -> _Completed:
        """The oldest completed request; tops up before waiting (consuming, or dropping a
        stale request, changes the budget, and the generation thread only re-checks it
        when woken)."""
        with self._cond:
            while not self._completed:
                self._raise_error()
                self._top_up()
                if not self._completed:
                    self._cond.wait(_POLL_S)
            item = self._completed.popleft()
            self._in_hand = len(item.prompt_indices)
            return item

    def _release(self, regenerate: Sequence[int] = ()) -> None:
        """The popped request is counted by dynamic sampling now (or dropped as stale):
        the generation thread may re-check its budget."""
        with self._cond:
            self._in_hand = 0
            self._retry.extend(regenerate)
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
            self._next_step, self._waiting = step, True
            self._top_up()
        try:
            while not dynamic.is_complete():
                item = self._pop()
                if dynamic.is_stale(item.version):
                    stale += len(item.groups)
                    self._release(item.prompt_indices if self.regenerate else ())
                    continue
                for key, value in item.metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
                scores = torch.tensor([g.scores for g in item.groups])
                rewards = torch.tensor([g.rewards for g in item.groups])
                try:
                    with self._cond:
                        dynamic.add_round(item.groups, scores, rewards, version=item.version)
                finally:
                    self._release()
        except BaseException:
            with self._cond:
                self._next_step, self._waiting = step + 1, False
                self._cond.notify_all()
            raise
        with self._cond:  # the batch leaves the budget as the next step enters it
            groups, stats = dynamic.finish_step()
            self._next_step, self._waiting = step + 1, False
            self._cond.notify_all()
        totals["rollout/stale_groups_dropped"] = float(stale)
        return groups, stats, totals

    def _pause(self) -> float:
        """Stop submitting and let the request in flight finish; returns the seconds waited."""
        started = time.perf_counter()
        with self._cond:
            self._paused = True
            while self._in_flight is not None or self._scoring:
                self._raise_error()
                self._cond.wait(_POLL_S)
            self._raise_error()
        return time.perf_counter() - started

    def _resume(self, version: int | None = None) -> None:
        with self._cond:
            if version is not None:
                self._engine_version = version
            self._paused = False
            self._top_up()
            self._cond.notify_all()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Engines idle (nothing in flight, nothing being scored): validate or save."""
        self._pause()
        try:
            yield
        finally:
            self._resume()

    def refit(
        self,
        policy: PolicyGroup,
        version: int,
        then: Callable[[], dict[str, float]] | None = None,
    ) -> dict[str, float]:
        """Give the engines the weights of ``version`` between two requests, and run
        ``then`` (validation) on them before the next request: one pause for both, so
        validation never waits for a request submitted just after the refit."""
        waited = self._pause()
        try:
            metrics = {"timing/refit_s": self.engines.refit(policy), "timing/refit_wait_s": waited}
            if then is not None:
                metrics.update(then())
        finally:
            self._resume(version)
        return metrics

    def engine_busy_s(self) -> float:
        """Cumulative engine time with a request in flight."""
        with self._cond:
            busy = self._busy_s
            if self._in_flight is not None:
                busy += time.perf_counter() - self._in_flight.submitted
            return busy

    def state(self) -> dict[str, Any]:
        """For a checkpoint (while paused): the prompts drawn but not trained on. Their
        samples are not saved; a resumed run generates them again with its own weights."""
        with self._cond:
            pending = [i for c in self._completed for i in c.prompt_indices]
            return {"pending_prompts": pending + list(self._retry)}

    def close(self) -> None:
        """Stop submitting. A request in flight is abandoned with the engines (the thread
        is a daemon and ends when its wait returns or fails)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=0.1)
