"""The pre-rollout skip rule (algorithms/prompt_skipping.py) and its use by the rollout
phase: probabilities against the closed form, the floor, the self-tuning, the audit,
bit-exact resume, and the skipped and aborted prompts of collect_rollouts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dapo_megatron.algorithms.prompt_skipping import (
    PromptSkipper,
    SkipRule,
    outcome_of,
    skip_probability,
    streak,
)
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import load_config
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.rollout_planner import RolloutPlanner, tail_cut
from dapo_megatron.shared.sampling import Sample
from unit.controller.rollouts.test_steps import FakeVerifier
from unit.fake_context import fake_context

REPO = Path(__file__).resolve().parents[3]
N = 4


def _rule(**changes) -> SkipRule:
    values = dict(
        target_zero_var_share=0.25,
        min_generate_prob=0.1,
        audit_fraction=0.1,
        history_len=4,
        initial_strength=0.5,
        adapt_rate=0.5,
    )
    return SkipRule(**{**values, **changes})


ALL_RIGHT, ALL_WRONG, MIXED = [1.0] * N, [0.0] * N, [1.0, 0.0, 1.0, 1.0]


def test_outcomes_and_streaks():
    assert [outcome_of(s) for s in (ALL_RIGHT, ALL_WRONG, MIXED)] == ["correct", "wrong", "mixed"]
    assert streak([]) == 0
    assert streak([("correct", 0), ("mixed", 1), ("wrong", 2), ("correct", 3)]) == 2
    assert streak([("correct", 0), ("mixed", 1)]) == 0


def test_skip_probability_matches_the_closed_form():
    rule = _rule()
    # (1 - floor) * (1 - (1 - s)^r) with floor 0.1, s 0.5, by hand:
    assert skip_probability(rule, 0.5, 0) == 0.0
    assert skip_probability(rule, 0.5, 1) == pytest.approx(0.9 * 0.5)
    assert skip_probability(rule, 0.5, 2) == pytest.approx(0.9 * 0.75)
    assert skip_probability(rule, 0.5, 3) == pytest.approx(0.9 * 0.875)
    assert skip_probability(rule, 1.0, 1) == pytest.approx(0.9)  # the floor bounds it
    assert skip_probability(rule, 0.0, 4) == 0.0


def test_decisions_follow_the_probability_and_the_audit_share():
    rule = _rule(initial_strength=0.5, audit_fraction=0.2)
    skipper = PromptSkipper(rule, seed=7)
    for prompt in range(4000):
        skipper.record(prompt, ALL_RIGHT, 0)
        skipper.record(prompt, ALL_WRONG, 1)  # streak 2 for every prompt
    counts = {"generate": 0, "skip": 0, "audit": 0}
    for prompt in range(4000):
        counts[skipper.decide(prompt)] += 1
    p = 0.9 * 0.75  # predicted zero-variance share, by hand
    predicted = counts["skip"] + counts["audit"]
    # Binomial: 4 standard deviations.
    assert abs(predicted / 4000 - p) < 4 * math.sqrt(p * (1 - p) / 4000)
    assert abs(counts["audit"] / predicted - 0.2) < 4 * math.sqrt(0.2 * 0.8 / predicted)


def test_a_prompt_never_seen_or_last_mixed_is_always_generated():
    skipper = PromptSkipper(_rule(initial_strength=1.0), seed=0)
    skipper.record(5, ALL_RIGHT, 0)
    skipper.record(5, MIXED, 1)
    assert {skipper.decide(p) for p in (1, 2, 3)} == {"generate"}
    assert all(skipper.decide(5) == "generate" for _ in range(50))


def test_the_floor_keeps_every_saturated_prompt_in_play():
    skipper = PromptSkipper(_rule(initial_strength=1.0, min_generate_prob=0.2), seed=3)
    for prompt in range(50):
        for version in range(4):
            skipper.record(prompt, ALL_RIGHT, version)
    visits = 60
    generated = {p: 0 for p in range(50)}
    for _ in range(visits):
        for prompt in range(50):
            generated[prompt] += skipper.decide(prompt) != "skip"
    # Every prompt is generated now and then: ~0.2 + 0.8 * 0.1 (audits) of its visits.
    assert min(generated.values()) > 0
    share = sum(generated.values()) / (50 * visits)
    assert abs(share - 0.28) < 0.03


def test_strength_tunes_towards_the_target_share():
    rule = _rule(target_zero_var_share=0.25, adapt_rate=0.5, initial_strength=0.5)
    skipper = PromptSkipper(rule, seed=0)
    for prompt in range(8):  # 6 of 8 zero-variance: share 0.75, 0.5 above the target
        skipper.record(prompt, ALL_RIGHT if prompt < 6 else MIXED, 0)
    metrics = skipper.end_step()
    assert metrics["dynamic_sampling/skip_strength"] == 0.5  # the value the step used
    assert skipper.strength == pytest.approx(0.5 + 0.5 * 0.5)
    for prompt in range(8):  # no zero-variance group: 0.25 below the target
        skipper.record(prompt, MIXED, 1)
    skipper.end_step()
    assert skipper.strength == pytest.approx(0.75 - 0.5 * 0.25)
    for _ in range(10):  # clamped at 0
        skipper.record(0, MIXED, 2)
        skipper.end_step()
    assert skipper.strength == 0.0


def test_audits_measure_the_precision_of_the_prediction():
    skipper = PromptSkipper(_rule(initial_strength=1.0, audit_fraction=1.0), seed=1)
    for prompt in range(200):
        skipper.record(prompt, ALL_RIGHT, 0)
    skipper.end_step()
    audited = [p for p in range(200) if skipper.decide(p) == "audit"]
    assert len(audited) > 100  # p = 0.9 each
    confirmed = audited[: len(audited) // 4]
    for prompt in audited:
        skipper.record(prompt, ALL_RIGHT if prompt in confirmed else MIXED, 1)
    metrics = skipper.end_step()
    assert metrics["dynamic_sampling/num_audited"] == len(audited)
    assert metrics["dynamic_sampling/num_audits_scored"] == len(audited)
    assert metrics["dynamic_sampling/predicted_zero_var_precision"] == pytest.approx(
        len(confirmed) / len(audited)
    )
    assert metrics["dynamic_sampling/num_skipped"] == 0


def _drive(skipper: PromptSkipper, steps_: range) -> list[str]:
    """A deterministic sequence of decisions and outcomes: prompt p is all right when
    p % 3 == 0, mixed when p % 3 == 1, all wrong otherwise."""
    log: list[str] = []
    for step in steps_:
        for prompt in range(12):
            decision = skipper.decide(prompt)
            log.append(decision)
            if decision != "skip":
                scores = (ALL_RIGHT, MIXED, ALL_WRONG)[prompt % 3]
                skipper.record(prompt, scores, step)
        log.append(repr(sorted(skipper.end_step().items())))
    return log


def test_resume_from_the_state_decides_exactly_as_an_uninterrupted_run():
    rule = _rule(initial_strength=0.3, history_len=3)
    straight = PromptSkipper(rule, seed=11)
    want = _drive(straight, range(8))
    first = PromptSkipper(rule, seed=11)
    got = _drive(first, range(4))
    state = first.state_dict()
    resumed = PromptSkipper(rule, seed=11)
    resumed.load_state_dict(state, num_prompts=12)
    got += _drive(resumed, range(4, 8))
    assert got == want
    assert "skip" in want  # the run did skip: the comparison covers decisions
    assert resumed.history(0) == straight.history(0)
    assert len(straight.history(0)) == 3  # history_len


def test_a_state_over_fewer_prompts_drops_the_others():
    skipper = PromptSkipper(_rule(), seed=0)
    skipper.record(3, ALL_RIGHT, 0)
    skipper.record(30, ALL_RIGHT, 0)
    skipper.end_step()
    fresh = PromptSkipper(_rule(), seed=0)
    fresh.load_state_dict(skipper.state_dict(), num_prompts=10)
    assert fresh.history(3) == [("correct", 0)] and fresh.history(30) == []


def test_disabled_generates_everything_and_records_nothing():
    skipper = PromptSkipper(None, seed=0)
    skipper.record(1, ALL_RIGHT, 0)
    assert skipper.decide(1) == "generate" and skipper.end_step() == {}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "dapo.dynamic_sampling.skip_predicted.min_generate_prob=0",
            "skip_predicted.min_generate_prob = 0.0 .*every prompt keeps a chance",
        ),
        ("dapo.dynamic_sampling.enabled=false", "set dapo.dynamic_sampling.enabled=true"),
        ("dapo.dynamic_sampling.skip_predicted.target_zero_var_share=1", "must be in \\[0, 1\\)"),
    ],
)
def test_bad_settings_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(
            REPO / "recipes" / "dapo-tiny-cpu.yaml",
            ["dapo.dynamic_sampling.skip_predicted.enabled=true", override],
        ).require_plan()


def test_abort_tail_is_refused_with_overlapped_rollouts():
    with pytest.raises(ConfigError, match="rollout.abort_tail = True .*synchronous loop"):
        load_config(
            REPO / "recipes" / "dapo-tiny-cpu.yaml",
            [
                "rollout.abort_tail=true",
                "rollout.max_staleness=1",
                "cluster.colocated=false",
                "cluster.generation_num_devices=1",
                "cluster.gpus_per_node=3",
            ],
        ).require_plan()


# ----------------------------------------------------------------- the rollout phase


class CuttingEngines:
    """Prompt i answers with token 7 + i % 3; with a finish target m the groups after
    the m-th come back aborted (partial, one token), as an engine cutting its tail does."""

    def __init__(self):
        self.calls: list[tuple[list[int], int | None]] = []

    def generate(self, prompts, sampling):
        cut = sampling.finish_target(len(prompts))
        self.calls.append(([p[0] for p in prompts], cut))
        out = []
        for j, p in enumerate(prompts):
            if cut is not None and j >= cut:
                out.append([Sample([7], [-0.5], "abort") for _ in range(sampling.n)])
            else:
                out.append([Sample([7 + p[0] % 3, 2], [-0.5, -0.1], "stop")] * sampling.n)
        return out


def _ctx(pattern, *overrides):
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
    return fake_context(plan, 12, FakeVerifier(pattern)), CuttingEngines()


def test_tail_cut_waits_for_the_kept_groups_with_headroom_and_oversamples():
    assert tail_cut(4, None, 10, 1.5) == (10, 10)  # no keep rate yet: no cut
    # keep 0.5: 8 expected + 2 SD of the binomial keep count (2 x sqrt(8 x 0.25) / 0.5 =
    # 5.66): wait for 14 finished groups of ceil(1.5 x 14) = 21 drawn; by hand.
    assert tail_cut(4, 0.5, 10, 1.5) == (21, 14)
    assert tail_cut(4, 1.0, 10, 1.5) == (6, 4)  # every group kept: no headroom needed
    assert tail_cut(4, 1.0, 10, 1.0) == (4, 4)  # oversample 1: nothing to cut


def test_aborted_groups_are_neither_scored_nor_trained_and_are_counted():
    ctx, engines = _ctx(
        lambda prompt, j: float(j % 2 == 0),  # every group varies
        "rollout.abort_tail=true",
        "dapo.dynamic_sampling.surplus=discard",
    )
    ctx.dynamic._keep_rate_ema = 1.0  # as after a first step where every group was kept
    groups, stats, metrics = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=1)
    # One round of ceil(1.5 x 4) = 6 prompts, cut once 4 finished.
    assert engines.calls == [(list(range(6)), 4)]
    assert metrics["rollout/num_aborted_groups"] == 2
    assert stats.num_prompts_generated == 4  # the aborted two are not fed to the filter
    assert [g.prompt_ids[0] for g in groups] == [0, 1, 2, 3]
    assert all(s.finish_reason == "stop" for g in groups for s in g.samples)
    # Every sample's tokens count as generated, the aborted ones' partial tokens too.
    assert metrics["num_generated_tokens"] == 4 * N * 2 + 2 * N * 1


def test_skipped_prompts_are_not_generated_and_audits_are_scored():
    # Prompts 0..5 are all correct, 6..11 mixed; after two visits the saturated ones are
    # skipped at strength 1 (floor 0.1).
    ctx, engines = _ctx(
        lambda prompt, j: float(prompt < 6 or j % 2 == 0),
        "dapo.dynamic_sampling.skip_predicted.enabled=true",
        "dapo.dynamic_sampling.skip_predicted.initial_strength=1.0",
        "dapo.dynamic_sampling.skip_predicted.adapt_rate=0",
        "dapo.dynamic_sampling.skip_predicted.audit_fraction=0.2",
        "dapo.dynamic_sampling.batch_multiplier=3.0",
        "dapo.dynamic_sampling.surplus=discard",
    )
    totals = {"skipped": 0.0, "audited": 0.0, "generated_saturated": 0}
    for step in range(12):
        before = len(engines.calls)
        _, stats, metrics = steps.collect_rollouts(RolloutPlanner(ctx), engines, step=step)
        totals["skipped"] += metrics["dynamic_sampling/num_skipped"]
        totals["audited"] += metrics["dynamic_sampling/num_audited"]
        if step >= 1:
            for prompts, _cut in engines.calls[before:]:
                totals["generated_saturated"] += sum(p < 6 for p in prompts)
        if "dynamic_sampling/predicted_zero_var_precision" in metrics:
            # Only saturated prompts are ever predicted: every audit is confirmed.
            assert metrics["dynamic_sampling/predicted_zero_var_precision"] == 1.0
    assert totals["skipped"] > 0 and totals["audited"] > 0
    # From step 1 on every saturated prompt has a streak: it is generated with probability
    # 0.1 (floor) + 0.9 x 0.2 (audits) = 0.28 per draw, by hand (4 binomial SDs).
    drawn_saturated = totals["generated_saturated"] + totals["skipped"]
    share = totals["generated_saturated"] / drawn_saturated
    assert abs(share - 0.28) < 4 * math.sqrt(0.28 * 0.72 / drawn_saturated), share
    # The skip history went into the checkpoint state and comes back.
    state = ctx.skipper.state_dict()
    assert state["history"]["0"][-1][0] == "correct"


def test_overlapped_stream_skips_and_records_outcomes_with_their_versions():
    # 16 prompts: even ones vary, odd ones are all wrong. At K = 1 the stream draws
    # through the skip rule; after the first visits the odd ones are mostly skipped, and
    # the history of each prompt carries the versions that generated its groups.
    from dapo_megatron.controller.rollouts.rollout_stream import RolloutStream
    from unit.controller.rollouts.test_rollout_stream import HalfVerifier, ScriptedEngines
    from unit.controller.rollouts.test_rollout_stream import _run as run_stream

    plan = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        [
            f"dapo.num_generations_per_prompt={N}",
            "dapo.num_prompts_per_step=4",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8",
            "data.shuffle=false",
            "cluster.colocated=false",
            "cluster.generation_num_devices=1",
            "rollout.max_staleness=1",
            "rollout.prompts_per_request=2",
            "dapo.dynamic_sampling.batch_multiplier=1.0",
            "dapo.dynamic_sampling.skip_predicted.enabled=true",
            "dapo.dynamic_sampling.skip_predicted.initial_strength=1.0",
            "dapo.dynamic_sampling.skip_predicted.adapt_rate=0",
            "dapo.dynamic_sampling.skip_predicted.audit_fraction=0",
        ],
    ).require_plan()
    ctx = fake_context(
        plan, 16, HalfVerifier(), ground_truth=lambda i: "vary" if i % 2 == 0 else "flat"
    )
    engines = ScriptedEngines()
    stream = RolloutStream(ctx, engines, None, version=0)
    try:
        trained = run_stream(stream, range(12))
    finally:
        stream.close()
    skipped = sum(s["metrics"]["dynamic_sampling/num_skipped"] for s in trained)
    assert skipped > 0
    late = [p for request in engines.submitted[len(engines.submitted) // 2 :] for p in request]
    # Odd prompts are generated only through the floor (p = 0.1) once their streak starts.
    assert sum(p % 2 for p in late) < 0.3 * len(late)
    for prompt in range(0, 16, 2):
        history = ctx.skipper.history(prompt)
        assert history and all(o == "mixed" for o, _ in history)
        versions = [v for _, v in history]
        assert versions == sorted(versions) and versions[-1] >= 6
    for step, s in enumerate(trained):
        assert all(step - g.version <= 1 for g in s["groups"])  # K still bounds training
