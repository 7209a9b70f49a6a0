"""What the engines generate next, and where its outcome goes: one planner for both loops.

Both rollout sources ask the same questions of a step: which prompts to draw (the skip
rule, prompts to generate again first), how many (a synchronous round: the dynamic
sampler's round, less the tail cut; an overlapped request: the budget's shortfall at the
running keep rate), with which sampling parameters and seed, what to do with a cut round's
aborted groups (continue them, or forget them), and how a scored batch of groups reaches
dynamic sampling. The ``RolloutPlanner`` answers them once; the synchronous round
(``steps.collect_rollouts``) and the overlapped stream (controller/rollouts/rollout_stream.py) only
generate, score and wait.

The stream calls the planner under its lock (its generation thread draws while the
training thread adds groups); the synchronous loop has one thread.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dapo_megatron.algorithms.group_filter import prompts_for_kept
from dapo_megatron.controller.context import RunContext, round_seed
from dapo_megatron.controller.rollouts.rollout_groups import RolloutGroup
from dapo_megatron.shared.sampling import Sample, SamplingParams

# Seeds of overlapped requests live apart from the synchronous rounds' (round_seed).
REQUEST_SEED_OFFSET = 20_000
# The lowest keep rate an overlapped budget plans for: below it a step waits for top-up
# requests rather than the stream drawing ever more prompts ahead.
MIN_KEEP = 0.05
# Standard deviations of the keep count a request plans for (~2% of steps come up short).
HEADROOM_SD = 2.0


def prompts_for(groups: float, keep: float) -> float:
    """Prompts an overlapped request draws for ``groups`` kept groups at keep rate
    ``keep``: the expected number plus ``HEADROOM_SD`` standard deviations of the binomial
    keep count, so that a step is rarely short. Unlike a synchronous round's headroom
    (``batch_multiplier: auto``) this stays small: a surplus more than K versions old is
    lost, while a short step only waits for one more (small) request."""
    return prompts_for_kept(groups, keep, HEADROOM_SD)


def tail_cut(
    needed: int, keep_rate: float | None, count: int, oversample: float
) -> tuple[int, int]:
    """``rollout.abort_tail``: (prompts to draw, finished groups to wait for) of a round
    that needs ``needed`` kept groups and would draw ``count`` prompts uncut.

    The round waits for the groups that give ``needed`` kept ones at the running keep rate
    with 2 standard deviations of headroom (``prompts_for_kept``: a cut round rarely comes
    up short, which would cost a whole extra round), and draws ``oversample`` times as
    many prompts: the slowest of them are the tail that is cut. Before a keep rate is
    known the round is not cut."""
    if keep_rate is None or keep_rate <= 0.0:
        return count, count
    wait = max(1, math.ceil(prompts_for_kept(needed, keep_rate) - 1e-9))
    return max(wait, math.ceil(round(wait * oversample, 9))), wait


@dataclass(frozen=True)
class Draw:
    """One generation call the planner asks for."""

    prompt_indices: list[int]
    """Training prompts to generate, in order (empty for a continuation)."""
    sampling: SamplingParams
    """How: n samples per prompt, the seed, and (a cut round) ``finish_after_fraction``."""
    continuation: bool = False
    """The partial groups the last cut round aborted are continued instead (a round of
    their own: ``PartialRollouts.continue_all``)."""


class RolloutPlanner:
    """The decisions of rollout generation (module docstring), over one training attempt's
    samplers (``RunContext.reset_state`` replaces them: a planner per attempt)."""

    def __init__(self, ctx: RunContext, *, pending_prompts: Sequence[int] = ()) -> None:
        """``pending_prompts`` (drawn before a checkpoint, not trained) are drawn first."""
        config = ctx.config
        self.ctx = ctx
        self._retry: deque[int] = deque(int(i) for i in pending_prompts)
        self._requests = 0
        self._n = config.dapo.num_generations_per_prompt
        self._abort_tail = config.rollout.abort_tail
        self._oversample = config.rollout.abort_tail_oversample
        self._keep_partials = config.rollout.partial_rollouts
        # None: no cap, a request is the budget's whole shortfall (about a step's prompts).
        self._request_cap: int | None = config.rollout.prompts_per_request

    # ----------------------------------------------------------------------------- drawing

    def sampling(self, seed: int) -> SamplingParams:
        """The run's rollout sampling with ``seed``."""
        return SamplingParams.from_generation_config(
            self.ctx.config.generation, n=self._n, eos_token_ids=self.ctx.eos_ids, seed=seed
        )

    def draw(self, count: int) -> list[int]:
        """The next ``count`` prompts: those to generate again first, then the sampler's
        order less what the skip rule skips (``RunContext.draw_prompts``)."""
        indices = [self._retry.popleft() for _ in range(min(count, len(self._retry)))]
        if len(indices) < count:
            indices += self.ctx.draw_prompts(count - len(indices))
        return indices

    def generate_again(self, indices: Sequence[int]) -> None:
        """Prompts whose groups came too old to train: drawn first next time
        (``rollout.stale_groups: regenerate``)."""
        self._retry.extend(indices)

    def pending_prompts(self) -> list[int]:
        """Prompts waiting to be generated again (for a checkpoint)."""
        return list(self._retry)

    # ------------------------------------------------------------------------------ sizing

    def next_round(self, step: int, round_index: int) -> Draw:
        """The synchronous loop's next round of ``step``: the continuation of the groups the
        last cut round aborted when there are any, else dynamic sampling's round
        (``prompts_for_next_round``, which raises once ``max_gen_batches`` is spent), drawn
        larger and cut at the groups it needs with ``rollout.abort_tail``."""
        ctx = self.ctx
        sampling = self.sampling(round_seed(ctx.config.run.seed, step, round_index))
        if ctx.partials.pending:
            return Draw([], sampling, continuation=True)
        dynamic = ctx.dynamic
        count = dynamic.prompts_for_next_round()
        if self._abort_tail and dynamic.enabled:
            needed = dynamic.num_prompts_per_step - dynamic.num_kept_groups
            count, wait = tail_cut(needed, dynamic.keep_rate_ema, count, self._oversample)
            if wait < count:
                # A fraction: each engine (DP replica) cuts its own share of the prompts.
                sampling = dataclasses.replace(sampling, finish_after_fraction=wait / count)
        return Draw(self.draw(count), sampling)

    def keep_estimate(self) -> float:
        """Expected share of prompts that yield a kept group: the dynamic sampler's running
        keep rate (before any step, its multiplier's guess), at least ``MIN_KEEP``."""
        dynamic = self.ctx.dynamic
        if not dynamic.enabled:
            return 1.0
        ema = dynamic.keep_rate_ema
        keep = ema if ema is not None else dynamic.num_prompts_per_step / dynamic.round_prompts()
        return max(keep, MIN_KEEP)

    def request_size(self, deficit: float, keep: float) -> int:
        """Prompts of an overlapped request for ``deficit`` groups the budget lacks at keep
        rate ``keep`` (0: none), up to ``rollout.prompts_per_request``."""
        if deficit <= 1e-6:
            return 0
        size = max(1, math.ceil(prompts_for(deficit, keep) - 1e-6))
        return size if self._request_cap is None else min(self._request_cap, size)

    def next_request(self, size: int, version: int) -> Draw:
        """An overlapped request of ``size`` prompts, generated with the weights of policy
        ``version`` (its seed counts the requests of the attempt)."""
        seed = round_seed(self.ctx.config.run.seed, version, REQUEST_SEED_OFFSET + self._requests)
        self._requests += 1
        return Draw(self.draw(size), self.sampling(seed))

    # ------------------------------------------------------------------------------ outcome

    def record(
        self, prompt_indices: Sequence[int], groups: Sequence[RolloutGroup], version: int
    ) -> None:
        """Scored groups of ``prompt_indices`` (generated at ``version``) enter the skip
        rule's history, whether they are trained or not."""
        for index, group in zip(prompt_indices, groups, strict=True):
            self.ctx.skipper.record(index, group.scores, version)

    def settle_cut(self, aborted: Sequence[tuple[int, list[Sample]]], version: int) -> None:
        """The groups a cut round aborted (prompt, samples so far): kept for the next round
        (``rollout.partial_rollouts``) or forgotten (their prompts count as drawn)."""
        for index, samples in aborted:
            if self._keep_partials:
                self.ctx.partials.keep(index, samples, version)
            else:
                self.ctx.skipper.forget_pending(index)

    def add(self, groups: Sequence[RolloutGroup], version: int | None = None) -> None:
        """Scored groups to dynamic sampling (``version`` None: the step's own); raises
        ``DynamicSamplingExhausted`` once ``max_gen_batches`` rounds' worth is spent."""
        n = self._n
        scores = torch.tensor([g.scores for g in groups]).reshape(len(groups), n)
        rewards = torch.tensor([g.rewards for g in groups]).reshape(len(groups), n)
        self.ctx.dynamic.add_round(groups, scores, rewards, version=version)
