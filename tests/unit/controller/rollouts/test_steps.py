"""The controller's rollout phase with fake engines and verifier (no Ray, no Megatron)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingExhausted
from dapo_megatron.config.loader import load_config
from dapo_megatron.controller.context import RunContext
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.rollout_groups import build_policy_batch, make_groups
from dapo_megatron.controller.rollouts.rollout_planner import RolloutPlanner
from dapo_megatron.shared.sampling import Sample
from unit.fake_context import fake_context

REPO = Path(__file__).resolve().parents[4]
N = 4  # samples per prompt


class FakeEngines:
    """Answers prompt i with token 7 + (i % 3) for every sample; counts rounds."""

    def __init__(self):
        self.rounds = 0

    def generate(self, prompts, sampling):
        self.rounds += 1
        return [
            [Sample([7 + p[0] % 3, 2], [-0.5, -0.1], "stop") for _ in range(sampling.n)]
            for p in prompts
        ]


class FakeVerifier:
    """Scores sample j of each group: `pattern(prompt_token, j)`."""

    def __init__(self, pattern):
        self.pattern = pattern
        self.calls = []

    def score_batch(self, texts, truths):
        scores = [float(self.pattern(int(t), j % N)) for j, t in enumerate(truths)]
        self.calls.append(len(texts))
        return SimpleNamespace(scores=scores, metrics={"reward/num_timeouts": 0.0})


def _ctx(pattern, *overrides) -> tuple[RunContext, FakeEngines]:
    """A run context of 30 one-token prompts with a fake verifier, and fake engines."""
    plan = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        [
            f"dapo.num_generations_per_prompt={N}",
            "dapo.num_prompts_per_step=4",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8",
            "data.shuffle=false",
            *overrides,
        ],
    ).require_plan()
    return fake_context(plan, 30, FakeVerifier(pattern)), FakeEngines()


def test_all_equal_groups_exhaust_after_exactly_max_gen_batches_rounds():
    ctx, engines = _ctx(
        lambda prompt, j: 1.0,
        "dapo.dynamic_sampling.max_gen_batches=3",
        "dapo.dynamic_sampling.batch_multiplier=1.5",
    )
    with pytest.raises(DynamicSamplingExhausted, match="max_gen_batches=3"):
        steps.collect_rollouts(RolloutPlanner(ctx), engines, step=0)
    assert engines.rounds == 3  # never a 4th round


def test_mixed_groups_carry_surplus_across_steps():
    # Even prompts get mixed scores (kept), odd prompts all-correct (filtered).
    ctx, engines = _ctx(
        lambda prompt, j: float(prompt % 2 == 1 or j % 2 == 0),
        "dapo.dynamic_sampling.batch_multiplier=4.0",
        "dapo.dynamic_sampling.max_carry_age=2",
    )
    groups, stats, metrics = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=0)
    # One round of ceil(4 * 4) = 16 prompts (0..15): 8 even prompts kept, 4 trained, 4 carried.
    assert engines.rounds == 1 and stats.num_prompts_generated == 16
    assert [g.prompt_ids[0] for g in groups] == [0, 2, 4, 6]
    assert stats.num_carried_groups == 4 and stats.keep_rate == 0.5
    assert metrics["num_generated_tokens"] == 16 * N * 2
    # Next step is served from the carry alone: no generation round at all.
    groups, stats, metrics = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=1)
    assert engines.rounds == 1 and stats.num_gen_batches == 0
    assert [g.prompt_ids[0] for g in groups] == [8, 10, 12, 14]
    assert stats.num_carried_in == 4 and metrics["num_generated_tokens"] == 0.0


def test_filtering_uses_raw_scores_not_shaped_rewards():
    # All samples correct but of different lengths would give different SHAPED rewards
    # under an overlong penalty; the group must still be filtered on its raw scores.
    ctx, _ = _ctx(lambda prompt, j: 1.0, "dapo.overlong_buffer.length=15")
    samples = [[Sample([5] * (1 + 5 * j), [-0.1] * (1 + 5 * j), "stop") for j in range(N)]]
    groups = make_groups([[1]], ["1"], samples, [1.0] * N, ctx.plan.reward_shaping)
    assert len(set(groups[0].rewards)) > 1  # shaped rewards differ ...
    kept = ctx.dynamic
    kept.start_step()
    kept.add_round(groups, torch.tensor([groups[0].scores]), torch.tensor([groups[0].rewards]))
    assert kept.num_kept_groups == 0  # ... but the raw scores do not: filtered


def test_policy_batch_layout_and_overlong_filtering():
    ctx, _ = _ctx(lambda prompt, j: float(j == 0), "dapo.overlong_filtering=true")
    samples = [
        [
            Sample([5, 6, 2], [-1.0, -2.0, -3.0], "stop"),
            Sample([5, 6, 6], [-1.0, -2.0, -3.0], "length"),
            Sample([9], [-0.5], "stop"),
            Sample([9, 2], [-0.5, -0.1], "stop"),
        ]
    ]
    groups = make_groups([[1, 4]], ["x"], samples, [1.0, 0.0, 0.0, 0.0], ctx.plan.reward_shaping)
    batch = build_policy_batch(groups, ctx.config, pad_id=0)
    assert batch.input_ids.tolist()[0] == [1, 4, 5, 6, 2]
    assert batch.input_ids.tolist()[2] == [1, 4, 9, 0, 0]
    # Response tokens only; the truncated sample (finish "length") is masked out entirely.
    assert batch.loss_mask.tolist() == [
        [0, 0, 1, 1, 1],
        [0, 0, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
    ]
    assert batch.rollout_logprobs[0, 2:].tolist() == [-1.0, -2.0, -3.0]
    # Rewards: scale [0,1] -> [-1,1]: [1, -1, -1, -1]; group mean -0.5, unbiased std 1.0:
    # advantages (r + 0.5) / (1 + 1e-6) = [1.5, -0.5, -0.5, -0.5]
    assert batch.advantages.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)


def test_policy_batch_of_ragged_rows_matches_a_row_by_row_reference():
    # Prompts of different lengths, empty responses and a truncated one, over two groups:
    # each row is written at its own offsets, nothing leaks into its neighbours.
    ctx, _ = _ctx(lambda prompt, j: float(j % 2), "dapo.overlong_filtering=false")
    gen = torch.Generator().manual_seed(3)
    prompts = [[11, 12, 13], [21]]
    samples = []
    for _ in prompts:
        group = []
        for j in range(N):
            r = int(torch.randint(0, 5, (1,), generator=gen)) if j else 0
            toks = torch.randint(30, 60, (r,), generator=gen).tolist()
            lps = (-torch.rand(r, generator=gen)).tolist()
            group.append(Sample(toks, lps, "length" if r == 4 else "stop"))
        samples.append(group)
    groups = make_groups(prompts, ["x", "y"], samples, [0.0, 1.0] * N, ctx.plan.reward_shaping)
    batch = build_policy_batch(groups, ctx.config, pad_id=0)
    rows = [(p, smp) for p, group in zip(prompts, samples, strict=True) for smp in group]
    width = max(len(p) + smp.response_length for p, smp in rows)
    for i, (p, smp) in enumerate(rows):
        r = smp.response_length
        pad = [0] * (width - len(p) - r)
        assert batch.input_ids[i].tolist() == p + smp.response_token_ids + pad
        assert batch.loss_mask[i].tolist() == [0.0] * len(p) + [1.0] * r + [0.0] * len(pad)
        expected_lp = torch.tensor([0.0] * len(p) + smp.logprobs + [0.0] * len(pad))
        assert torch.equal(batch.rollout_logprobs[i], expected_lp)
        assert int(batch.lengths[i]) == len(p) + r


def test_policy_batch_refuses_samples_without_logprobs():
    ctx, _ = _ctx(lambda prompt, j: float(j == 0))
    samples = [[Sample([5, 2], [-1.0, -2.0], "stop")] * (N - 1) + [Sample([5, 2], [], "stop")]]
    groups = make_groups([[1]], ["x"], samples, [1.0, 0.0, 0.0, 0.0], ctx.plan.reward_shaping)
    with pytest.raises(ValueError, match="sample 3 of the batch has 0 logprobs for 2"):
        build_policy_batch(groups, ctx.config, pad_id=0)


def test_old_logprob_pass_runs_only_when_the_batch_needs_several_updates():
    from dapo_megatron.controller.rollouts.steps import needs_old_logprob_pass

    assert not needs_old_logprob_pass(256, 256, "auto")  # one update: training forward has them
    assert not needs_old_logprob_pass(200, 256, "auto")
    assert needs_old_logprob_pass(257, 256, "auto")  # a 2nd mini-batch after an update
    assert needs_old_logprob_pass(256, 128, "auto")
    assert needs_old_logprob_pass(256, 256, "always")


def _val_ctx(pattern, *overrides):
    ctx, engines = _ctx(pattern, "validation.max_prompts=null", *overrides)
    ctx.val = ctx.train  # 30 prompts
    seen = []
    generate = engines.generate

    def recording(prompts, sampling):
        seen.append(sampling)
        return generate(prompts, sampling)

    engines.generate = recording
    return ctx, engines, seen


def test_greedy_validation_decodes_once_per_prompt_and_reports_the_stderr():
    # 12 of 30 prompts answered correctly (prompt % 5 < 2): acc 0.4.
    ctx, engines, seen = _val_ctx(lambda prompt, j: float(prompt % 5 < 2), "validation.greedy=true")
    metrics = steps.validate(ctx, engines, step=10)
    assert seen[0].n == 1 and seen[0].top_k == 1
    assert metrics["val/acc"] == pytest.approx(12 / 30)
    # Sample standard deviation of 12 ones and 18 zeros, over sqrt(30) prompts.
    p = 12 / 30
    expected = (p * (1 - p) * 30 / 29) ** 0.5 / 30**0.5
    assert metrics["val/acc_stderr"] == pytest.approx(expected, rel=1e-12)


def test_sampled_validation_averages_k_samples_and_stderr_is_over_prompts():
    # Sample j of every prompt is right iff j is even: each prompt scores exactly 0.5,
    # so avg@4 = 0.5 with NO spread between prompts (stderr 0, not that of 120 coin flips).
    ctx, engines, seen = _val_ctx(
        lambda prompt, j: float(j % 2 == 0),
        "validation.greedy=false",
        "validation.num_samples_per_prompt=4",
        "validation.temperature=0.8",
    )
    metrics = steps.validate(ctx, engines, step=10)
    assert seen[0].n == 4 and seen[0].top_k == -1 and seen[0].temperature == 0.8
    assert metrics["val/acc"] == 0.5 and metrics["val/acc_stderr"] == 0.0


def test_validation_sampling_takes_validation_top_k():
    """validation.top_k reaches the validation rounds' sampling (NeMo RL's val_top_k);
    greedy validation stays top_k 1 whatever it says, and the config refuses 0."""
    from dapo_megatron.config.errors import ConfigError
    from dapo_megatron.config.loader import load_config
    from dapo_megatron.controller.rollouts.steps import validation_sampling

    recipe = Path(__file__).resolve().parents[4] / "recipes" / "dapo-tiny-cpu.yaml"
    sampled = load_config(recipe, ["validation.top_k=50", "validation.greedy=false"]).config
    assert validation_sampling(sampled, [0], seed=1).top_k == 50
    default = load_config(recipe, ["validation.greedy=false"]).config
    assert validation_sampling(default, [0], seed=1).top_k == -1
    greedy = load_config(recipe, ["validation.top_k=50", "validation.greedy=true"]).config
    assert validation_sampling(greedy, [0], seed=1).top_k == 1
    with pytest.raises(ConfigError, match="validation.top_k"):
        load_config(recipe, ["validation.top_k=0"])
