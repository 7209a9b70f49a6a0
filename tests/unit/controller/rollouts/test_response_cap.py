"""``generation.response_cap`` (controller/rollouts/response_cap.py): each prompt's responses capped
at min(max_response_length, max_total_sequence_length - prompt length), as NeMo RL's vLLM
engine does (max_model_len = policy.max_total_sequence_length), on every call the
controller makes: training rounds, validation, overlapped requests, continuations of
partial rollouts. Fake engines record the caps; the numbers are derived by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.length_checks import length_problems, longest_sequence
from dapo_megatron.config.loader import load_config
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.partial_rollouts import PartialRollouts
from dapo_megatron.controller.rollouts.response_cap import capped, context_length
from dapo_megatron.controller.rollouts.rollout_groups import build_policy_batch
from dapo_megatron.controller.rollouts.rollout_planner import RolloutPlanner
from dapo_megatron.shared.sampling import Sample, SamplingParams
from unit.controller.rollouts.test_steps import FakeVerifier
from unit.fake_context import fake_context

REPO = Path(__file__).resolve().parents[4]
N = 2
TOTAL = 48  # the tiny recipe's policy.max_total_sequence_length
CAP = 16  # its generation.max_response_length


def _config(*overrides: str, validate: bool = True):
    return load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", list(overrides), validate=validate)


class CapEngines:
    """Answers every sample with its prompt's cap of tokens (no stop token): finish reason
    "length", as an engine that stops a response at its cap; records each call's caps."""

    def __init__(self):
        self.calls: list[tuple[list[int], list[int]]] = []

    def generate(self, prompts, sampling):
        caps = sampling.response_caps(len(prompts))
        self.calls.append(([len(p) for p in prompts], caps))
        return [
            [Sample([5] * cap, [-0.5] * cap, "length") for _ in range(sampling.n)] for cap in caps
        ]


def test_within_context_caps_each_prompt_at_the_context_it_leaves():
    # total 48, cap 16: P=4 -> min(16, 44)=16; P=32 -> min(16, 16)=16; P=40 -> 8; P=47 -> 1.
    params = SamplingParams(max_tokens=CAP, n=3).within_context([4, 32, 40, 47], TOTAL)
    assert params.max_tokens_per_prompt == (16, 16, 8, 1)
    assert params.response_caps(4) == [16, 16, 8, 1] and params.max_tokens == CAP
    assert params.for_prompts(2, 4).max_tokens_per_prompt == (8, 1)  # an engine's share
    # Caps given already (continuations: what each response has left) are cut the same way:
    # (10 left, input of 35 tokens) -> min(10, 13) = 10; (3 left, 46 tokens) -> min(3, 2) = 2.
    cont = SamplingParams(max_tokens=CAP, max_tokens_per_prompt=(10, 3))
    assert cont.within_context([35, 46], TOTAL).max_tokens_per_prompt == (10, 2)
    with pytest.raises(ValueError, match="48 tokens leaves no room"):
        SamplingParams(max_tokens=CAP).within_context([4, 48], TOTAL)


def test_fixed_leaves_the_sampling_as_it_is_and_context_caps_it():
    fixed = _config().config
    sampling = SamplingParams(max_tokens=CAP)
    assert fixed.generation.response_cap == "fixed" and context_length(fixed) is None
    assert capped(fixed, sampling, [[1] * 40]) is sampling
    context = _config("generation.response_cap=context", "data.max_prompt_length=40").config
    assert context_length(context) == TOTAL
    assert capped(context, sampling, [[1] * 4, [1] * 40]).max_tokens_per_prompt == (16, 8)


def test_validation_of_the_lengths_in_each_mode():
    # fixed: prompt 32 + response 16 = 48 fits; prompt 40 + 16 = 56 does not.
    assert length_problems(_config(validate=False).config) == []
    with pytest.raises(ConfigError, match=r"max_total_sequence_length.*>= .* = 56"):
        _config("data.max_prompt_length=40")
    # context: any prompt shorter than the context; the response cap at most the total (a
    # cap of 48 is NeMo RL's max_new_tokens = the whole length, reached by no response).
    plan = _config("generation.response_cap=context", "data.max_prompt_length=47").require_plan()
    assert longest_sequence(plan.config) == TOTAL  # not 47 + 16 = 63: the packing budget
    ok = _config("generation.response_cap=context", "generation.max_response_length=47")
    assert ok.config.generation.max_response_length == 47
    with pytest.raises(ConfigError, match=r"data.max_prompt_length.*must be < .*= 48"):
        _config("generation.response_cap=context", "data.max_prompt_length=48")
    assert _config("generation.response_cap=context", "generation.max_response_length=48")
    with pytest.raises(ConfigError, match=r"generation.max_response_length.*<= .* = 48"):
        _config("generation.response_cap=context", "generation.max_response_length=49")
    problems = length_problems(
        _config(
            "generation.response_cap=context",
            "data.max_prompt_length=48",
            "generation.max_response_length=60",
            validate=False,
        ).config
    )
    assert [key for key, _ in problems] == [
        "data.max_prompt_length",
        "generation.max_response_length",
    ]


def _ctx(lengths: list[int], *overrides: str):
    plan = _config(
        f"dapo.num_generations_per_prompt={N}",
        f"dapo.num_prompts_per_step={len(lengths)}",
        f"policy.train_global_batch_size={len(lengths) * N}",
        "policy.train_micro_batch_size=2",
        "data.shuffle=false",
        "dapo.dynamic_sampling.enabled=false",
        "data.max_prompt_length=47",
        "generation.response_cap=context",
        *overrides,
    ).require_plan()
    ctx = fake_context(plan, len(lengths), FakeVerifier(lambda prompt, j: float(j % 2)))
    # Prompt i: token i repeated to its length (the fake verifier reads the ground truth).
    ctx.train.input_ids = [[i] * n for i, n in enumerate(lengths)]
    return ctx, plan


def test_training_and_validation_rounds_send_each_prompt_its_cap_and_filter_the_cut():
    lengths = [4, 32, 40, 47]  # caps 16, 16, 8, 1 (first test)
    ctx, plan = _ctx(lengths, "dapo.overlong_filtering=true")
    engines = CapEngines()
    groups, _, metrics = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=1)
    assert engines.calls == [(lengths, [16, 16, 8, 1])]
    assert [g.samples[0].response_length for g in groups] == [16, 16, 8, 1]
    # Each sequence fills at most the context; a response stopped by its own cap is
    # truncated ("length"), so overlong filtering masks it like one stopped at 16.
    batch = build_policy_batch(groups, plan.config, pad_id=0)
    assert batch.lengths.tolist() == [20, 20, 48, 48, 48, 48, 48, 48]
    assert batch.loss_mask.sum() == 0
    assert metrics["num_generated_tokens"] == 2 * (16 + 16 + 8 + 1)
    ctx.val = ctx.train
    steps.validate(ctx, engines, step=1)
    assert engines.calls[-1] == (lengths, [16, 16, 8, 1])


def test_the_overlong_penalty_keeps_lmax_at_max_response_length():
    # Lmax = 16, buffer 4: the ramp is (12, 16]; the prompt of 40 tokens, cut at 8 tokens
    # by its context, gets no penalty; the prompts capped at 16 get -1 (penalty_factor 1).
    ctx, _ = _ctx([4, 40], "dapo.overlong_buffer.enabled=true")
    groups, _, _ = steps.collect_rollouts(RolloutPlanner(ctx), CapEngines(), step=1)
    assert [g.penalties for g in groups] == [[-1.0, -1.0], [0.0, 0.0]]


def test_a_continuation_gets_what_its_prompts_own_cap_has_left():
    partials = PartialRollouts()
    # Prompt 0 has 4 tokens (own cap 16), prompt 1 has 40 (own cap 8); each aborted with
    # 3 tokens: 13 and 5 left (fixed mode would give both 16 - 3 = 13).
    for index, _ in enumerate([4, 40]):
        partials.keep(index, [Sample([9, 9, 9], [-1.0] * 3, "abort")], version=1)
    engines = CapEngines()
    prompts = [[0] * 4, [1] * 40]
    done, _ = partials.continue_all(engines, prompts, SamplingParams(max_tokens=CAP), 2, TOTAL)
    assert engines.calls == [([7, 43], [13, 5])]
    assert [g.samples[0].response_length for g in done] == [16, 8]  # = each prompt's cap
    assert all(g.samples[0].finish_reason == "length" for g in done)


def test_overlapped_requests_send_each_prompt_its_cap():
    from dapo_megatron.controller.rollouts.rollout_stream import RolloutStream
    from unit.controller.rollouts.test_rollout_stream import ScriptedEngines, _run
    from unit.controller.rollouts.test_rollout_stream import _ctx as stream_ctx

    ctx = stream_ctx(
        "generation.response_cap=context",
        "data.max_prompt_length=47",
        "dapo.dynamic_sampling.batch_multiplier=1.0",
    )
    ctx.train.input_ids = [[i] * (47 - i % 47) for i in range(len(ctx.train.input_ids))]
    engines = ScriptedEngines()
    sent: list[tuple[list[int], list[int]]] = []
    submit = engines.submit

    def recording(prompts, sampling):
        sent.append(([len(p) for p in prompts], sampling.response_caps(len(prompts))))
        return submit(prompts, sampling)

    engines.submit = recording
    stream = RolloutStream(ctx, engines, None, version=0)
    try:
        _run(stream, range(2))
    finally:
        stream.close()
    assert sent and all(caps == [min(CAP, TOTAL - n) for n in lengths] for lengths, caps in sent)
    assert sent[0] == ([47, 46], [1, 2])  # prompts 0 and 1: 47 and 46 tokens
