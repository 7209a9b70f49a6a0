"""Partial rollouts (controller/rollouts/partial_rollouts.py): the samples a cut round aborted are
continued by the next round, after a refit too, with each token's logprob from the
weights that generated it; fake engines that know their weights' version."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import load_config
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.partial_rollouts import PartialRollouts
from dapo_megatron.controller.rollouts.rollout_groups import build_policy_batch
from dapo_megatron.controller.rollouts.rollout_planner import RolloutPlanner
from dapo_megatron.shared.sampling import Sample
from unit.controller.rollouts.test_steps import FakeVerifier
from unit.fake_context import fake_context

REPO = Path(__file__).resolve().parents[4]
N = 4
EOS = 2


def _response(prompt: int, sample: int) -> list[int]:
    """The full response of sample j of prompt i: 1 + (i + j) % 5 tokens, then EOS; a
    token's value names its prompt, sample and position."""
    return [1000 + 100 * prompt + 10 * sample + k for k in range(1 + (prompt + sample) % 5)] + [EOS]


class VersionedEngines:
    """Deterministic engines holding weights of version ``self.version``: a token's logprob
    is ``-(version + 1) - 0.01 * position``. A call with a finish target aborts the prompts
    after the target with their first token only; a continuation (a prompt longer than one
    token) returns the rest of that sample's response, within its cap."""

    def __init__(self):
        self.version = 0
        self.calls = []

    def _sample(self, tokens: list[int], start: int, cap: int) -> Sample:
        tokens = tokens[:cap]
        reason = "stop" if tokens and tokens[-1] == EOS else "length"
        lps = [-(self.version + 1) - 0.01 * (start + k) for k in range(len(tokens))]
        return Sample(tokens, lps, reason)

    def generate(self, prompts, sampling):
        caps = sampling.response_caps(len(prompts))
        target = sampling.finish_target(len(prompts))
        self.calls.append({"prompts": [list(p) for p in prompts], "caps": caps, "n": sampling.n})
        out = []
        for i, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
            if len(prompt) > 1:  # a continuation: [prompt index, *tokens so far], n = 1
                index, head = prompt[0], list(prompt[1:])
                full = next(
                    _response(index, j)
                    for j in range(N)
                    if _response(index, j)[: len(head)] == head
                )
                rest = self._sample(full[len(head) :], len(head), cap)
                out.append([rest])
                continue
            group = []
            for j in range(sampling.n):
                full = _response(prompt[0], j)
                if target is not None and i >= target:
                    partial = self._sample(full[:1], 0, cap)
                    group.append(Sample(partial.response_token_ids, partial.logprobs, "abort"))
                else:
                    group.append(self._sample(full, 0, cap))
            out.append(group)
        return out


def _ctx(*overrides):
    plan = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        [
            f"dapo.num_generations_per_prompt={N}",
            "dapo.num_prompts_per_step=4",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8",
            "data.shuffle=false",
            "rollout.abort_tail=true",
            "rollout.partial_rollouts=true",
            "dapo.dynamic_sampling.surplus=discard",
            *overrides,
        ],
    ).require_plan()
    # Samples of every prompt alternate right / wrong: every group varies.
    return fake_context(plan, 30, FakeVerifier(lambda prompt, j: float(j % 2))), plan


def test_aborted_samples_are_continued_after_the_refit_with_per_token_versions():
    ctx, plan = _ctx()
    engines = VersionedEngines()
    ctx.dynamic._keep_rate_ema = 1.0  # as after a first step where every group varied
    engines.version = 1
    groups, stats, metrics = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=1)
    # Every group is kept: wait for 4 finished of ceil(1.5 x 4) = 6 prompts; 2 kept for later.
    assert engines.calls[0]["prompts"] == [[i] for i in range(6)]
    assert metrics["rollout/num_aborted_groups"] == 2
    assert [g.prompt_ids[0] for g in groups] == [0, 1, 2, 3]
    assert [p.prompt_index for p in ctx.partials.pending] == [4, 5]
    state = ctx.partials.state_dict()  # what the checkpoint keeps

    engines.version = 2  # the refit after step 1
    groups, stats, metrics = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=2)
    continuation = engines.calls[1]
    assert continuation["n"] == 1 and len(continuation["prompts"]) == 2 * N
    # Each request is the prompt and the sample's first token; its cap is what is left.
    assert continuation["prompts"][0] == [4, 1400]
    assert continuation["caps"][0] == plan.config.generation.max_response_length - 1
    assert metrics["rollout/num_partial_groups_continued"] == 2
    assert metrics["rollout/num_partial_tokens_reused"] == 2 * N
    # The 2 groups still needed: a new round of ceil(1.5 x 2) = 3 prompts, cut after 2.
    assert engines.calls[2]["prompts"] == [[6], [7], [8]]
    assert [g.prompt_ids[0] for g in groups] == [4, 5, 6, 7]
    assert [g.version for g in groups] == [1, 1, 2, 2]  # a continued group: its oldest token
    for group in groups[:2]:
        for j, sample in enumerate(group.samples):
            full = _response(group.prompt_ids[0], j)
            assert sample.response_token_ids == full and sample.finish_reason == "stop"
            assert sample.token_versions == [1] + [2] * (len(full) - 1)
            want = [-2.0] + [-3 - 0.01 * k for k in range(1, len(full))]
            assert sample.logprobs == pytest.approx(want)
    # The trainer sees every token's engine logprob: the first from version 1's weights.
    batch = build_policy_batch(groups, plan.config, pad_id=0)
    row = batch.rollout_logprobs[0][batch.loss_mask[0] > 0]
    assert row.tolist() == pytest.approx(groups[0].samples[0].logprobs)
    assert [p.prompt_index for p in ctx.partials.pending] == [8]  # cut in step 2's round

    # The checkpoint's pending groups come back as they were.
    restored = PartialRollouts()
    restored.load_state_dict(state)
    assert [p.prompt_index for p in restored.pending] == [4, 5]
    assert restored.pending[0].samples[0].token_versions == [1]


def test_groups_too_old_for_the_staleness_bound_are_dropped():
    ctx, _ = _ctx("dapo.dynamic_sampling.max_carry_age=1")
    engines = VersionedEngines()
    ctx.dynamic._keep_rate_ema = 1.0
    steps.collect_rollouts(RolloutPlanner(ctx), engines, step=1)
    assert len(ctx.partials.pending) == 2
    _, _, metrics = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=3)
    assert metrics["rollout/num_partial_groups_dropped"] == 2  # version 1 at step 3: 2 behind
    assert all(len(c["prompts"][0]) == 1 for c in engines.calls[1:])  # no continuation


def test_partial_rollouts_without_the_cut_are_refused():
    with pytest.raises(ConfigError, match="rollout.partial_rollouts = True .*abort_tail=true"):
        _ctx("rollout.abort_tail=false")
