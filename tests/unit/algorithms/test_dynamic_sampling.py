"""The DynamicSampler (algorithms/dynamic_sampling.py): rounds, carry, exhaustion, stats,
its checkpoint state, the auto batch multiplier and policy versions.

The group filter and the multiplier rule are tested in algorithms/test_group_filter.py."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dapo_megatron.algorithms.dynamic_sampling import (
    DynamicSampler,
    DynamicSamplingExhausted,
    DynamicSamplingStats,
)
from unit.sampler_rounds import N, make_round, sampler

# --------------------------------------------------------------------------- constructor


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"num_prompts_per_step": 0}, "num_prompts_per_step"),
        ({"num_prompts_per_step": 2.0}, "num_prompts_per_step"),
        ({"batch_multiplier": 0.99}, "batch_multiplier"),
        ({"batch_multiplier": float("inf")}, "batch_multiplier"),
        ({"batch_multiplier": "2"}, "batch_multiplier"),
        ({"max_gen_batches": 1.5}, "max_gen_batches"),
        ({"max_gen_batches": True}, "max_gen_batches"),
        ({"surplus": "keep"}, "surplus"),
        ({"max_carry_age": 0}, "max_carry_age"),
        ({"group_size": 0}, "group_size"),
        ({"enabled": 1}, "enabled"),
    ],
)
def test_constructor_rejects_bad_args(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sampler(**overrides)


def test_batch_multiplier_is_validated_on_assignment() -> None:
    s = sampler()
    s.batch_multiplier = 2
    assert s.batch_multiplier == 2.0
    with pytest.raises(ValueError, match=r"batch_multiplier.*0\.5"):
        s.batch_multiplier = 0.5
    assert s.batch_multiplier == 2.0


# ------------------------------------------------------------------------- round sizing


@pytest.mark.parametrize(
    ("num_prompts", "multiplier", "expected"),
    [
        (4, 1.0, 4),  # 1.0 * 4 = 4
        (4, 1.5, 6),  # 1.5 * 4 = 6
        (3, 1.5, 5),  # 1.5 * 3 = 4.5 -> 5
        (10, 1.1, 11),  # 1.1 * 10 = 11 (11.000000000000002 in floats must not become 12)
        (7, 3.0, 21),  # 3 * 7
    ],
)
def test_prompts_for_first_round(num_prompts: int, multiplier: float, expected: int) -> None:
    s = sampler(num_prompts_per_step=num_prompts, batch_multiplier=multiplier)
    s.start_step()
    assert s.prompts_for_next_round() == expected


def test_multiplier_change_applies_to_next_step() -> None:
    s = sampler(num_prompts_per_step=4, batch_multiplier=1.0)
    s.start_step()
    assert s.prompts_for_next_round() == 4
    s.add_round(*make_round(["a0", "a1", "a2", "a3"], [True] * 4))
    s.finish_step()
    s.batch_multiplier = 2.5
    s.start_step()
    # ceil(2.5 * 4) = 10
    assert s.prompts_for_next_round() == 10


# ------------------------------------------------------------------- a step, by hand


def test_step_with_discard_hand_counts() -> None:
    s = sampler(num_prompts_per_step=4, batch_multiplier=1.5, surplus="discard")
    s.start_step()
    assert s.prompts_for_next_round() == 6  # ceil(1.5 * 4)
    names1 = [f"r1g{i}" for i in range(6)]
    rewards1 = [[1, -1], [0, 0], [1, 1], [-1, -1], [0, 0], [1, -1]]
    s.add_round(*make_round(names1, [True, False, True, False, False, True], rewards1))
    assert not s.is_complete()
    assert s.num_kept_groups == 3
    assert s.prompts_for_next_round() == 2  # ceil(1.5 * (4 - 3)) = ceil(1.5)
    s.add_round(*make_round(["r2g0", "r2g1"], [True, True], [[0.5, 1.0], [1.0, 1.0]]))
    assert s.is_complete()
    batch, stats = s.finish_step()
    assert batch == ["r1g0", "r1g2", "r1g5", "r2g0"]
    assert stats.num_gen_batches == 2
    assert stats.num_prompts_generated == 8  # 6 + 2
    assert stats.num_samples_generated == 16  # 8 * N
    assert stats.num_kept_groups_generated == 5  # 3 + 2
    assert stats.keep_rate == 5 / 8  # 0.625
    assert stats.num_carried_in == 0
    assert stats.num_carried_groups == 0
    assert stats.num_discarded_valid_samples == 2  # surplus r2g1 has N = 2 samples
    # returned rewards: r1g0 [1,-1], r1g2 [1,1], r1g5 [1,-1], r2g0 [0.5,1] -> 3.5 / 8 samples
    assert stats.filtered_reward == pytest.approx(0.4375)
    assert s.num_carried_groups == 0


def test_all_equal_groups_are_never_returned() -> None:
    s = sampler(num_prompts_per_step=2, batch_multiplier=2.0)
    s.start_step()
    s.add_round(*make_round(["c0", "v0", "c1", "c2"], [False, True, False, False]))
    s.add_round(*make_round(["c3", "v1"], [False, True]))
    batch, stats = s.finish_step()
    assert batch == ["v0", "v1"]
    # 2 kept of 6 generated
    assert stats.keep_rate == pytest.approx(2 / 6)


def test_carry_surplus_and_reuse_hand_counts() -> None:
    s = sampler(num_prompts_per_step=4, batch_multiplier=1.5, surplus="carry", max_carry_age=2)
    s.start_step()
    s.add_round(*make_round([f"a{i}" for i in range(6)], [True, False, True, False, False, True]))
    s.add_round(*make_round(["b0", "b1"], [True, True], [[0.5, 1.0], [2.0, 4.0]]))
    batch, stats = s.finish_step()
    assert batch == ["a0", "a2", "a5", "b0"]
    assert stats.num_carried_groups == 1  # b1 waits in the cache
    assert stats.num_discarded_valid_samples == 0

    s.start_step()
    assert s.num_kept_groups == 1  # b1 pre-filled
    assert s.num_carried_groups == 0
    assert s.prompts_for_next_round() == 5  # ceil(1.5 * (4 - 1)) = ceil(4.5)
    s.add_round(
        *make_round(
            [f"c{i}" for i in range(5)],
            [True] * 5,
            [[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [9.0, 9.0], [9.0, 9.0]],
        )
    )
    batch, stats = s.finish_step()
    # carried group first, then new ones in generation order; c3, c4 are the new surplus
    assert batch == ["b1", "c0", "c1", "c2"]
    assert stats.num_carried_in == 1
    assert stats.num_kept_groups_generated == 5
    assert stats.keep_rate == 1.0  # 5 / 5
    assert stats.num_carried_groups == 2
    assert stats.num_discarded_valid_samples == 0
    # b1 [2, 4] + c0 [0, 0] + c1 [1, 1] + c2 [0, 1] = 9 over 8 samples
    assert stats.filtered_reward == pytest.approx(9 / 8)


def test_carry_fills_a_step_without_generation_then_ages_out() -> None:
    s = sampler(num_prompts_per_step=2, surplus="carry", max_carry_age=1)
    s.start_step()
    assert s.prompts_for_next_round() == 2
    # the caller may hand back more groups than asked; all 5 vary
    s.add_round(*make_round([f"a{i}" for i in range(5)], [True] * 5))
    batch, stats = s.finish_step()
    assert batch == ["a0", "a1"]
    assert stats.num_carried_groups == 3  # a2, a3, a4 at age 0

    s.start_step()  # ages become 1 <= max_carry_age: a2, a3 fill the step
    assert s.is_complete()
    with pytest.raises(RuntimeError, match="complete"):
        s.prompts_for_next_round()
    batch, stats = s.finish_step()
    assert batch == ["a2", "a3"]
    assert stats.num_gen_batches == 0
    assert stats.num_prompts_generated == 0
    assert stats.keep_rate == 1.0  # nothing generated
    assert stats.num_carried_in == 2
    assert stats.num_carried_groups == 1  # a4
    assert stats.num_discarded_valid_samples == 0

    s.start_step()  # a4 reaches age 2 > 1 and is dropped: its N = 2 samples are discarded
    assert s.num_carried_groups == 0
    assert s.num_kept_groups == 0
    assert s.prompts_for_next_round() == 2
    s.add_round(*make_round(["b0", "b1"], [True, True]))
    batch, stats = s.finish_step()
    assert batch == ["b0", "b1"]
    assert stats.num_carried_in == 0
    assert stats.num_discarded_valid_samples == 2


def test_carried_groups_survive_exactly_max_carry_age_steps() -> None:
    # max_carry_age = 3: a carried group is still usable at ages 1, 2 and 3, dropped at 4.
    s = sampler(num_prompts_per_step=1, surplus="carry", max_carry_age=3)
    s.load_state_dict(
        {
            "format_version": 1,
            "carry": [
                {"group": f"x{i}", "age": 0, "reward_sum": 0.0, "num_samples": N} for i in range(5)
            ],
            "totals": dict.fromkeys(s.totals, 0),
        }
    )
    for expected in ("x0", "x1", "x2"):  # ages 1, 2, 3: each step uses the oldest group
        s.start_step()
        batch, stats = s.finish_step()
        assert batch == [expected]
        assert stats.num_gen_batches == 0
        assert stats.num_discarded_valid_samples == 0
    s.start_step()
    # x3, x4 were at age 3, now 4 > 3: dropped, so this step has to generate
    assert s.num_carried_groups == 0
    assert not s.is_complete()
    s.add_round(*make_round(["new"], [True]))
    batch, stats = s.finish_step()
    assert batch == ["new"]
    assert stats.num_discarded_valid_samples == 4  # 2 groups x N = 2 samples


def test_prefill_takes_oldest_first() -> None:
    s = sampler(num_prompts_per_step=2, surplus="carry", max_carry_age=5)
    s.load_state_dict(
        {
            "format_version": 1,
            "carry": [
                {"group": "young", "age": 0, "reward_sum": 0.0, "num_samples": N},
                {"group": "old", "age": 3, "reward_sum": 2.0, "num_samples": N},
                {"group": "mid_a", "age": 1, "reward_sum": 1.0, "num_samples": N},
                {"group": "mid_b", "age": 1, "reward_sum": 4.0, "num_samples": N},
            ],
            "totals": dict.fromkeys(s.totals, 0),
        }
    )
    s.start_step()
    batch, stats = s.finish_step()
    # ages become young 1, old 4, mid_a 2, mid_b 2: oldest first, ties in stored order
    assert batch == ["old", "mid_a"]
    assert stats.num_carried_groups == 2
    # (2 + 1) / (2 groups x 2 samples) = 0.75
    assert stats.filtered_reward == pytest.approx(0.75)
    s.start_step()
    batch, _ = s.finish_step()
    assert batch == ["mid_b", "young"]


# --------------------------------------------------------------------------- exhaustion


def test_exhaustion_after_max_rounds_message_and_no_extra_round() -> None:
    s = sampler(num_prompts_per_step=4, batch_multiplier=1.0, max_gen_batches=2)
    s.start_step()
    s.add_round(*make_round([f"a{i}" for i in range(4)], [False] * 4))  # round 1: 0 kept
    assert s.prompts_for_next_round() == 4
    with pytest.raises(DynamicSamplingExhausted) as info:
        s.add_round(*make_round([f"b{i}" for i in range(4)], [True, False, False, False]))
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "dapo.dynamic_sampling.max_gen_batches=2" in message
    assert "dapo.dynamic_sampling.batch_multiplier=1" in message
    assert "in 2 rounds" in message and "2 full rounds of 4" in message
    assert "8 prompts generated" in message
    assert "1 groups kept" in message and "4 needed" in message
    assert "keep rate 0.125" in message  # 1 kept / 8 generated
    assert "Raise" in message
    assert s.num_gen_batches == 2
    # a third round is refused however the caller asks for it
    with pytest.raises(DynamicSamplingExhausted):
        s.prompts_for_next_round()
    with pytest.raises(DynamicSamplingExhausted):
        s.add_round(*make_round(["c0"], [True]))
    assert s.num_gen_batches == 2
    with pytest.raises(RuntimeError, match="incomplete"):
        s.finish_step()


def test_exhaustion_with_zero_keep_rate_points_at_the_verifier() -> None:
    s = sampler(num_prompts_per_step=1, max_gen_batches=1)
    s.start_step()
    with pytest.raises(DynamicSamplingExhausted, match="verifier"):
        s.add_round(*make_round(["a"], [False]))


def test_completing_on_the_last_allowed_round_is_fine() -> None:
    s = sampler(num_prompts_per_step=2, max_gen_batches=2)
    s.start_step()
    s.add_round(*make_round(["a0", "a1"], [True, False]))
    s.add_round(*make_round(["b0"], [True]))
    batch, stats = s.finish_step()
    assert batch == ["a0", "b0"]
    assert stats.num_gen_batches == 2
    # the round budget is per step
    s.start_step()
    s.add_round(*make_round(["c0", "c1"], [False, True]))
    s.add_round(*make_round(["d0"], [True]))
    assert s.finish_step()[0] == ["c1", "d0"]


@pytest.mark.parametrize("max_gen_batches", [0, -1])
def test_non_positive_max_gen_batches_is_unlimited(max_gen_batches: int) -> None:
    s = sampler(num_prompts_per_step=1, max_gen_batches=max_gen_batches)
    s.start_step()
    for i in range(30):
        s.add_round(*make_round([f"dud{i}"], [False]))
    s.add_round(*make_round(["good"], [True]))
    batch, stats = s.finish_step()
    assert batch == ["good"]
    assert stats.num_gen_batches == 31
    assert stats.keep_rate == pytest.approx(1 / 31)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    num_prompts=st.integers(1, 5),
    multiplier=st.sampled_from([1.0, 1.3, 2.0, 3.5]),
    max_gen_batches=st.integers(1, 4),
    surplus=st.sampled_from(["carry", "discard"]),
)
def test_property_never_more_than_max_gen_batches_full_rounds_of_prompts(
    data: st.DataObject, num_prompts: int, multiplier: float, max_gen_batches: int, surplus: str
) -> None:
    # max_gen_batches counts prompts in full rounds (ceil(multiplier * num_prompts) each):
    # a round starts only while fewer than that many prompts were generated this step, and
    # the step stops exhausted once they were (later rounds may be smaller than a full one).
    s = sampler(
        num_prompts_per_step=num_prompts,
        batch_multiplier=multiplier,
        max_gen_batches=max_gen_batches,
        surplus=surplus,
        max_carry_age=2,
    )
    full = math.ceil(round(multiplier * num_prompts, 9))
    budget = max_gen_batches * full
    for step in range(3):
        s.start_step()
        rounds = generated = 0
        kept_varied = s.num_kept_groups
        exhausted = False
        while not s.is_complete():
            try:
                n = s.prompts_for_next_round()
            except DynamicSamplingExhausted:
                exhausted = True
                break
            assert generated < budget
            assert n <= full
            rounds += 1
            generated += n
            flags = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
            names = [f"{'v' if f else 'c'}-{step}-{rounds}-{i}" for i, f in enumerate(flags)]
            kept_varied += sum(flags)
            try:
                s.add_round(*make_round(names, flags))
            except DynamicSamplingExhausted:
                exhausted = True
                break
        event("exhausted" if exhausted else "step completed")
        if exhausted:
            assert budget <= generated < budget + full
            assert kept_varied < num_prompts
            assert not s.is_complete()
            with pytest.raises(DynamicSamplingExhausted):
                s.prompts_for_next_round()
            return
        batch, stats = s.finish_step()
        assert stats.num_gen_batches == rounds
        assert stats.num_prompts_generated == generated < budget + full
        assert len(batch) == num_prompts
        assert all(name.startswith("v") for name in batch)
        assert 0.0 <= stats.keep_rate <= 1.0


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    num_prompts=st.integers(1, 4),
    surplus=st.sampled_from(["carry", "discard"]),
    max_carry_age=st.integers(1, 3),
)
def test_property_group_accounting(
    data: st.DataObject, num_prompts: int, surplus: str, max_carry_age: int
) -> None:
    """Every valid group is returned once, cached, or counted as discarded."""
    s = sampler(
        num_prompts_per_step=num_prompts,
        batch_multiplier=2.0,
        max_gen_batches=0,
        surplus=surplus,
        max_carry_age=max_carry_age,
    )
    valid_generated = 0
    returned: list[str] = []
    discarded_samples = 0
    for step in range(4):
        s.start_step()
        rounds = 0
        while not s.is_complete():
            n = s.prompts_for_next_round()
            rounds += 1
            # force progress every third round so the unlimited loop terminates
            flags = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
            if rounds % 3 == 0:
                flags[0] = True
            names = [f"{'v' if f else 'c'}-{step}-{rounds}-{i}" for i, f in enumerate(flags)]
            valid_generated += sum(flags)
            s.add_round(*make_round(names, flags))
        batch, stats = s.finish_step()
        assert len(batch) == num_prompts
        returned += batch
        discarded_samples += stats.num_discarded_valid_samples
        assert stats.num_carried_groups == s.num_carried_groups
        if surplus == "discard":
            assert stats.num_carried_groups == 0
    assert len(set(returned)) == len(returned)
    assert all(name.startswith("v") for name in returned)
    assert discarded_samples % N == 0
    assert valid_generated == len(returned) + s.num_carried_groups + discarded_samples // N


# --------------------------------------------------------------------------- disabled mode


def test_disabled_keeps_everything_in_one_round() -> None:
    s = sampler(num_prompts_per_step=3, batch_multiplier=2.0, enabled=False, max_gen_batches=1)
    s.start_step()
    assert s.prompts_for_next_round() == 3  # the multiplier is ignored
    s.add_round(*make_round(["a", "b", "c"], [False, False, True], [[1, 1], [0, 0], [1, 0]]))
    assert s.is_complete()
    batch, stats = s.finish_step()
    assert batch == ["a", "b", "c"]  # constant groups included
    assert stats.num_gen_batches == 1
    assert stats.keep_rate == 1.0  # 3 / 3
    # (2 + 0 + 1) / 6 samples
    assert stats.filtered_reward == pytest.approx(0.5)


def test_disabled_does_not_prefill_from_a_loaded_carry() -> None:
    s = sampler(num_prompts_per_step=1, enabled=False, max_carry_age=2)
    s.load_state_dict(
        {
            "format_version": 1,
            "carry": [{"group": "old", "age": 0, "reward_sum": 0.0, "num_samples": N}],
            "totals": dict.fromkeys(s.totals, 0),
        }
    )
    s.start_step()
    assert s.num_kept_groups == 0
    assert s.prompts_for_next_round() == 1
    s.add_round(*make_round(["new"], [False]))
    batch, stats = s.finish_step()
    assert batch == ["new"]
    assert stats.num_carried_in == 0


# ------------------------------------------------------------------------- misuse and shapes


def test_call_order_is_enforced() -> None:
    s = sampler(num_prompts_per_step=1)
    with pytest.raises(RuntimeError, match="start_step"):
        s.prompts_for_next_round()
    with pytest.raises(RuntimeError, match="start_step"):
        s.add_round(*make_round(["a"], [True]))
    with pytest.raises(RuntimeError, match="start_step"):
        s.finish_step()
    assert not s.is_complete()
    s.start_step()
    with pytest.raises(RuntimeError, match="start_step"):
        s.start_step()
    with pytest.raises(RuntimeError, match="incomplete"):
        s.finish_step()
    with pytest.raises(RuntimeError, match="during a step"):
        s.state_dict()
    s.add_round(*make_round(["a"], [True]))
    with pytest.raises(RuntimeError, match="complete"):
        s.add_round(*make_round(["b"], [True]))
    assert s.finish_step()[0] == ["a"]


@pytest.mark.parametrize(
    ("groups", "metric", "reward", "match"),
    [
        (["a", "b"], torch.zeros(1, N), torch.zeros(1, N), "metric_GN"),
        (["a"], torch.zeros(1, N + 1), torch.zeros(1, N + 1), "metric_GN"),
        (["a"], torch.zeros(1, N), torch.zeros(2, N), "reward_GN"),
        (["a"], torch.tensor([[1.0, 0.0]]), torch.tensor([[float("nan"), 0.0]]), "reward_GN"),
        (["a"], torch.tensor([[1.0, float("nan")]]), torch.zeros(1, N), "metric_GN"),
        ("ab", torch.zeros(2, N), torch.zeros(2, N), "groups"),
        (["a"], [[1.0, 0.0]], torch.zeros(1, N), "metric_GN"),
    ],
)
def test_add_round_rejects_bad_shapes_without_counting(
    groups: Any, metric: Any, reward: Any, match: str
) -> None:
    s = sampler(num_prompts_per_step=1, max_gen_batches=1)
    s.start_step()
    with pytest.raises(ValueError, match=match):
        s.add_round(groups, metric, reward)
    assert s.num_gen_batches == 0
    s.add_round(*make_round(["ok"], [True]))  # the one allowed round is still available
    assert s.finish_step()[0] == ["ok"]


def test_empty_round_counts_as_a_round() -> None:
    s = sampler(num_prompts_per_step=1, max_gen_batches=2)
    s.start_step()
    s.add_round(*make_round([], []))
    assert s.num_gen_batches == 1
    s.add_round(*make_round(["a"], [True]))
    _, stats = s.finish_step()
    # 1 kept of 1 generated over 2 rounds
    assert (stats.num_gen_batches, stats.num_prompts_generated, stats.keep_rate) == (2, 1, 1.0)


# ------------------------------------------------------------------------------ stats


def test_stats_to_metrics() -> None:
    stats = DynamicSamplingStats(
        num_gen_batches=2,
        num_prompts_generated=8,
        num_samples_generated=16,
        num_kept_groups_generated=5,
        keep_rate=0.625,
        num_carried_in=1,
        num_carried_groups=3,
        num_discarded_valid_samples=4,
        filtered_reward=0.25,
    )
    assert stats.to_metrics() == {
        "dynamic_sampling/num_gen_batches": 2.0,
        "dynamic_sampling/num_prompts_generated": 8.0,
        "dynamic_sampling/num_samples_generated": 16.0,
        "dynamic_sampling/num_kept_groups_generated": 5.0,
        "dynamic_sampling/keep_rate": 0.625,
        "dynamic_sampling/num_carried_in": 1.0,
        "dynamic_sampling/num_carried_groups": 3.0,
        "dynamic_sampling/num_discarded_valid_samples": 4.0,
        "dynamic_sampling/filtered_reward": 0.25,
    }
    assert all(isinstance(v, float) for v in stats.to_metrics().values())


def test_filtered_reward_uses_shaped_reward_not_metric() -> None:
    s = sampler(num_prompts_per_step=1)
    s.start_step()
    # the metric decides keeping; rewards with an overlong penalty feed filtered_reward
    s.add_round(["a"], torch.tensor([[1.0, 0.0]]), torch.tensor([[0.75, -1.0]]))
    _, stats = s.finish_step()
    # (0.75 - 1.0) / 2 = -0.125
    assert stats.filtered_reward == pytest.approx(-0.125)


def test_variance_in_reward_alone_does_not_keep_a_group() -> None:
    s = sampler(num_prompts_per_step=1, max_gen_batches=0)
    s.start_step()
    # both samples correct (metric constant) but one was penalised for length
    s.add_round(["same"], torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 0.5]]))
    assert not s.is_complete()


# ---------------------------------------------------------------------------------------
# The DynamicSampler's checkpoint state, its auto batch multiplier and policy versions.

# --------------------------------------------------------------------------- checkpointing


def _run_step(s: DynamicSampler[str], names: list[str], flags: list[bool]) -> Any:
    s.start_step()
    if not s.is_complete():
        s.add_round(*make_round(names, flags))
    return s.finish_step()


def test_state_dict_round_trip_preserves_carry_and_totals() -> None:
    s = sampler(num_prompts_per_step=2, surplus="carry", max_carry_age=2)
    _run_step(s, ["a0", "a1", "a2", "a3", "a4"], [True, False, True, True, True])
    # batch a0, a2; a3 and a4 carried (generated by version 0)
    state = pickle.loads(pickle.dumps(s.state_dict()))
    assert [item["group"] for item in state["carry"]] == ["a3", "a4"]
    assert [item["version"] for item in state["carry"]] == [0, 0]
    assert state["totals"]["num_steps"] == 1
    assert state["totals"]["num_prompts_generated"] == 5

    restored = sampler(num_prompts_per_step=2, surplus="carry", max_carry_age=2)
    restored.load_state_dict(state)
    assert restored.totals == s.totals
    assert restored.num_carried_groups == 2
    for live in (s, restored):
        batch, stats = _run_step(live, [], [])
        assert batch == ["a3", "a4"]
        assert stats.num_carried_in == 2
        assert stats.filtered_reward == pytest.approx(0.5)  # metric [1, 0] copied as reward
    assert restored.totals == s.totals
    assert restored.totals["num_steps"] == 2


def test_state_dict_is_a_snapshot() -> None:
    s = sampler(num_prompts_per_step=1, surplus="carry", max_carry_age=3)
    _run_step(s, ["a0", "a1"], [True, True])
    state = s.state_dict()
    _run_step(s, [], [])  # consumes a1 from the live sampler
    assert [item["group"] for item in state["carry"]] == ["a1"]
    assert state["carry"][0]["version"] == 0


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda st_: st_.update(format_version=3), "format_version"),
        (lambda st_: st_["carry"][0].update(version="1"), "version"),
        (lambda st_: st_["carry"][0].update(age=0), "keys"),
        (lambda st_: st_["carry"][0].update(num_samples=0), "num_samples"),
        (lambda st_: st_["totals"].pop("num_steps"), "totals"),
        (lambda st_: st_["totals"].update(num_steps=-3), "num_steps"),
        (lambda st_: st_.pop("carry"), "carry"),
        (lambda st_: st_["carry"][0].pop("group"), "keys"),
        (lambda st_: st_["carry"][0].update(reward_sum="1.0"), "reward_sum"),
    ],
)
def test_load_state_dict_rejects_malformed_state(mutate: Any, match: str) -> None:
    s = sampler(num_prompts_per_step=1, surplus="carry")
    _run_step(s, ["a0", "a1"], [True, True])
    state = s.state_dict()
    mutate(state)
    fresh = sampler(num_prompts_per_step=1, surplus="carry")
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(state)
    assert fresh.num_carried_groups == 0


def test_load_state_dict_refused_during_step() -> None:
    s = sampler(num_prompts_per_step=1)
    state = s.state_dict()
    s.start_step()
    with pytest.raises(RuntimeError, match="during a step"):
        s.load_state_dict(state)


# ------------------------------------------------------------------- auto batch multiplier


def _one_step(s: DynamicSampler[str], flags: list[bool]) -> float:
    """Run a step whose first round has `flags` (then all-valid rounds); its multiplier."""
    s.start_step()
    used = s.batch_multiplier
    names = [f"g{i}" for i in range(s.prompts_for_next_round())]
    round_flags = (flags + [True] * len(names))[: len(names)]
    s.add_round(*make_round(names, round_flags))
    while not s.is_complete():
        names = [f"h{i}" for i in range(s.prompts_for_next_round())]
        s.add_round(*make_round(names, [True] * len(names)))
    s.finish_step()
    return used


def test_auto_multiplier_follows_the_keep_rate_average_and_survives_state_dict() -> None:
    s = sampler(batch_multiplier=2.0, auto_max_multiplier=4.0, surplus="carry")
    # Step 1 at the initial 2.0: a round of 8 prompts keeps 2, a second round of
    # ceil(2 * 2) = 4 keeps 4 (2 carried): keep rate 6 / 12 = 0.5.
    assert _one_step(s, [True, True] + [False] * 6) == 2.0
    assert s.keep_rate_ema == pytest.approx(0.5)
    # Step 2 at auto_batch_multiplier(0.5) = 1.2 / 0.5 = 2.4: 2 carried groups pre-fill,
    # one round of ceil(2.4 * 2) = 5 prompts, all kept: rate 1.0, average 0.75.
    assert _one_step(s, [True] * 16) == pytest.approx(2.4)
    assert s.keep_rate_ema == pytest.approx(0.75)
    state = s.state_dict()
    resumed = sampler(batch_multiplier=2.0, auto_max_multiplier=4.0, surplus="carry")
    resumed.load_state_dict(state)
    # Step 3: 1.2 / 0.75 = 1.6 in the original and in the resumed sampler alike.
    assert _one_step(s, [True] * 16) == pytest.approx(1.6)
    assert _one_step(resumed, [True] * 16) == pytest.approx(1.6)


def test_a_step_filled_from_the_carry_alone_leaves_the_keep_rate_average() -> None:
    # 4 groups a step. Step 1: one round of 12 prompts, 9 vary (keep rate 0.75): 4 trained,
    # 5 carried. Step 2 is filled from the carry alone: it observed no keep rate (its
    # stats say 1.0 by convention), so the average stays 0.75 and the multiplier with it.
    # Averaged in, it would be 0.875: the next rounds sized for a keep rate never seen.
    s = sampler(batch_multiplier=3.0, auto_max_multiplier=4.0, surplus="carry")
    s.start_step()
    names = [f"g{i}" for i in range(s.prompts_for_next_round())]
    assert len(names) == 12
    s.add_round(*make_round(names, [True] * 9 + [False] * 3))
    s.finish_step()
    assert s.keep_rate_ema == pytest.approx(0.75)
    s.start_step()
    assert s.is_complete()
    _, stats = s.finish_step()
    assert (stats.num_prompts_generated, stats.keep_rate) == (0, 1.0)
    assert s.keep_rate_ema == pytest.approx(0.75)
    assert s.carried_versions == [0]  # the 5th group, generated at step 1's version 0
    s.start_step()
    assert s.batch_multiplier == pytest.approx(1.2 / 0.75)
    assert s.carried_versions == []  # two versions old at step 3: dropped


def test_fixed_multiplier_never_changes_and_old_states_load() -> None:
    s = sampler(batch_multiplier=1.5)
    for _ in range(3):
        assert _one_step(s, [True, False, True, False, True, False]) == 1.5
    state = s.state_dict()
    del state["keep_rate_ema"]  # saved before the average was part of the state
    s.load_state_dict(state)
    assert s.keep_rate_ema is None
    with pytest.raises(ValueError, match="keep_rate_ema"):
        s.load_state_dict({**s.state_dict(), "keep_rate_ema": 1.5})


# ------------------------------------------------------------- policy versions (staleness)


def test_a_round_older_than_the_bound_or_from_the_future_is_refused() -> None:
    s = sampler(num_prompts_per_step=2, max_carry_age=2, streaming=True)
    s.start_step(version=5)
    assert [s.is_stale(v) for v in (2, 3, 4, 5)] == [True, False, False, False]
    with pytest.raises(ValueError, match="version 2 cannot train at version 5"):
        s.add_round(*make_round(["old"], [True]), version=2)
    with pytest.raises(ValueError, match="version 6 cannot train at version 5"):
        s.add_round(*make_round(["future"], [True]), version=6)
    s.add_round(*make_round(["a", "b"], [True, True]), version=3)
    batch, _ = s.finish_step()
    assert batch == ["a", "b"]


def test_carried_groups_age_by_the_versions_they_were_generated_at() -> None:
    # Bound 1: a surplus group of version 3 trains at version 4, not at version 5.
    s = sampler(num_prompts_per_step=1, surplus="carry", max_carry_age=1, streaming=True)
    s.start_step(version=4)
    s.add_round(*make_round(["v3a", "v3b", "v3c"], [True, True, True]), version=3)
    batch, stats = s.finish_step()
    assert batch == ["v3a"] and stats.num_carried_groups == 2
    s.start_step(version=5)  # both carried groups are now 2 behind: dropped
    assert s.num_kept_groups == 0 and s.num_carried_groups == 0
    s.add_round(*make_round(["v4"], [True]), version=4)
    batch, stats = s.finish_step()
    assert batch == ["v4"]
    assert stats.num_discarded_valid_samples == 2 * N


def test_a_step_keeps_arrival_order_and_versions_only_grow() -> None:
    s = sampler(num_prompts_per_step=2, surplus="carry", max_carry_age=3, streaming=True)
    s.start_step(version=2)
    s.add_round(*make_round(["v2a"], [True]), version=2)
    s.add_round(*make_round(["v1a", "v1b", "v1c"], [True, True, True]), version=1)
    batch, _ = s.finish_step()
    assert batch == ["v2a", "v1a"]  # arrival order within a step
    s.start_step(version=3)
    batch, _ = s.finish_step()
    assert batch == ["v1b", "v1c"]
    with pytest.raises(ValueError, match="version"):
        s.start_step(version=2)


def test_streaming_max_gen_batches_counts_full_rounds_of_prompts() -> None:
    # 4 prompts per step at multiplier 2: a round is 8 prompts; max_gen_batches=1 allows
    # 8 prompts whatever the request size (3 per request here).
    s = sampler(num_prompts_per_step=4, batch_multiplier=2.0, max_gen_batches=1, streaming=True)
    s.start_step(version=0)
    s.add_round(*make_round(["a", "b", "c"], [False] * 3))
    s.add_round(*make_round(["d", "e", "f"], [False] * 3))
    with pytest.raises(DynamicSamplingExhausted, match="observed keep rate 0.000"):
        s.add_round(*make_round(["g", "h", "i"], [False] * 3))


def test_format_1_state_converts_ages_to_versions() -> None:
    # Saved after 5 synchronous steps: age 0 was generated by step 4, age 1 by step 3.
    s = sampler(num_prompts_per_step=1, surplus="carry", max_carry_age=1)
    totals = dict.fromkeys(s.totals, 0)
    totals["num_steps"] = 5
    s.load_state_dict(
        {
            "format_version": 1,
            "carry": [
                {"group": "age1", "age": 1, "reward_sum": 0.0, "num_samples": N},
                {"group": "age0", "age": 0, "reward_sum": 0.0, "num_samples": N},
            ],
            "totals": totals,
        }
    )
    assert [item["version"] for item in s.state_dict()["carry"]] == [3, 4]
    s.start_step()  # version 5: age1 (version 3) is 2 behind and dropped
    batch, stats = s.finish_step()
    assert batch == ["age0"]
    assert stats.num_discarded_valid_samples == N
