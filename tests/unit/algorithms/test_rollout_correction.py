"""Tests of dapo_megatron.algorithms.rollout_correction: TIS/MIS weights and mismatch metrics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.algorithms.rollout_correction import (
    MISMATCH_METRIC_KEYS,
    mismatch_metrics,
    rollout_correction_weights,
    rollout_log_weights,
)

F64 = torch.float64
DEFAULTS = {"tis_cap": 2.0, "mis_low": 0.5, "mis_high": 2.0}


def _token_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence, 4 valid tokens + 1 padding token, with chosen w = exp(old - rollout).

    rollout = 0 on valid tokens, so old = log(w) with w = [3, 0.6, 1, 0.4]. The padding token
    holds garbage (old = 7, rollout = -inf) that must not leak into anything.
    """
    w = [3.0, 0.6, 1.0, 0.4]
    old = torch.tensor([[*map(math.log, w), 7.0]], dtype=F64)
    rollout = torch.tensor([[0.0, 0.0, 0.0, 0.0, -math.inf]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    return old, rollout, mask


def _sequence_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three sequences of 2 valid tokens + 1 padding token, rollout = 0, old = log(w):

    seq 0: w = [3, 0.6] -> product 1.8
    seq 1: w = [3, 1.0] -> product 3.0
    seq 2: w = [0.5, 0.5] -> product 0.25
    """
    w = [[3.0, 0.6], [3.0, 1.0], [0.5, 0.5]]
    old = torch.tensor([[math.log(a), math.log(b), 5.0] for a, b in w], dtype=F64)
    rollout = torch.tensor([[0.0, 0.0, -math.inf]] * 3, dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 3)
    return old, rollout, mask


def test_none_mode_returns_unit_weights_and_same_mask() -> None:
    old, rollout, mask = _token_case()
    weights, new_mask = rollout_correction_weights(
        old, rollout, mask, mode="none", level="token", **DEFAULTS
    )
    torch.testing.assert_close(weights, torch.ones(1, 5, dtype=F64))
    assert torch.equal(new_mask, mask)


def test_tis_token_level_caps_weights() -> None:
    old, rollout, mask = _token_case()
    weights, new_mask = rollout_correction_weights(
        old, rollout, mask, mode="tis", level="token", **DEFAULTS
    )
    # min(w, 2) = [min(3, 2) = 2, 0.6, 1, 0.4]; padding gets weight 1 (exp(0)), never NaN.
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.6, 1.0, 0.4, 1.0]], dtype=F64))
    assert torch.equal(new_mask, mask)


def test_mis_token_level_masks_tokens_outside_interval() -> None:
    old, rollout, mask = _token_case()
    weights, new_mask = rollout_correction_weights(
        old, rollout, mask, mode="mis", level="token", **DEFAULTS
    )
    # w = [3, 0.6, 1, 0.4] vs [0.5, 2]: 3 > 2 rejected, 0.6 and 1 kept, 0.4 < 0.5 rejected;
    # padding stays 0.
    assert new_mask.tolist() == [[0, 1, 1, 0, 0]]
    assert new_mask.dtype == mask.dtype
    torch.testing.assert_close(weights, torch.ones(1, 5, dtype=F64))


def test_tis_sequence_level_uses_product_of_token_weights() -> None:
    old, rollout, mask = _sequence_case()
    weights, new_mask = rollout_correction_weights(
        old, rollout, mask, mode="tis", level="sequence", **DEFAULTS
    )
    # seq 0: min(1.8, 2) = 1.8; seq 1: min(3, 2) = 2; seq 2: min(0.25, 2) = 0.25, on every
    # position of the sequence (padding ignored when forming the product).
    expected = torch.tensor([[1.8] * 3, [2.0] * 3, [0.25] * 3], dtype=F64)
    torch.testing.assert_close(weights, expected)
    assert torch.equal(new_mask, mask)


def test_mis_sequence_level_drops_whole_sequences() -> None:
    old, rollout, mask = _sequence_case()
    _, new_mask = rollout_correction_weights(
        old, rollout, mask, mode="mis", level="sequence", **DEFAULTS
    )
    # seq 0: 1.8 in [0.5, 2] kept (although its first token alone, w = 3, is out of range);
    # seq 1: 3 > 2 dropped; seq 2: 0.25 < 0.5 dropped.
    assert new_mask.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert new_mask.dtype == torch.float32


def test_sequence_level_huge_log_weights_neither_overflow_nor_nan() -> None:
    # 50 tokens with old - rollout = 20 each: sequence log-weight 1000 (w = e^1000 = inf in
    # float64); second sequence -1000 (w underflows to 0).
    old = torch.cat([torch.full((1, 50), 20.0), torch.full((1, 50), -20.0)]).double()
    rollout = torch.zeros(2, 50, dtype=F64)
    mask = torch.ones(2, 50, dtype=torch.bool)
    weights, _ = rollout_correction_weights(
        old, rollout, mask, mode="tis", level="sequence", **DEFAULTS
    )
    # min(e^1000, 2) = 2 exactly; min(e^-1000, 2) = e^-1000 = 0.0 in float64.
    assert torch.equal(weights[0], torch.full((50,), 2.0, dtype=F64))
    assert torch.equal(weights[1], torch.zeros(50, dtype=F64))
    _, new_mask = rollout_correction_weights(
        old, rollout, mask, mode="mis", level="sequence", tis_cap=2.0, mis_low=0.0, mis_high=2.0
    )
    # e^1000 > 2: dropped; e^-1000 >= mis_low = 0: kept.
    assert new_mask[0].tolist() == [False] * 50
    assert new_mask[1].tolist() == [True] * 50


def test_weights_are_detached() -> None:
    old, rollout, mask = _token_case()
    old.requires_grad_(True)
    weights, _ = rollout_correction_weights(
        old, rollout, mask, mode="tis", level="token", **DEFAULTS
    )
    assert not weights.requires_grad
    assert not rollout_log_weights(old, rollout, mask, "sequence").requires_grad


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"mode": "foo"}, r"mode='foo' is not one of"),
        ({"level": "batch"}, r"level='batch' is not one of"),
        ({"tis_cap": 0.0}, r"tis_cap=0.0 must be a finite number in \(0, inf\)"),
        ({"tis_cap": math.nan}, r"tis_cap=nan"),
        ({"mis_low": 1.0}, r"mis_low=1.0 must be a finite number in \[0, 1\)"),
        ({"mis_low": -0.1}, r"mis_low=-0.1"),
        ({"mis_high": 1.0}, r"mis_high=1.0 must be a finite number in \(1, inf\)"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, pattern: str) -> None:
    old, rollout, mask = _token_case()
    args = {"mode": "tis", "level": "token", **DEFAULTS, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        rollout_correction_weights(old, rollout, mask, **args)


def test_rejects_mismatched_shapes() -> None:
    old, rollout, mask = _token_case()
    with pytest.raises(ValueError, match=r"rollout_logprobs_BT has shape \(1, 4\)"):
        rollout_correction_weights(old, rollout[:, :4], mask, mode="tis", level="token", **DEFAULTS)
    with pytest.raises(ValueError, match=r"mask_BT has shape"):
        mismatch_metrics(old, rollout, mask[0])


def test_mismatch_metrics_hand_values() -> None:
    # Valid d = train - rollout = [0.1, -0.2]; the padding slot holds NaN / -inf garbage.
    train = torch.tensor([[-1.0 + 0.1, -2.0 - 0.2, math.nan]], dtype=F64)
    rollout = torch.tensor([[-1.0, -2.0, -math.inf]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    m = mismatch_metrics(train, rollout, mask)
    assert set(m) == set(MISMATCH_METRIC_KEYS)
    # |exp(0.1) - 1| = 0.1051709181, |exp(-0.2) - 1| = 0.1812692469 -> mean 0.1432200825
    assert m["mismatch/token_mult_prob_error"] == pytest.approx(0.1432200825, abs=1e-9)
    # |d| = [0.1, 0.2] -> mean 0.15, max 0.2
    assert m["mismatch/abs_logprob_diff_mean"] == pytest.approx(0.15, abs=1e-12)
    assert m["mismatch/abs_logprob_diff_max"] == pytest.approx(0.2, abs=1e-12)
    # k3 = exp(d) - d - 1: 1.1051709181 - 1.1 = 0.0051709181; 0.8187307531 - 0.8 = 0.0187307531
    # mean = 0.0119508356
    assert m["mismatch/k3_kl"] == pytest.approx(0.0119508356, abs=1e-9)


def test_mismatch_metrics_empty_mask_gives_zeros() -> None:
    train = torch.tensor([[math.nan, -1.0]])
    rollout = torch.tensor([[-math.inf, 0.0]])
    m = mismatch_metrics(train, rollout, torch.zeros(1, 2))
    assert m == dict.fromkeys(MISMATCH_METRIC_KEYS, 0.0)
    m0 = mismatch_metrics(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 3))
    assert m0 == dict.fromkeys(MISMATCH_METRIC_KEYS, 0.0)


@st.composite
def _batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = draw(st.integers(1, 4))
    t = draw(st.integers(1, 6))
    diffs = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False)
    d = draw(st.lists(st.lists(diffs, min_size=t, max_size=t), min_size=b, max_size=b))
    m = draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b))
    rollout = torch.full((b, t), -1.5, dtype=F64)
    return rollout + torch.tensor(d, dtype=F64), rollout, torch.tensor(m)


@settings(max_examples=50, deadline=None)
@given(
    batch=_batches(),
    level=st.sampled_from(["token", "sequence"]),
    tis_cap=st.floats(min_value=0.1, max_value=10.0),
    mis_low=st.floats(min_value=0.0, max_value=0.99),
    mis_high=st.floats(min_value=1.01, max_value=10.0),
)
def test_weights_match_float64_reference(
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    level: str,
    tis_cap: float,
    mis_low: float,
    mis_high: float,
) -> None:
    old, rollout, mask = batch
    caps = {"tis_cap": tis_cap, "mis_low": mis_low, "mis_high": mis_high}
    tis_w, tis_mask = rollout_correction_weights(
        old, rollout, mask, mode="tis", level=level, **caps
    )
    mis_w, mis_mask = rollout_correction_weights(
        old, rollout, mask, mode="mis", level=level, **caps
    )
    assert torch.equal(tis_mask, mask)
    assert torch.equal(mis_w, torch.ones_like(mis_w))
    b, t = old.shape
    for i in range(b):
        valid = [j for j in range(t) if mask[i, j]]
        seq_log_w = sum(old[i, j].item() - rollout[i, j].item() for j in valid)
        for j in range(t):
            if not mask[i, j]:
                assert not mis_mask[i, j]  # MIS never revives a padding token
                continue
            log_w = seq_log_w if level == "sequence" else old[i, j].item() - rollout[i, j].item()
            w = math.exp(log_w)
            assert tis_w[i, j].item() == pytest.approx(min(w, tis_cap), rel=1e-12)
            # Skip the measure-zero boundary where float rounding decides the comparison.
            if min(abs(w - mis_low), abs(w - mis_high)) > 1e-9:
                assert bool(mis_mask[i, j]) == (mis_low <= w <= mis_high)
