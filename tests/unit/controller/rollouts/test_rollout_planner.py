"""The rollout planner both loops share: what is drawn, how much, with which seed, and where
an outcome goes; and max_gen_batches with one meaning in both loops (hand-derived counts)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingExhausted
from dapo_megatron.config.loader import load_config
from dapo_megatron.controller.context import round_seed
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.rollout_planner import (
    REQUEST_SEED_OFFSET,
    RolloutPlanner,
    prompts_for,
)
from dapo_megatron.shared.sampling import Sample
from unit.fake_context import fake_context

REPO = Path(__file__).resolve().parents[4]
N = 4


class Engines:
    """Every sample answers its prompt's token; rounds and their prompt counts recorded."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def generate(self, prompts, sampling):
        self.calls.append(len(prompts))
        return [[Sample([p[0]], [-0.5], "stop") for _ in range(sampling.n)] for p in prompts]


class Verifier:
    """Prompt i's group varies (one correct sample) when ``kept(i)``, else all wrong."""

    def __init__(self, kept) -> None:
        self.kept = kept

    def score_batch(self, texts, truths):
        scores = [float(self.kept(int(t)) and j % N == 0) for j, t in enumerate(truths)]
        return SimpleNamespace(scores=scores, metrics={})


def _ctx(kept, *overrides, num_prompts=200):
    plan = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        [
            f"dapo.num_generations_per_prompt={N}",
            "dapo.num_prompts_per_step=4",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8",
            "data.shuffle=false",
            "policy.model_name_or_path=/nonexistent/model",
            *overrides,
        ],
    ).require_plan()
    return fake_context(plan, num_prompts, Verifier(kept))


def test_a_synchronous_round_is_dynamic_samplings_round_drawn_in_order_with_its_seed():
    ctx = _ctx(lambda i: True, "dapo.dynamic_sampling.batch_multiplier=1.5")
    planner = RolloutPlanner(ctx)
    ctx.dynamic.start_step(version=3)
    draw = planner.next_round(step=3, round_index=2)
    assert draw.prompt_indices == list(range(6))  # ceil(1.5 * 4), unshuffled order
    assert not draw.continuation and draw.sampling.n == N
    assert draw.sampling.seed == round_seed(ctx.config.run.seed, 3, 2)
    assert draw.sampling.finish_after_fraction is None  # no tail cut configured


def test_the_tail_cut_draws_more_and_waits_for_what_the_keep_rate_needs():
    ctx = _ctx(
        lambda i: True,
        "rollout.abort_tail=true",
        "rollout.abort_tail_oversample=1.5",
        "dapo.dynamic_sampling.batch_multiplier=2.0",
    )
    planner = RolloutPlanner(ctx)
    ctx.dynamic.start_step(version=0)
    assert planner.next_round(0, 0).sampling.finish_after_fraction is None  # no keep rate yet
    ctx.dynamic._keep_rate_ema = 1.0  # every group kept: wait for exactly the 4 needed
    draw = planner.next_round(0, 1)
    assert len(draw.prompt_indices) == 6  # ceil(4 * 1.5)
    assert draw.sampling.finish_after_fraction == pytest.approx(4 / 6)


def test_pending_partials_make_the_next_round_a_continuation():
    ctx = _ctx(lambda i: True, "rollout.abort_tail=true", "rollout.partial_rollouts=true")
    planner = RolloutPlanner(ctx)
    planner.settle_cut([(5, [Sample([1], [-0.1], "abort")] * N)], version=0)
    ctx.dynamic.start_step(version=1)
    assert ctx.partials.pending and planner.next_round(1, 0).continuation


def test_a_cut_without_partial_rollouts_forgets_the_aborted_prompts():
    ctx = _ctx(lambda i: True, "rollout.abort_tail=true", "rollout.partial_rollouts=false")
    RolloutPlanner(ctx).settle_cut([(5, [Sample([1], [-0.1], "abort")] * N)], version=0)
    assert ctx.partials.pending == []


def test_a_request_draws_the_prompts_to_generate_again_first_with_its_own_seeds():
    ctx = _ctx(lambda i: True)
    planner = RolloutPlanner(ctx, pending_prompts=[50, 51])
    first = planner.next_request(3, version=2)
    assert first.prompt_indices == [50, 51, 0]
    planner.generate_again([60])
    assert planner.pending_prompts() == [60]
    second = planner.next_request(2, version=2)
    assert second.prompt_indices == [60, 1]
    seed = ctx.config.run.seed
    assert first.sampling.seed == round_seed(seed, 2, REQUEST_SEED_OFFSET)
    assert second.sampling.seed == round_seed(seed, 2, REQUEST_SEED_OFFSET + 1)


def test_request_size_is_the_shortfall_with_headroom_capped():
    ctx = _ctx(lambda i: True, "rollout.prompts_per_request=5")
    planner = RolloutPlanner(ctx)
    assert planner.request_size(0.0, 0.5) == 0
    assert planner.request_size(1.0, 0.5) == min(5, math.ceil(prompts_for(1.0, 0.5) - 1e-6))
    assert planner.request_size(8.0, 0.5) == 5  # the cap
    uncapped = RolloutPlanner(_ctx(lambda i: True))
    # 8 groups at keep 1/2: 16 expected, + 2 sd of the binomial count, sqrt(16 * 0.5 * 0.5)
    assert uncapped.request_size(8.0, 0.5) == math.ceil(prompts_for(8.0, 0.5) - 1e-6) > 16


def test_max_gen_batches_counts_prompts_in_full_rounds_in_the_synchronous_loop():
    # One prompt in four varies (kept). multiplier 2, 4 groups per step: a full round is 8
    # prompts, max_gen_batches=2 allows 16. Round 1: 8 prompts, 2 kept; round 2 asks for
    # ceil(2 * 2) = 4 prompts (1 kept); round 3: 12 < 16 generated, so it runs: 2 prompts
    # (prompt 12 kept: the step completes). Three rounds, within two full rounds of prompts;
    # counting rounds would have stopped after round 2.
    ctx = _ctx(
        lambda i: i % 4 == 0,
        "dapo.dynamic_sampling.batch_multiplier=2.0",
        "dapo.dynamic_sampling.max_gen_batches=2",
    )
    engines = Engines()
    groups, stats, _ = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=0)
    assert engines.calls == [8, 4, 2]
    assert stats.num_gen_batches == 3 and stats.num_prompts_generated == 14
    assert len(groups) == 4


def test_the_synchronous_loop_stops_once_the_full_rounds_of_prompts_are_spent():
    # No group varies: every round asks for a full round (8); two of them spend the budget.
    ctx = _ctx(
        lambda i: False,
        "dapo.dynamic_sampling.batch_multiplier=2.0",
        "dapo.dynamic_sampling.max_gen_batches=2",
    )
    engines = Engines()
    with pytest.raises(DynamicSamplingExhausted, match="16 prompts generated"):
        steps.collect_rollouts(RolloutPlanner(ctx), engines, step=0)
    assert engines.calls == [8, 8]
