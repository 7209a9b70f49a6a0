"""Group-relative advantages (algorithms/advantages.py).

Their spread over a sample's tokens (algorithms/loss.py's expand_advantages) is in
algorithms/test_loss.py."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.algorithms.advantages import STD_OVER, group_advantages

# One correct answer out of four: mean 0.25, deviations [0.75, -0.25, -0.25, -0.25],
# unbiased variance (0.75^2 + 3 * 0.25^2) / (4 - 1) = 0.75 / 3 = 0.25, std 0.5.
ONE_OF_FOUR = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)


def test_default_is_mean_centred_over_unbiased_std() -> None:
    out = group_advantages(ONE_OF_FOUR, eps=0.0)
    # 0.75 / 0.5 = 1.5 and -0.25 / 0.5 = -0.5 (a biased std, sqrt(0.1875), would give 1.732)
    torch.testing.assert_close(out, torch.tensor([[1.5, -0.5, -0.5, -0.5]], dtype=torch.float64))


def test_default_eps_is_small_and_used() -> None:
    out = group_advantages(ONE_OF_FOUR)
    # 0.75 / (0.5 + 1e-6) = 1.499997...
    assert out[0, 0].item() == pytest.approx(0.75 / (0.5 + 1e-6), rel=1e-12)
    rewards = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    big_eps = group_advantages(rewards, eps=1.0)
    # mean 0.5, std sqrt((0.25 + 0.25) / 1) = 0.70711; 0.5 / 1.70711 = 0.29289
    expected = 0.5 / (math.sqrt(0.5) + 1.0)
    torch.testing.assert_close(big_eps, torch.tensor([[expected, -expected]], dtype=torch.float64))


def test_no_std_normalisation() -> None:
    out = group_advantages(ONE_OF_FOUR, norm_by_std=False)
    # r - 0.25
    torch.testing.assert_close(
        out, torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64)
    )


def test_leave_one_out_without_std() -> None:
    out = group_advantages(ONE_OF_FOUR, norm_by_std=False, leave_one_out=True)
    # sample 0: 1 - (0 + 0 + 0) / 3 = 1; others: 0 - (1 + 0 + 0) / 3 = -1/3
    third = 1.0 / 3.0
    torch.testing.assert_close(
        out, torch.tensor([[1.0, -third, -third, -third]], dtype=torch.float64)
    )


def test_leave_one_out_with_std() -> None:
    out = group_advantages(ONE_OF_FOUR, leave_one_out=True, eps=0.0)
    # the leave-one-out values above divided by std 0.5: 2 and -2/3
    two_thirds = 2.0 / 3.0
    torch.testing.assert_close(
        out, torch.tensor([[2.0, -two_thirds, -two_thirds, -two_thirds]], dtype=torch.float64)
    )


def test_several_groups_are_independent() -> None:
    rewards_GN = torch.tensor([[2.0, 4.0], [0.0, 1.0], [5.0, 5.0]], dtype=torch.float64)
    out = group_advantages(rewards_GN, eps=0.0)
    # row 0: mean 3, std sqrt((1 + 1) / 1) = sqrt(2) -> -+1/sqrt(2)
    # row 1: mean 0.5, std sqrt(0.5) -> -+0.5/sqrt(0.5) = -+1/sqrt(2); row 2: constant -> 0
    h = 1.0 / math.sqrt(2.0)
    torch.testing.assert_close(
        out, torch.tensor([[-h, h], [-h, h], [0.0, 0.0]], dtype=torch.float64)
    )
    loo = group_advantages(rewards_GN, norm_by_std=False, leave_one_out=True)
    # row 0: 2 - 4 = -2, 4 - 2 = 2; row 1: 0 - 1 = -1, 1 - 0 = 1; row 2: 0
    torch.testing.assert_close(
        loo, torch.tensor([[-2.0, 2.0], [-1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    )


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_constant_groups_are_exactly_zero(
    norm_by_std: bool, leave_one_out: bool, eps: float
) -> None:
    # 0.1 is inexact in binary: the mean of three copies can differ from 0.1 by rounding,
    # which without the explicit zeroing would leak a tiny / eps advantage.
    rewards_GN = torch.tensor([[0.1, 0.1, 0.1], [-7.0, -7.0, -7.0], [1.0, 0.0, 1.0]])
    out = group_advantages(
        rewards_GN, norm_by_std=norm_by_std, leave_one_out=leave_one_out, eps=eps
    )
    assert torch.equal(out[:2], torch.zeros(2, 3))
    assert (out[2] != 0).all()


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("leave_one_out", [True, False])
def test_single_sample_groups_get_zero(norm_by_std: bool, leave_one_out: bool) -> None:
    rewards_GN = torch.tensor([[3.0], [-5.0]])
    out = group_advantages(rewards_GN, norm_by_std=norm_by_std, leave_one_out=leave_one_out)
    assert torch.equal(out, torch.zeros(2, 1))


def test_dtype_handling_and_empty() -> None:
    out = group_advantages(torch.tensor([[1, 0]]), eps=0.0)
    # ints promote to float: mean 0.5, std sqrt(0.5); 0.5 / sqrt(0.5) = sqrt(0.5)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out, torch.tensor([[math.sqrt(0.5), -math.sqrt(0.5)]]))
    bools = group_advantages(torch.tensor([[True, False]]), norm_by_std=False)
    torch.testing.assert_close(bools, torch.tensor([[0.5, -0.5]]))
    assert (
        group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16)).dtype == torch.bfloat16
    )
    assert group_advantages(torch.empty(0, 4)).shape == (0, 4)


def test_input_not_modified() -> None:
    rewards_GN = ONE_OF_FOUR.clone()
    group_advantages(rewards_GN, leave_one_out=True)
    assert torch.equal(rewards_GN, ONE_OF_FOUR)


@pytest.mark.parametrize(
    ("rewards", "kwargs", "match"),
    [
        (torch.zeros(4), {}, "rewards_GN"),
        (torch.zeros(2, 2, 2), {}, "rewards_GN"),
        (torch.zeros(3, 0), {}, "N >= 1"),
        (torch.tensor([[1.0, float("nan")]]), {}, "finite"),
        (torch.tensor([[1.0, float("inf")]]), {}, "finite"),
        (torch.zeros(1, 2), {"eps": -1e-6}, "eps"),
        (torch.zeros(1, 2), {"eps": float("nan")}, "eps"),
        (torch.zeros(1, 2), {"eps": True}, "eps"),
    ],
)
def test_rejects_bad_args(rewards: torch.Tensor, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, **kwargs)


rewards_strategy = st.integers(min_value=1, max_value=6).flatmap(
    lambda n: st.lists(
        st.lists(st.floats(-100.0, 100.0), min_size=n, max_size=n), min_size=1, max_size=6
    )
)
modes = st.sampled_from([(True, False), (False, False), (True, True), (False, True)])


@settings(max_examples=60, deadline=None)
@given(rows=rewards_strategy, mode=modes)
def test_property_rows_sum_to_zero_and_finite(
    rows: list[list[float]], mode: tuple[bool, bool]
) -> None:
    norm_by_std, leave_one_out = mode
    rewards_GN = torch.tensor(rows, dtype=torch.float64)
    out = group_advantages(rewards_GN, norm_by_std=norm_by_std, leave_one_out=leave_one_out)
    assert torch.isfinite(out).all()
    # Both baselines are zero-sum: leave-one-out is N/(N-1) times the mean-centred value.
    scale = 1.0 if norm_by_std else 1.0 + rewards_GN.abs().max().item()
    torch.testing.assert_close(
        out.sum(dim=1), torch.zeros(len(rows), dtype=torch.float64), atol=1e-8 * scale, rtol=0
    )


@settings(max_examples=60, deadline=None)
@given(rows=rewards_strategy, mode=modes, shift=st.floats(-50.0, 50.0))
def test_property_shift_invariant(
    rows: list[list[float]], mode: tuple[bool, bool], shift: float
) -> None:
    norm_by_std, leave_one_out = mode
    rewards_GN = torch.tensor(rows, dtype=torch.float64)
    kwargs = dict(norm_by_std=norm_by_std, leave_one_out=leave_one_out, eps=1e-3)
    base = group_advantages(rewards_GN, **kwargs)
    shifted = group_advantages(rewards_GN + shift, **kwargs)
    # Adding `shift` may merge nearly-equal values into a constant group; compare the others.
    still_varied = (rewards_GN + shift).amax(dim=1) != (rewards_GN + shift).amin(dim=1)
    torch.testing.assert_close(shifted[still_varied], base[still_varied], atol=1e-6, rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(rows=rewards_strategy, leave_one_out=st.booleans())
def test_property_matches_definition(rows: list[list[float]], leave_one_out: bool) -> None:
    eps = 1e-2
    out = group_advantages(
        torch.tensor(rows, dtype=torch.float64), leave_one_out=leave_one_out, eps=eps
    )
    for g, row in enumerate(rows):
        n = len(row)
        if n == 1 or max(row) == min(row):
            assert out[g].tolist() == [0.0] * n
            continue
        std = statistics.stdev(row)  # Bessel-corrected, independently of torch
        total = sum(row)
        for i, r in enumerate(row):
            baseline = (total - r) / (n - 1) if leave_one_out else total / n
            assert out[g, i].item() == pytest.approx((r - baseline) / (std + eps), abs=1e-7)


# ----------------------------------------------------------------------------------------
# The leave-one-out estimator normalised by the others' std (dapo.advantage.std_over:
# others), checked against NeMo RL's estimator written out by hand in float64.
#
# NeMo RL (7ea279ab) nemo_rl/algorithms/utils.py calculate_baseline_and_std_per_prompt with
# leave_one_out_baseline=True: for sample i of a group of N, num_valid = N - 1,
# baseline_i = sum_{j != i} r_j / (N - 1), and
# std_i = sqrt((mean_{j != i} r_j^2 - baseline_i^2) * (N - 1) / (N - 2)), nan -> 0 (the
# unbiased std of the N - 1 others). advantage_estimator.py GRPOAdvantageEstimator:
# a_i = r_i - baseline_i, divided by (std_i + 1e-6) only where std_i > 0.

NEMO_EPS = 1e-6  # advantage_estimator.py: `epsilon = 1e-6`


def nemo_rl_grpo(rewards: list[float]) -> list[float]:
    """NeMo RL's leave-one-out GRPO advantage of one group, in float64 (by hand)."""
    n = len(rewards)
    if n <= 1:
        return [0.0] * n  # `valid_mask.sum() <= 1`: baseline = reward
    out = []
    for i, r in enumerate(rewards):
        others = [x for j, x in enumerate(rewards) if j != i]
        m = n - 1
        baseline = sum(others) / m
        mean_sq = sum(x * x for x in others) / m
        if m == 1:
            std = 0.0  # (0 * inf) is nan -> nan_to_num(0)
        else:
            var = (mean_sq - baseline * baseline) * (m / (m - 1))
            std = math.sqrt(var) if var > 0 else 0.0
        adv = r - baseline
        out.append(adv / (std + NEMO_EPS) if std > 1e-12 else adv)
    return out


def _ours(rewards: list[list[float]]) -> torch.Tensor:
    return group_advantages(
        torch.tensor(rewards, dtype=torch.float64),
        norm_by_std=True,
        leave_one_out=True,
        eps=NEMO_EPS,
        std_over="others",
    )


def test_one_of_four_by_hand() -> None:
    # [1, 0, 0, 0]: sample 0's others agree (std 0): left unscaled, 1 - 0 = 1. Sample 1's
    # others are [1, 0, 0]: baseline 1/3, unbiased std sqrt(1/3); (0 - 1/3) / sqrt(1/3).
    out = _ours([[1.0, 0.0, 0.0, 0.0]])
    b = -(1 / 3) / (math.sqrt(1 / 3) + NEMO_EPS)
    torch.testing.assert_close(out, torch.tensor([[1.0, b, b, b]], dtype=torch.float64))
    # the whole group's std (0.5) would have given 4/3 * 0.75 / 0.5 = 2.0 for sample 0
    whole = group_advantages(
        torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64), leave_one_out=True, eps=NEMO_EPS
    )
    assert whole[0, 0] == pytest.approx(2.0, rel=1e-5)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
def test_matches_nemo_rl_on_random_groups(n: int) -> None:
    rng = random.Random(n)
    groups = []
    for _ in range(40):
        kind = rng.random()
        if kind < 0.4:  # binary rewards, as a math verifier gives
            groups.append([float(rng.random() < 0.3) for _ in range(n)])
        elif kind < 0.8:  # shaped rewards in [-1, 1]
            groups.append([rng.choice([-1.0, 1.0]) - rng.random() * 0.5 for _ in range(n)])
        else:  # continuous
            groups.append([rng.gauss(0.0, 2.0) for _ in range(n)])
    out = _ours(groups)
    expected = torch.tensor([nemo_rl_grpo(g) for g in groups], dtype=torch.float64)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


def test_constant_group_is_zero_and_pair_is_unscaled() -> None:
    out = _ours([[0.5, 0.5, 0.5], [1.0, 0.0, 0.0]])
    assert out[0].tolist() == [0.0, 0.0, 0.0]
    # N = 2: one other sample has no spread, NeMo RL leaves r_i - r_j unscaled
    torch.testing.assert_close(
        _ours([[1.0, 0.0]]), torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    )


def test_others_without_norm_is_the_plain_baseline() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 0.5]], dtype=torch.float64)
    a = group_advantages(r, norm_by_std=False, leave_one_out=True, std_over="others")
    b = group_advantages(r, norm_by_std=False, leave_one_out=True, std_over="group")
    torch.testing.assert_close(a, b)


def test_std_over_is_checked() -> None:
    assert STD_OVER == ("group", "others")
    with pytest.raises(ValueError, match="std_over"):
        group_advantages(torch.zeros(1, 4), std_over="batch")


def test_the_trainer_batch_uses_the_configured_std_over() -> None:
    """controller/rollouts/rollout_groups.py build_policy_batch passes dapo.advantage.std_over: the
    advantages a policy step trains on are NeMo RL's for an imported NeMo RL recipe."""
    from pathlib import Path

    from dapo_megatron.config.loader import load_config
    from dapo_megatron.controller.rollouts.rollout_groups import RolloutGroup, build_policy_batch
    from dapo_megatron.shared.sampling import Sample

    tiny = Path(__file__).resolve().parents[3] / "recipes" / "dapo-tiny-cpu.yaml"
    rewards = [1.0, 0.0, 0.0, 0.5]
    samples = [Sample([5, 6], [-0.1, -0.2], "stop") for _ in rewards]
    group = RolloutGroup([1, 2], "x", samples, rewards, rewards, [0.0] * 4)
    got = {}
    for over in STD_OVER:
        overrides = ["dapo.advantage.leave_one_out=true", f"dapo.advantage.std_over={over}"]
        config = load_config(tiny, overrides).config
        got[over] = build_policy_batch([group], config, pad_id=0).advantages.double()
        want = group_advantages(
            torch.tensor([rewards], dtype=torch.float64), leave_one_out=True, std_over=over
        )
        torch.testing.assert_close(got[over], want.reshape(-1), rtol=1e-6, atol=1e-6)
    # NeMo RL's (others) is not the whole group's on this group
    expected = torch.tensor(nemo_rl_grpo(rewards), dtype=torch.float64)
    torch.testing.assert_close(got["others"], expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got["group"], got["others"])
