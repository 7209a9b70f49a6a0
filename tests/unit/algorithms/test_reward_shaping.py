"""Reward shaping: dapo_megatron.algorithms.reward_shaping (scaling, soft overlong penalty, overlong
filter) and its shape_rewards, which applies them to each round's rollouts under the run's
validated RewardShaping."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.algorithms.reward_shaping import (
    overlong_filter_mask,
    scale_rewards,
    shape_rewards,
    soft_overlong_penalty,
    truncated_from_finish_reasons,
)
from dapo_megatron.algorithms.shaping_limits import OverlongPenalty, RewardShaping, ScoreScaling
from dapo_megatron.config.loader import load_config

# ------------------------------------------------------------------------------ scale_rewards


def test_scale_rewards_unit_interval_to_symmetric() -> None:
    rewards_B = torch.tensor([0.0, 0.25, 0.5, 1.0])
    out = scale_rewards(rewards_B, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0)
    # -1 + r * (1 - (-1)) / (1 - 0): 0 -> -1, 0.25 -> -0.5, 0.5 -> 0, 1 -> 1
    torch.testing.assert_close(out, torch.tensor([-1.0, -0.5, 0.0, 1.0]))


def test_scale_rewards_clamps_before_mapping() -> None:
    rewards_B = torch.tensor([-3.0, 1.5, 7.0])
    out = scale_rewards(rewards_B, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0)
    # -3 clamps to 0 -> -1; 1.5 and 7 clamp to 1 -> 1
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0, 1.0]))


def test_scale_rewards_general_ranges() -> None:
    rewards_B = torch.tensor([1.0, -1.0, 3.0])
    out = scale_rewards(rewards_B, source_min=-1.0, source_max=3.0, target_min=0.0, target_max=10.0)
    # (1 - (-1)) / (3 - (-1)) = 0.5 -> 0 + 0.5 * 10 = 5; ends map to 0 and 10
    torch.testing.assert_close(out, torch.tensor([5.0, 0.0, 10.0]))


def test_scale_rewards_flipped_target() -> None:
    out = scale_rewards(
        torch.tensor([0.25]), source_min=0.0, source_max=1.0, target_min=1.0, target_max=0.0
    )
    # 1 + 0.25 * (0 - 1) = 0.75
    torch.testing.assert_close(out, torch.tensor([0.75]))


def test_scale_rewards_promotes_integers_and_keeps_input() -> None:
    rewards_B = torch.tensor([0, 1, 1])
    out = scale_rewards(rewards_B, source_min=0, source_max=1, target_min=-1, target_max=1)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0, 1.0]))
    assert rewards_B.tolist() == [0, 1, 1]


def test_scale_rewards_empty() -> None:
    out = scale_rewards(torch.empty(0), source_min=0, source_max=1, target_min=-1, target_max=1)
    assert out.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(source_min=1.0, source_max=1.0, target_min=0.0, target_max=1.0), "source_max"),
        (dict(source_min=2.0, source_max=1.0, target_min=0.0, target_max=1.0), "source_max"),
        (
            dict(source_min=0.0, source_max=float("inf"), target_min=0.0, target_max=1.0),
            "source_max",
        ),
        (
            dict(source_min=0.0, source_max=1.0, target_min=float("nan"), target_max=1.0),
            "target_min",
        ),
        (dict(source_min=0.0, source_max=1.0, target_min=0.0, target_max="1"), "target_max"),
    ],
)
def test_scale_rewards_rejects_bad_bounds(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        scale_rewards(torch.tensor([0.5]), **kwargs)


def test_scale_rewards_rejects_nan_rewards() -> None:
    with pytest.raises(ValueError, match="rewards_B"):
        scale_rewards(
            torch.tensor([0.5, float("nan")]),
            source_min=0.0,
            source_max=1.0,
            target_min=-1.0,
            target_max=1.0,
        )


finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(min_value=-1e4, max_value=1e4), min_size=1, max_size=20),
    lo=finite,
    width=st.floats(min_value=1e-2, max_value=1e3),
    t_lo=finite,
    t_hi=finite,
)
def test_scale_rewards_properties(
    values: list[float], lo: float, width: float, t_lo: float, t_hi: float
) -> None:
    rewards_B = torch.tensor(values, dtype=torch.float64)
    out = scale_rewards(
        rewards_B, source_min=lo, source_max=lo + width, target_min=t_lo, target_max=t_hi
    )
    tol = 1e-9 * (1 + abs(t_lo) + abs(t_hi))
    assert out.min() >= min(t_lo, t_hi) - tol
    assert out.max() <= max(t_lo, t_hi) + tol
    # The map is monotone: it preserves (or, for a flipped target, reverses) the order.
    order = torch.argsort(rewards_B)
    diffs = torch.diff(out[order])
    if t_hi >= t_lo:
        assert (diffs >= -tol).all()
    else:
        assert (diffs <= tol).all()


# ---------------------------------------------------------------------- soft_overlong_penalty

LMAX, LCACHE = 20, 4  # ramp from Lmax - Lcache = 16 to 20


def _penalty(lengths: list[float], factor: float = 1.0) -> torch.Tensor:
    return soft_overlong_penalty(
        torch.tensor(lengths),
        max_response_length=LMAX,
        buffer_length=LCACHE,
        penalty_factor=factor,
    )


def test_soft_overlong_penalty_piecewise_values() -> None:
    out = _penalty([0, 10, 16, 17, 18, 19, 20])
    # L <= 16 -> 0; (16 - 17) / 4 = -0.25; (16 - 18) / 4 = -0.5; (16 - 19) / 4 = -0.75;
    # L = Lmax = 20: (16 - 20) / 4 = -1 = -factor
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0]))


def test_soft_overlong_penalty_edges() -> None:
    # L = Lmax - Lcache -> exactly 0; L = Lmax -> exactly -factor; zero-length -> 0
    out = _penalty([16, 20, 0], factor=0.7)
    assert torch.equal(out, torch.tensor([0.0, -0.7, 0.0]))
    # L = Lmax - Lcache + 1: (16 - 17) / 4 * 0.7 = -0.175
    torch.testing.assert_close(_penalty([17], factor=0.7), torch.tensor([-0.175]))


def test_soft_overlong_penalty_beyond_cap_is_clamped() -> None:
    out = _penalty([21, 40, 10_000], factor=0.5)
    # L > Lmax -> -factor = -0.5 (the raw linear formula would give (16 - 40) / 4 * 0.5 = -3)
    torch.testing.assert_close(out, torch.tensor([-0.5, -0.5, -0.5]))


def test_soft_overlong_penalty_scales_with_factor_and_float_lengths() -> None:
    # factor 0.5: (16 - 19) / 4 * 0.5 = -0.375; float length 17.5: (16 - 17.5) / 4 * 2 = -0.75
    torch.testing.assert_close(_penalty([19.0], factor=0.5), torch.tensor([-0.375]))
    torch.testing.assert_close(_penalty([17.5], factor=2.0), torch.tensor([-0.75]))


def test_soft_overlong_penalty_zero_factor_and_dtypes() -> None:
    out = _penalty([0, 18, 25], factor=0.0)
    assert (out == 0).all()
    int_out = soft_overlong_penalty(
        torch.tensor([18], dtype=torch.int64),
        max_response_length=LMAX,
        buffer_length=LCACHE,
        penalty_factor=1.0,
    )
    assert int_out.dtype == torch.get_default_dtype()
    f64 = soft_overlong_penalty(
        torch.tensor([18.0], dtype=torch.float64),
        max_response_length=LMAX,
        buffer_length=LCACHE,
        penalty_factor=1.0,
    )
    assert f64.dtype == torch.float64
    assert soft_overlong_penalty(
        torch.empty(0, dtype=torch.long), max_response_length=2, buffer_length=1, penalty_factor=1.0
    ).shape == (0,)


@pytest.mark.parametrize(
    ("lengths", "max_len", "buffer", "factor", "match"),
    [
        ([1], 20, 0, 1.0, "buffer_length"),
        ([1], 20, 20, 1.0, "buffer_length"),
        ([1], 20, 25, 1.0, "buffer_length"),
        ([1], 20, -1, 1.0, "buffer_length"),
        ([1], 20, 4, -0.1, "penalty_factor"),
        ([1], 20, 4, float("nan"), "penalty_factor"),
        ([1], 20.0, 4, 1.0, "max_response_length"),
        ([1], True, 4, 1.0, "max_response_length"),
        ([1], 20, 4.0, 1.0, "buffer_length"),
        ([3, -1], 20, 4, 1.0, "response_lengths_B"),
        ([3.0, float("nan")], 20, 4, 1.0, "response_lengths_B"),
        ([[1, 2]], 20, 4, 1.0, "response_lengths_B"),
    ],
)
def test_soft_overlong_penalty_rejects_bad_args(
    lengths: list, max_len: int, buffer: int, factor: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        soft_overlong_penalty(
            torch.tensor(lengths),
            max_response_length=max_len,
            buffer_length=buffer,
            penalty_factor=factor,
        )


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    max_len=st.integers(min_value=2, max_value=4096),
    factor=st.floats(min_value=0.0, max_value=100.0),
)
def test_soft_overlong_penalty_bounded_and_monotone(
    data: st.DataObject, max_len: int, factor: float
) -> None:
    buffer = data.draw(st.integers(min_value=1, max_value=max_len - 1))
    lengths = data.draw(st.lists(st.integers(0, 3 * max_len), min_size=1, max_size=30))
    lengths_B = torch.tensor(sorted(lengths))
    out = soft_overlong_penalty(
        lengths_B, max_response_length=max_len, buffer_length=buffer, penalty_factor=factor
    )
    assert (out >= -factor).all() and (out <= 0).all()
    # Longer responses are never penalised less.
    assert (torch.diff(out) <= 0).all()
    assert (out[lengths_B <= max_len - buffer] == 0).all()
    assert (out[lengths_B >= max_len] == -factor).all()


# ------------------------------------------- shape_rewards: the shaping rollouts go through

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "dapo-tiny-cpu.yaml"


@functools.cache
def _shaping(penalty_factor: float) -> RewardShaping:
    """The tiny recipe's run plan shaping (Lmax = 16, Lcache = 4: the ramp runs from 12 to 16)
    with reward scaling off, so that shape_rewards adds the soft overlong penalty alone."""
    return load_config(
        RECIPE,
        [
            "dapo.reward_scaling.enabled=false",
            "dapo.overlong_buffer.enabled=true",
            f"dapo.overlong_buffer.penalty_factor={penalty_factor}",
        ],
    ).plan.reward_shaping


def test_shape_rewards_adds_the_penalty_to_the_score() -> None:
    shaping = _shaping(1.0)
    assert shaping == RewardShaping(scaling=None, overlong=OverlongPenalty(16, 4, 1.0))
    scores_B = torch.tensor([1.0, -1.0, 0.5])
    rewards_B, penalty_B = shape_rewards(scores_B, torch.tensor([10, 14, 30]), shaping)
    # 1 + 0; -1 + (12 - 14) / 4 = -1.5; 0.5 + (-1, beyond the cap) = -0.5
    torch.testing.assert_close(penalty_B, torch.tensor([0.0, -0.5, -1.0], dtype=torch.float64))
    torch.testing.assert_close(rewards_B, torch.tensor([1.0, -1.5, -0.5], dtype=torch.float64))
    assert scores_B.tolist() == [1.0, -1.0, 0.5]


@pytest.mark.parametrize("factor", [0.0, 0.5, 1.0, 2.0])
@settings(max_examples=40, deadline=None)
@given(pairs=st.lists(st.tuples(st.floats(-1.0, 1.0), st.integers(0, 40)), min_size=1, max_size=20))
def test_shape_rewards_stays_within_factor_of_score(
    factor: float, pairs: list[tuple[float, int]]
) -> None:
    scores_B = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    lengths_B = torch.tensor([p[1] for p in pairs])
    rewards_B, _ = shape_rewards(scores_B, lengths_B, _shaping(factor))
    delta = rewards_B - scores_B
    assert (delta <= 1e-12).all() and (delta >= -factor - 1e-12).all()


def test_shape_rewards_matches_the_loose_functions() -> None:
    """Both parts on: the per-round path gives the numbers of scale_rewards +
    soft_overlong_penalty (the penalty in the default float dtype, as before)."""
    shaping = RewardShaping(ScoreScaling(0.0, 1.0, -1.0, 1.0), OverlongPenalty(16, 4, 0.5))
    scores_B = torch.tensor([0.0, 0.25, 1.0, 2.0], dtype=torch.float64)
    lengths_B = torch.tensor([3, 13, 15, 40])
    rewards_B, penalty_B = shape_rewards(scores_B, lengths_B, shaping)
    scaled = scale_rewards(
        scores_B, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0
    )
    penalty = soft_overlong_penalty(
        lengths_B, max_response_length=16, buffer_length=4, penalty_factor=0.5
    ).double()
    assert torch.equal(penalty_B, penalty)
    assert torch.equal(rewards_B, scaled + penalty)


def test_shape_rewards_does_not_validate_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shaping was validated when the run plan built it: the per-round call never
    re-checks it (every limit check raises here) but still checks the round's data."""
    from dapo_megatron.algorithms import shaping_limits

    shaping = RewardShaping(ScoreScaling(0.0, 1.0, -1.0, 1.0), OverlongPenalty(16, 4, 1.0))

    def revalidated(**_: object) -> list[object]:
        raise AssertionError("the per-round shaping validated its settings again")

    monkeypatch.setattr(shaping_limits, "scaling_problems", revalidated)
    monkeypatch.setattr(shaping_limits, "overlong_problems", revalidated)
    with pytest.raises(AssertionError, match="validated its settings again"):
        OverlongPenalty(16, 4, 1.0)  # the patch is live where the limits are checked
    rewards_B, _ = shape_rewards(torch.tensor([1.0, 0.0]), torch.tensor([10, 14]), shaping)
    torch.testing.assert_close(rewards_B, torch.tensor([1.0, -1.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN"):
        shape_rewards(torch.tensor([float("nan")]), torch.tensor([1]), shaping)


# ------------------------------------------------------------------------ overlong_filter_mask


def test_overlong_filter_mask_zeroes_truncated_rows() -> None:
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    truncated_B = torch.tensor([False, True, False])
    out = overlong_filter_mask(mask_BT, truncated_B)
    # only row 1 (truncated) becomes all zeros
    assert out.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert out.dtype == mask_BT.dtype
    # the input is untouched and the output is not a view of it
    assert mask_BT[1].tolist() == [1.0, 1.0, 1.0]
    out[0, 0] = 5.0
    assert mask_BT[0, 0] == 1.0


def test_overlong_filter_mask_bool_and_int_masks() -> None:
    mask_BT = torch.tensor([[True, True], [True, False]])
    out = overlong_filter_mask(mask_BT, torch.tensor([True, False]))
    assert out.dtype == torch.bool
    assert out.tolist() == [[False, False], [True, False]]
    int_out = overlong_filter_mask(torch.ones(2, 2, dtype=torch.int32), torch.tensor([False, True]))
    assert int_out.tolist() == [[1, 1], [0, 0]]


def test_overlong_filter_mask_nothing_truncated_and_empty() -> None:
    mask_BT = torch.tensor([[1.0, 0.0]])
    assert overlong_filter_mask(mask_BT, torch.tensor([False])).tolist() == [[1.0, 0.0]]
    empty = overlong_filter_mask(torch.zeros(0, 5), torch.zeros(0, dtype=torch.bool))
    assert empty.shape == (0, 5)


@pytest.mark.parametrize(
    ("mask", "truncated", "match"),
    [
        (torch.ones(3), torch.tensor([True, False, True]), "mask_BT"),
        (torch.ones(3, 2), torch.tensor([True, False]), "truncated_B"),
        (torch.ones(2, 2), torch.tensor([[True, False]]), "truncated_B"),
        (torch.ones(2, 2), torch.tensor([1, 0]), "truncated_B"),
    ],
)
def test_overlong_filter_mask_rejects_bad_args(
    mask: torch.Tensor, truncated: torch.Tensor, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        overlong_filter_mask(mask, truncated)


def _bits_row(bits: list[bool], row: int, tokens: int) -> list[float]:
    return [float(x) for x in bits[row * tokens : (row + 1) * tokens]]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), batch=st.integers(0, 8), tokens=st.integers(0, 8))
def test_overlong_filter_mask_property(data: st.DataObject, batch: int, tokens: int) -> None:
    bits = data.draw(st.lists(st.booleans(), min_size=batch * tokens, max_size=batch * tokens))
    flags = data.draw(st.lists(st.booleans(), min_size=batch, max_size=batch))
    mask_BT = torch.tensor(bits, dtype=torch.float32).reshape(batch, tokens)
    truncated_B = torch.tensor(flags, dtype=torch.bool)
    before = mask_BT.clone()
    out = overlong_filter_mask(mask_BT, truncated_B)
    assert torch.equal(mask_BT, before)
    for b in range(batch):
        expected = [0.0] * tokens if flags[b] else _bits_row(bits, b, tokens)
        assert out[b].tolist() == expected


# ---------------------------------------------------------------- truncated_from_finish_reasons


def test_truncated_from_finish_reasons() -> None:
    out = truncated_from_finish_reasons(["stop", "length", "stop", "length"])
    assert out.dtype == torch.bool
    assert out.tolist() == [False, True, False, True]
    assert truncated_from_finish_reasons(("stop",)).tolist() == [False]
    empty = truncated_from_finish_reasons([])
    assert empty.dtype == torch.bool and empty.shape == (0,)


@pytest.mark.parametrize("bad", ["abort", "Length", None, ""])
def test_truncated_from_finish_reasons_rejects_unknown(bad: object) -> None:
    with pytest.raises(ValueError, match=r"finish_reasons\[1\].*" + repr(bad).replace("'", ".")):
        truncated_from_finish_reasons(["stop", bad])  # type: ignore[list-item]


def test_truncated_from_finish_reasons_rejects_bare_string() -> None:
    with pytest.raises(ValueError, match="finish_reasons"):
        truncated_from_finish_reasons("stop")


def test_finish_reasons_feed_overlong_filter() -> None:
    truncated_B = truncated_from_finish_reasons(["length", "stop"])
    out = overlong_filter_mask(torch.ones(2, 3), truncated_B)
    # the "length" sample's row is dropped, the "stop" sample's row stays
    assert out.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
