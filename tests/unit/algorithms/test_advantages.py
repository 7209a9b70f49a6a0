"""Group-relative advantages (algorithms/advantages.py).

Their spread over a sample's tokens (algorithms/loss.py's expand_advantages) is in
algorithms/test_loss.py."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.algorithms.advantages import group_advantages

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
