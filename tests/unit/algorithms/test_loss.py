"""Tests of dapo_megatron.algorithms.loss: clipped PG loss, aggregation, combined policy loss,
their properties (hypothesis), and the spread of group advantages over tokens."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.algorithms.advantages import group_advantages
from dapo_megatron.algorithms.loss import (
    LOSS_AGG_MODES,
    _aggregate,
    _clipped_pg,
    expand_advantages,
    loss_denominator,
    metric_reduction,
    reduce_loss_metrics,
    torch_policy_loss,
)
from dapo_megatron.algorithms.loss_inputs import LossInputs
from dapo_megatron.algorithms.loss_spec import LossSpec
from dapo_megatron.algorithms.rollout_correction import rollout_correction_weights
from dapo_megatron.config.run_plan import shipped_loss_spec

F64 = torch.float64
OLD = -1.0  # old logprob used by the hand-derived cases; logprobs = OLD + log(ratio)
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
# The loss settings every torch_policy_loss test starts from; each test states what it changes.
# The shipped defaults, with what the hand-derived cases rely on stated: plain DAPO.
BASE_SPEC = shipped_loss_spec(
    4,
    **CLIP,
    clip_ratio_c=None,
    loss_agg_mode="token-mean",
    rollout_correction="none",
    kl_coef=0.0,
    entropy_coef=0.0,
)


def spec(**changes: Any) -> LossSpec:
    """BASE_SPEC with ``changes`` (validated again by LossSpec)."""
    return dataclasses.replace(BASE_SPEC, **changes)


def _from_ratios(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs leaf with grad, old logprobs) such that exp(logprobs - old) = ratios."""
    old = torch.full((len(ratios), len(ratios[0])), OLD, dtype=F64)
    lp = (old + torch.tensor(ratios, dtype=F64).log()).detach().requires_grad_(True)
    return lp, old


def _adv(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# --------------------------------------------------------------------------------------------
# Clipped policy-gradient loss
# --------------------------------------------------------------------------------------------


def test_clip_higher_is_asymmetric() -> None:
    # eps_low = 0.2, eps_high = 0.28: the clip interval is [0.8, 1.28].
    lp, old = _from_ratios([[1.25, 0.75, 1.30, 1.25]])
    adv = _adv([[1.0, -1.0, 1.0, -1.0]])
    out = _clipped_pg(lp, old, adv, **CLIP)
    # t0: A=+1, r=1.25 <= 1.28 -> max(-1.25, -1.25) = -1.25, unclipped
    # t1: A=-1, r=0.75 <  0.8  -> max(0.75, 0.8)    =  0.8, clipped lower (same |r-1| = 0.25
    #     as t0, but the low side is tighter)
    # t2: A=+1, r=1.30 >  1.28 -> max(-1.30, -1.28) = -1.28, clipped upper
    # t3: A=-1, r=1.25         -> max(1.25, 1.25)   =  1.25 (upper bound irrelevant for A<0)
    torch.testing.assert_close(out.loss_BT, _adv([[-1.25, 0.8, -1.28, 1.25]]))
    assert out.clipped_upper_BT.tolist() == [[False, False, True, False]]
    assert out.clipped_lower_BT.tolist() == [[False, True, False, False]]
    assert out.dual_clipped_BT.tolist() == [[False, False, False, False]]
    torch.testing.assert_close(out.ratio_BT, _adv([[1.25, 0.75, 1.30, 1.25]]))

    # Symmetric eps = 0.2: t0 (r = 1.25 > 1.2) is now clipped too: max(-1.25, -1.2) = -1.2.
    sym = _clipped_pg(lp, old, adv, clip_ratio_low=0.2, clip_ratio_high=0.2)
    torch.testing.assert_close(sym.loss_BT[0, 0], torch.tensor(-1.2, dtype=F64))
    assert sym.clipped_upper_BT[0, 0].item()


def test_dual_clip_active_and_inactive() -> None:
    lp, old = _from_ratios([[4.0, 2.0, 4.0, 4.0]])
    adv = _adv([[-1.0, -1.0, 1.0, -2.0]])
    out = _clipped_pg(lp, old, adv, **CLIP, clip_ratio_c=3.0)
    # t0: A=-1, r=4: max(4, 1.28) = 4 -> min(4, 1*3) = 3, dual clipped
    # t1: A=-1, r=2: max(2, 1.28) = 2 -> min(2, 3) = 2, ratio 2 < c: not dual clipped
    # t2: A=+1, r=4: max(-4, -1.28) = -1.28; dual clip only applies to A < 0 (clipped upper)
    # t3: A=-2, r=4: max(8, 2.56) = 8 -> min(8, 2*3 = 6) = 6, dual clipped
    torch.testing.assert_close(out.loss_BT, _adv([[3.0, 2.0, -1.28, 6.0]]))
    assert out.dual_clipped_BT.tolist() == [[True, False, False, True]]
    assert out.clipped_upper_BT.tolist() == [[False, False, True, False]]
    out.loss_BT.sum().backward()
    # Gradients: dual/upper clipped tokens 0; t1 unclipped: -A * r = -(-1) * 2 = 2.
    torch.testing.assert_close(lp.grad, _adv([[0.0, 2.0, 0.0, 0.0]]))

    # Without dual clip the A<0 losses grow with the ratio: [4, 2, -1.28, 8].
    plain = _clipped_pg(lp, old, adv, **CLIP)
    torch.testing.assert_close(plain.loss_BT, _adv([[4.0, 2.0, -1.28, 8.0]]))
    assert not plain.dual_clipped_BT.any()


def test_clipped_loss_gradient_zero_when_clipped_minus_a_ratio_otherwise() -> None:
    lp, old = _from_ratios([[1.1, 0.9, 1.5, 0.5, 1.3]])
    adv = _adv([[2.0, -0.5, 2.0, -0.5, 0.0]])
    out = _clipped_pg(lp, old, adv, **CLIP)
    out.loss_BT.sum().backward()
    # t0: A=2,    r=1.1 in [0.8, 1.28]: d(-A r)/d lp = -A r = -2.2
    # t1: A=-0.5, r=0.9 >= 0.8:          -A r = 0.45
    # t2: A=2,    r=1.5 > 1.28:          clipped -> 0
    # t3: A=-0.5, r=0.5 < 0.8:           clipped -> 0
    # t4: A=0:                           0
    torch.testing.assert_close(lp.grad, _adv([[-2.2, 0.45, 0.0, 0.0, 0.0]]))
    # losses: -2.2, 0.45, -2*1.28 = -2.56, max(0.25, 0.5*0.8 = 0.4) = 0.4, 0
    torch.testing.assert_close(out.loss_BT, _adv([[-2.2, 0.45, -2.56, 0.4, 0.0]]))


def test_huge_log_ratio_is_clamped_not_overflowed() -> None:
    # float32, logprobs - old = 100: exp(100) = inf in float32, the clamp gives e^20 instead.
    lp = torch.tensor([[0.0, -100.0]], requires_grad=True)
    old = torch.tensor([[-100.0, 0.0]])
    out = _clipped_pg(lp, old, torch.tensor([[-1.0, 1.0]]), **CLIP)
    # t0: A=-1, r=e^20 -> loss e^20 = 4.85165195e8 (no dual clip); t1: A=+1, r=e^-20 ~ 2e-9
    # -> max(-2e-9, -0.8) = -2.06e-9.
    assert torch.isfinite(out.loss_BT).all()
    assert out.loss_BT[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-6)
    assert out.loss_BT[0, 1].item() == pytest.approx(-math.exp(-20.0), rel=1e-5)
    out.loss_BT.sum().backward()
    # Both outside the clamp: zero gradient, no NaN.
    assert lp.grad.tolist() == [[0.0, 0.0]]


def test_bf16_logprobs_are_upcast() -> None:
    # -1.0 and -1.125 are exact in bf16: log ratio 0.125, ratio exp(0.125) = 1.1331484531.
    lp = torch.tensor([[-1.0]], dtype=torch.bfloat16)
    old = torch.tensor([[-1.125]], dtype=torch.bfloat16)
    out = _clipped_pg(lp, old, torch.tensor([[1.0]]), **CLIP)
    assert out.loss_BT.dtype == torch.float32
    assert out.ratio_BT.item() == pytest.approx(1.1331484531, rel=1e-7)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"clip_ratio_low": 1.0}, r"clip_ratio_low=1.0 must be a finite number in \[0, 1\)"),
        ({"clip_ratio_low": -0.1}, r"clip_ratio_low=-0.1"),
        ({"clip_ratio_low": math.nan}, r"clip_ratio_low=nan"),
        ({"clip_ratio_high": -0.1}, r"clip_ratio_high=-0.1 must be a finite number in \[0, inf\)"),
        ({"clip_ratio_c": 1.0}, r"clip_ratio_c=1.0 must be a finite number in \(1, inf\)"),
        ({"clip_ratio_c": 0.5}, r"clip_ratio_c=0.5"),
    ],
)
def test_clip_arguments_are_validated(kwargs: dict, pattern: str) -> None:
    # The loss takes its clip ratios from a LossSpec, which rejects them on construction
    # (the per-token function trusts them: it has no loose-argument public twin).
    with pytest.raises(ValueError, match=pattern):
        spec(**kwargs)


def test_per_sample_advantages_are_broadcast() -> None:
    lp, old = _from_ratios([[1.1, 0.9], [1.5, 0.5]])
    per_token = _clipped_pg(lp, old, _adv([[2.0, 2.0], [-0.5, -0.5]]), **CLIP)
    per_sample = _clipped_pg(lp, old, torch.tensor([2.0, -0.5], dtype=F64), **CLIP)
    torch.testing.assert_close(per_sample.loss_BT, per_token.loss_BT)
    with pytest.raises(ValueError, match=r"advantages_BT has shape \(3,\)"):
        _clipped_pg(lp, old, torch.zeros(3, dtype=F64), **CLIP)


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------

# values / mask shared by the aggregation tests. Masked slots hold NaN and inf on purpose.
NAN, INF = math.nan, math.inf
AGG_VALUES = [[1.0, 2.0, NAN, INF], [5.0, 6.0, 7.0, 8.0], [NAN, 10.0, 11.0, 12.0]]
AGG_MASK = [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]


@pytest.mark.parametrize(
    ("mode", "denominator", "loss", "grad_row0", "grad_row1"),
    [
        # 6 valid tokens; sum = 1 + 2 + 5 + 6 + 7 + 8 = 29; 29 / 6 = 4.8333; d/dv = 1/6
        ("token-mean", 6.0, 29.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0),
        # 2 non-empty rows (row 2 is all masked); (3 + 26) / 2 = 14.5; d/dv = 1/2
        ("seq-mean-token-sum", 2.0, 14.5, 0.5, 0.5),
        # (3/2 + 26/4) / 2 = (1.5 + 6.5) / 2 = 4.0; d/dv = 1/(len*2): row0 1/4, row1 1/8
        ("seq-mean-token-mean", 2.0, 4.0, 0.25, 0.125),
        # 2 rows * loss_scale_length 4 = 8; 29 / 8 = 3.625; d/dv = 1/8
        ("seq-mean-token-sum-norm", 8.0, 3.625, 0.125, 0.125),
    ],
)
def test_each_aggregation_mode(
    mode: str, denominator: float, loss: float, grad_row0: float, grad_row1: float
) -> None:
    values = torch.tensor(AGG_VALUES, dtype=F64, requires_grad=True)
    mask = torch.tensor(AGG_MASK)
    denom = loss_denominator(mask, mode, loss_scale_length=4)
    assert denom.dtype == F64
    assert denom.item() == denominator
    out = _aggregate(values, mask, mode, denom)
    assert out.item() == pytest.approx(loss, abs=1e-12)
    out.backward()
    expected_grad = torch.tensor(
        [[grad_row0, grad_row0, 0, 0], [grad_row1] * 4, [0, 0, 0, 0]], dtype=F64
    )
    torch.testing.assert_close(values.grad, expected_grad)


def test_aggregation_argument_validation() -> None:
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"loss_scale_length=None must be a positive int"):
        loss_denominator(mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"loss_scale_length=0"):
        loss_denominator(mask, "seq-mean-token-sum-norm", loss_scale_length=0)
    with pytest.raises(ValueError, match=r"loss_agg_mode='mean' is not one of"):
        loss_denominator(mask, "mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"normalizer has shape \(2,\)"):
        _aggregate(mask, mask, "token-mean", torch.ones(2))
    with pytest.raises(ValueError, match=r"normalizer=nan"):
        _aggregate(mask, mask, "token-mean", math.nan)
    with pytest.raises(ValueError, match=r"mask_BT has shape \(3,\)"):
        _aggregate(mask, mask[0], "token-mean", 1.0)


@pytest.mark.parametrize("normalizer", [0.0, -3.0, torch.tensor(0.0, dtype=F64)])
@pytest.mark.parametrize("mask", [[[0, 0]], [[1, 0]]])
def test_nonpositive_normalizer_gives_zero_with_grad(
    normalizer: float | torch.Tensor, mask: list[list[int]]
) -> None:
    # normalizer <= 0 means "nothing valid in the mini-batch": the result is 0 (not 1/0 or
    # 1/-3 times the local sum), even if this micro-batch's mask is inconsistent with that.
    values = torch.tensor([[1.0, NAN]], dtype=F64, requires_grad=True)
    out = _aggregate(values, torch.tensor(mask), "token-mean", normalizer)
    assert out.item() == 0.0
    out.backward()  # still attached to the graph
    assert values.grad.tolist() == [[0.0, 0.0]]


# --------------------------------------------------------------------------------------------
# Combined policy loss
# --------------------------------------------------------------------------------------------


def test_policy_loss_token_mean_matches_hand_values() -> None:
    lp, old = _from_ratios([[1.1, 0.9, 1.5, 0.5, 1.3]])
    adv = _adv([[2.0, -0.5, 2.0, -0.5, 0.0]])
    mask = torch.ones(1, 5)
    norm = loss_denominator(mask, "token-mean")
    out = torch_policy_loss(LossInputs(lp, old, adv, mask, normalizer=norm), spec())
    # per-token losses (see the gradient test): -2.2 + 0.45 - 2.56 + 0.4 + 0 = -3.91; / 5
    assert out.loss.item() == pytest.approx(-0.782, abs=1e-12)
    out.loss.backward()
    # d/d lp = (-A r) / 5 on unclipped tokens: -2.2/5 = -0.44, 0.45/5 = 0.09; clipped: 0.
    torch.testing.assert_close(lp.grad, _adv([[-0.44, 0.09, 0.0, 0.0, 0.0]]))


def test_tis_weights_scale_pg_loss() -> None:
    # ratio 1 (lp = old), A = 1: pg loss -1 per token. w = exp(old - rollout) = [3, 0.6, 1].
    old = torch.full((1, 3), OLD, dtype=F64)
    lp = old.clone().requires_grad_(True)
    rollout = old - torch.tensor([[3.0, 0.6, 1.0]], dtype=F64).log()
    mask = torch.ones(1, 3)
    out = torch_policy_loss(
        LossInputs(lp, old, torch.ones(1, 3, dtype=F64), mask, normalizer=3.0,
                   rollout_logprobs_BT=rollout),
        spec(rollout_correction="tis", tis_cap=2.0),
    )  # fmt: skip
    # weights min(w, 2) = [2, 0.6, 1]; loss = (-2 - 0.6 - 1) / 3 = -1.2
    assert out.loss.item() == pytest.approx(-1.2, abs=1e-12)
    out.loss.backward()
    # d/d lp = w * (-A r) / 3 = [-2/3, -0.2, -1/3]: the weight is a constant (detached).
    torch.testing.assert_close(lp.grad, _adv([[-2 / 3, -0.2, -1 / 3]]))
    assert out.metrics["rollout_weight_sum"].item() == pytest.approx(3.6)
    assert out.metrics["pg_loss_sum"].item() == pytest.approx(-3.6)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_mis_drops_tokens_from_loss(level: str) -> None:
    # ratio 1, A = 1 -> pg loss -1 per token. Two rows with w per token:
    #   row 0: [3, 0.6] (product 1.8)   row 1: [0.4, 1] (product 0.4)
    # token level, [0.5, 2]: keep (0,1), (1,1); drop (0,0) (3 > 2), (1,0) (0.4 < 0.5)
    # sequence level: keep row 0 (1.8), drop row 1 (0.4)
    old = torch.full((2, 2), OLD, dtype=F64)
    lp = old.clone().requires_grad_(True)
    rollout = old - torch.tensor([[3.0, 0.6], [0.4, 1.0]], dtype=F64).log()
    mask = torch.ones(2, 2)
    kwargs = {
        "rollout_correction": "mis",
        "rollout_correction_level": level,
        "mis_low": 0.5,
        "mis_high": 2.0,
    }
    _, mis_mask = rollout_correction_weights(
        old, rollout, mask, mode="mis", level=level, tis_cap=2.0, mis_low=0.5, mis_high=2.0
    )
    normalizer = loss_denominator(mis_mask, "token-mean")
    assert normalizer.item() == 2.0  # two kept tokens in both cases
    out = torch_policy_loss(
        LossInputs(lp, old, torch.ones(2, 2, dtype=F64), mask, normalizer=normalizer,
                   rollout_logprobs_BT=rollout),
        spec(**kwargs),
    )  # fmt: skip
    # (-1 - 1) / 2 = -1
    assert out.loss.item() == pytest.approx(-1.0, abs=1e-12)
    out.loss.backward()
    kept = [[0.0, 1.0], [0.0, 1.0]] if level == "token" else [[1.0, 1.0], [0.0, 0.0]]
    # kept tokens: -A r / 2 = -0.5; dropped tokens: 0
    torch.testing.assert_close(lp.grad, -0.5 * _adv(kept))
    assert out.metrics["num_valid_tokens"].item() == 2.0
    assert out.metrics["num_masked_by_mis"].item() == 2.0
    assert reduce_loss_metrics([out.metrics])["rollout_correction/mis_masked_frac"] == 0.5


@pytest.mark.parametrize(
    ("estimator", "loss", "grad"),
    [
        # d = lp - ref = [0.5, -1]; loss = 0.1 * mean(k); grad = 0.1/2 * dk/dlp
        # k1 = [0.5, -1] -> 0.1 * -0.5 / 2 = -0.025; dk1 = 1 -> 0.05
        ("k1", -0.025, [0.05, 0.05]),
        # k2 = [0.125, 0.5] -> 0.1 * 0.625 / 2 = 0.03125; dk2 = d -> [0.025, -0.05]
        ("k2", 0.03125, [0.025, -0.05]),
        # k3 = [0.1065306597, 0.7182818285] -> 0.1 * 0.8248124882 / 2 = 0.0412406244;
        # dk3 = 1 - exp(ref - lp) = [0.3934693403, -1.7182818285] * 0.05
        ("k3", 0.0412406244, [0.0196734670, -0.0859140914]),
    ],
)
def test_kl_penalty_enters_loss(estimator: str, loss: float, grad: list[float]) -> None:
    # A = 0 and ratio 1: the pg part is 0 with zero gradient, only the KL remains.
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=F64)
    out = torch_policy_loss(
        LossInputs(lp, lp.detach(), torch.zeros(1, 2, dtype=F64), torch.ones(1, 2), normalizer=2.0,
                   ref_logprobs_BT=ref),
        spec(kl_coef=0.1, kl_estimator=estimator),
    )  # fmt: skip
    assert out.loss.item() == pytest.approx(loss, abs=1e-10)
    out.loss.backward()
    torch.testing.assert_close(lp.grad, _adv([grad]), atol=1e-10, rtol=0)
    # The metric is the unscaled KL sum (k1: 0.5 - 1 = -0.5, ...), 2 * loss / 0.1.
    assert out.metrics["kl_sum"].item() == pytest.approx(2 * loss / 0.1, abs=1e-9)


def test_entropy_bonus_decreases_loss_and_pushes_entropy_up() -> None:
    entropy = torch.tensor([[2.0, 1.0]], dtype=F64, requires_grad=True)
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64)
    out = torch_policy_loss(
        LossInputs(lp, lp, torch.zeros(1, 2, dtype=F64), torch.ones(1, 2), normalizer=2.0,
                   entropy_BT=entropy),
        spec(entropy_coef=0.01),
    )  # fmt: skip
    # loss = 0 (pg, A = 0) - 0.01 * (2 + 1) / 2 = -0.015
    assert out.loss.item() == pytest.approx(-0.015, abs=1e-12)
    out.loss.backward()
    # d loss / d entropy = -0.01 / 2 = -0.005 < 0: gradient descent raises the entropy.
    torch.testing.assert_close(entropy.grad, torch.full((1, 2), -0.005, dtype=F64))
    assert reduce_loss_metrics([out.metrics])["policy/entropy"] == pytest.approx(1.5)


def test_zero_valid_tokens_gives_zero_loss_and_finite_grads() -> None:
    # Every slot is padding and holds garbage (-inf logprobs, NaN entropy/advantages).
    lp = torch.full((2, 3), -math.inf, dtype=F64, requires_grad=True)
    old = torch.full((2, 3), math.nan, dtype=F64)
    entropy = torch.full((2, 3), math.nan, dtype=F64, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for mode in LOSS_AGG_MODES:
        denom = loss_denominator(mask, mode, loss_scale_length=3)
        assert denom.item() == 0.0
        out = torch_policy_loss(
            LossInputs(lp, old, torch.full((2,), math.nan, dtype=F64), mask, normalizer=denom,
                       rollout_logprobs_BT=old, ref_logprobs_BT=old, entropy_BT=entropy),
            spec(loss_agg_mode=mode, loss_scale_length=3, rollout_correction="tis", kl_coef=0.1,
                 entropy_coef=0.01),
        )  # fmt: skip
        assert out.loss.item() == 0.0
        lp.grad = None
        entropy.grad = None
        out.loss.backward()
        assert lp.grad.tolist() == [[0.0] * 3] * 2
        assert entropy.grad.tolist() == [[0.0] * 3] * 2
        reduced = reduce_loss_metrics([out.metrics])
        assert all(math.isfinite(v) for v in reduced.values())
        assert reduced["policy/ratio_max"] == 0.0
        assert reduced["num_valid_tokens"] == 0.0


def test_policy_loss_argument_validation() -> None:
    z = torch.zeros(1, 2)
    m = torch.ones(1, 2)
    with pytest.raises(ValueError, match=r"kl_coef=0.1 > 0 requires ref_logprobs_BT"):
        torch_policy_loss(LossInputs(z, z, z, m, normalizer=2.0), spec(kl_coef=0.1))
    with pytest.raises(ValueError, match=r"entropy_coef=0.1 > 0 requires entropy_BT"):
        torch_policy_loss(LossInputs(z, z, z, m, normalizer=2.0), spec(entropy_coef=0.1))
    with pytest.raises(ValueError, match=r"rollout_correction='tis' requires rollout_logprobs_BT"):
        torch_policy_loss(LossInputs(z, z, z, m, normalizer=2.0), spec(rollout_correction="tis"))
    with pytest.raises(ValueError, match=r"ref_logprobs_BT has shape \(2, 1\)"):
        torch_policy_loss(LossInputs(z, z, z, m, normalizer=2.0, ref_logprobs_BT=z.T), spec())
    with pytest.raises(ValueError, match=r"entropy_BT has shape \(1, 3\)"):
        torch_policy_loss(
            LossInputs(z, z, z, m, normalizer=2.0, entropy_BT=torch.zeros(1, 3)), spec()
        )
    with pytest.raises(ValueError, match=r"logprobs_BT has shape \(2,\), expected 2 dims"):
        torch_policy_loss(LossInputs(z[0], z[0], z[0], m[0], normalizer=2.0), spec())
    # Bad scalars never reach torch_policy_loss: the LossSpec carrying them cannot be built.
    with pytest.raises(ValueError, match=r"kl_coef=-1.0 must be a finite number in \[0, inf\)"):
        spec(kl_coef=-1.0)
    with pytest.raises(ValueError, match=r"kl_estimator='k9' is not one of"):
        spec(kl_estimator="k9")


def test_metrics_hand_values_and_reduction_across_micro_batches() -> None:
    # Same tokens as the gradient test, split over two micro-batches (rows), row 1 padded:
    #   row 0: (A=2, r=1.1) (A=-0.5, r=0.9) (A=2, r=1.5)
    #   row 1: (A=-0.5, r=0.5) (A=0, r=1.3) padding
    lp, old = _from_ratios([[1.1, 0.9, 1.5], [0.5, 1.3, 1.0]])
    adv = _adv([[2.0, -0.5, 2.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    normalizer = loss_denominator(mask, "token-mean")  # 5
    outs = [
        torch_policy_loss(LossInputs(lp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], normalizer=normalizer), spec())
        for i in range(2)
    ]  # fmt: skip
    m0, m1 = (o.metrics for o in outs)
    # row 0: pg = -2.2 + 0.45 - 2.56 = -4.31; clipped upper: r=1.5; ratios sum 3.5
    assert m0["pg_loss_sum"].item() == pytest.approx(-4.31)
    assert m0["clipfrac_upper_sum"].item() == 1.0
    assert m0["ratio_sum"].item() == pytest.approx(3.5)
    assert m0["ratio_max"].item() == pytest.approx(1.5)
    assert m0["num_valid_tokens"].item() == 3.0
    # row 1: pg = max(0.25, 0.4) + 0 = 0.4; clipped lower: r=0.5; ratios 0.5 + 1.3 = 1.8
    assert m1["pg_loss_sum"].item() == pytest.approx(0.4)
    assert m1["clipfrac_lower_sum"].item() == 1.0
    assert m1["ratio_min"].item() == pytest.approx(0.5)
    assert all(v.dtype == F64 and not v.requires_grad for v in m0.values())

    # The two micro-batch losses sum to the whole-batch loss -3.91 / 5 = -0.782.
    assert sum(o.loss.item() for o in outs) == pytest.approx(-0.782, abs=1e-12)

    red = reduce_loss_metrics([m0, m1])
    assert red["num_valid_tokens"] == 5.0
    assert red["loss/pg_loss"] == pytest.approx(-3.91 / 5)  # -0.782
    assert red["clipfrac/upper"] == pytest.approx(0.2)  # 1 / 5
    assert red["clipfrac/lower"] == pytest.approx(0.2)
    assert red["clipfrac/dual"] == 0.0
    assert red["clipfrac/total"] == pytest.approx(0.4)
    assert red["policy/ratio_mean"] == pytest.approx(5.3 / 5)  # 1.06
    assert red["policy/ratio_max"] == pytest.approx(1.5)
    assert red["policy/ratio_min"] == pytest.approx(0.5)
    # approx KL, k3 of KL(old || new) = r - 1 - log r:
    #   1.1: 0.1 - 0.0953101798 = 0.0046898202   0.9: -0.1 + 0.1053605157 = 0.0053605157
    #   1.5: 0.5 - 0.4054651081 = 0.0945348919   0.5: -0.5 + 0.6931471806 = 0.1931471806
    #   1.3: 0.3 - 0.2623642645 = 0.0376357355   sum 0.3353681439, mean 0.0670736288
    assert red["policy/approx_kl"] == pytest.approx(0.0670736288, abs=1e-9)
    assert red["rollout_correction/weight_mean"] == 1.0
    assert "kl/ref_kl" not in red and "policy/entropy" not in red


def test_metric_reduction_ops_and_validation() -> None:
    assert metric_reduction("ratio_max") == "max"
    assert metric_reduction("ratio_min") == "min"
    assert metric_reduction("pg_loss_sum") == "sum"
    assert metric_reduction("num_valid_tokens") == "sum"
    with pytest.raises(ValueError, match="metrics_list is empty"):
        reduce_loss_metrics([])
    z = torch.zeros(1, 1)
    m = torch_policy_loss(LossInputs(z, z, z, torch.ones(1, 1), normalizer=1.0), spec()).metrics
    with pytest.raises(ValueError, match=r"metrics_list\[1\] has keys"):
        reduce_loss_metrics([m, {**m, "kl_sum": 0.0}])


@pytest.mark.parametrize(
    ("estimator", "loss", "grad0"),
    [
        # d = lp - ref = log 1.1 = 0.0953101798; k2 = 0.5 * d^2 = 0.5 * 0.0090840304 = 0.0045420152
        # loss = -2.2 + 0.1 * 0.0045420152 - 0.01 = -2.2095457985
        # grad = -A r + 0.1 * d = -2.2 + 0.0095310180 = -2.1904689820
        ("k2", -2.2095457985, -2.1904689820),
        # k3: log r = -d: 1/1.1 + d - 1 = 0.9090909091 + 0.0953101798 - 1 = 0.0044010889
        # loss = -2.2 + 0.1 * 0.0044010889 - 0.01 = -2.2095598911
        # grad = -2.2 + 0.1 * (1 - 1/1.1) = -2.2 + 0.0090909091 = -2.1909090909
        ("k3", -2.2095598911, -2.1909090909),
    ],
)
def test_padding_garbage_does_not_leak(estimator: str, loss: float, grad0: float) -> None:
    # Slot 0 is valid: r = 1.1, A = 2, rollout = ref = old, entropy 1.
    # Slot 1 is padding with a NaN logprob, slot 2 padding with a NaN advantage; both hold NaN
    # or -inf in every other input. k2 (whose backward multiplies by d) and the NaN advantage
    # (backward multiplies by A) would turn 0 * NaN into NaN if the padding were not cleaned.
    lp0 = OLD + math.log(1.1)
    lp = torch.tensor([[lp0, NAN, -1.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[OLD, NAN, NAN]], dtype=F64)
    adv = torch.tensor([[2.0, 5.0, NAN]], dtype=F64)
    rollout = torch.tensor([[OLD, NAN, -INF]], dtype=F64)
    entropy = torch.tensor([[1.0, NAN, NAN]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 0, 0]])
    out = torch_policy_loss(
        LossInputs(lp, old, adv, mask, normalizer=1.0, rollout_logprobs_BT=rollout,
                   ref_logprobs_BT=old, entropy_BT=entropy),
        spec(rollout_correction="mis", kl_coef=0.1, kl_estimator=estimator, entropy_coef=0.01),
    )  # fmt: skip
    # loss = -A r + 0.1 * kl - 0.01 * entropy on slot 0 only (values in the parametrisation)
    assert out.loss.item() == pytest.approx(loss, abs=1e-10)
    out.loss.backward()
    assert lp.grad[0, 0].item() == pytest.approx(grad0, abs=1e-10)
    assert lp.grad[0, 1:].tolist() == [0.0, 0.0]
    assert entropy.grad.tolist() == [[-0.01, 0.0, 0.0]]
    m = out.metrics
    assert all(math.isfinite(v.item()) for v in m.values())
    # Padding is neither "valid" nor "masked by MIS", and its ratio (1 after cleaning) must not
    # win the min: the only valid ratio is 1.1.
    assert m["num_valid_tokens"].item() == 1.0
    assert m["num_masked_by_mis"].item() == 0.0
    assert m["ratio_min"].item() == pytest.approx(1.1)
    assert m["ratio_max"].item() == pytest.approx(1.1)


def test_gradcheck_against_float64_finite_differences() -> None:
    # Ratios kept away from the clip kinks (0.8, 1.28, c = 3), where the loss is not smooth.
    lp, old = _from_ratios([[1.1, 0.9, 1.5, 0.5], [1.2, 4.0, 2.0, 0.95]])
    adv = _adv([[1.0, -0.5, 2.0, -1.0], [0.3, -1.0, -0.7, 0.0]])
    rollout = old + torch.tensor([[0.1, -0.3, 0.2, 0.0], [0.05, 0.0, -0.1, 0.4]], dtype=F64)
    ref = old + 0.2
    entropy = torch.rand(2, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    entropy.requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])

    def fn(lp_: torch.Tensor, ent_: torch.Tensor) -> torch.Tensor:
        return torch_policy_loss(
            LossInputs(lp_, old, adv, mask, normalizer=2.0, rollout_logprobs_BT=rollout,
                       ref_logprobs_BT=ref, entropy_BT=ent_),
            spec(clip_ratio_c=3.0, loss_agg_mode="seq-mean-token-mean", rollout_correction="tis",
                 tis_cap=1.2, kl_coef=0.05, entropy_coef=0.01),
        ).loss  # fmt: skip

    assert torch.autograd.gradcheck(fn, (lp, entropy))


# --------------------------------------------------------------------------------------------
# The spec is trusted: no micro-batch validates a hyper-parameter again
# --------------------------------------------------------------------------------------------


def count_validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace every validator of the loss's hyper-parameters, where each loss module sees
    it, by a counting wrapper; return the list its calls append their names to."""
    import dapo_megatron.algorithms.kl as kl_module
    import dapo_megatron.algorithms.loss as loss_module
    import dapo_megatron.algorithms.loss_inputs as inputs_module
    import dapo_megatron.algorithms.loss_spec as spec_module
    import dapo_megatron.algorithms.rollout_correction as correction_module
    import dapo_megatron.kernels.pg_loss as pg_loss_module

    calls: list[str] = []

    def counting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return fn(*args, **kwargs)

        return wrapper

    modules = (
        spec_module, loss_module, kl_module, correction_module, inputs_module, pg_loss_module
    )  # fmt: skip
    for module in modules:
        for name, fn in list(vars(module).items()):
            # raise_first: every validate_* and LossSpec.__post_init__ end in it.
            if callable(fn) and (name.startswith("validate_") or name in VALIDATORS):
                monkeypatch.setattr(module, name, counting(name, fn))
    return calls


VALIDATORS = ("raise_first", "spec_problems")


@pytest.mark.parametrize(
    "changes",
    [
        # Every branch that reads a hyper-parameter: dual clip, TIS, KL, entropy, the norm mode.
        {"rollout_correction": "tis", "kl_coef": 0.1, "entropy_coef": 0.01, "clip_ratio_c": 3.0},
        {"rollout_correction": "mis", "rollout_correction_level": "sequence"},
        {"loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_length": 4, "kl_estimator": "k2"},
    ],
)
def test_policy_loss_validates_no_hyper_parameter(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any]
) -> None:
    from dapo_megatron.kernels.pg_loss import pg_loss

    loss = spec(**changes)  # validated here, once
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(2, 4, generator=gen, dtype=F64)
    lp = (old + 0.3 * torch.randn(2, 4, generator=gen, dtype=F64)).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    inputs = LossInputs(
        lp, old, torch.tensor([1.0, -1.0], dtype=F64), mask,
        normalizer=loss_denominator(mask, loss.loss_agg_mode, loss_scale_length=loss.loss_scale_length),
        rollout_logprobs_BT=old + 0.1, ref_logprobs_BT=old - 0.1, entropy_BT=torch.ones(2, 4),
    )  # fmt: skip
    calls = count_validations(monkeypatch)
    expected = torch_policy_loss(inputs, loss)
    torch_out = pg_loss(inputs, loss, impl="torch")
    expected.loss.backward()
    assert calls == []
    assert torch.equal(torch_out.loss, expected.loss)
    # A spec's construction is where they are validated, once.
    spec(**changes)
    assert calls == ["spec_problems", "raise_first"]


# ---------------------------------------------------------------------------------------
# Property tests (hypothesis): micro-batch invariance of the aggregation and of the whole
# policy loss, and the clipped loss against a per-token reference with its gradient rule.


@st.composite
def _masked_batch(draw: st.DrawFn) -> dict:
    """Random B x T batch with masks that include empty rows and, sometimes, an empty batch."""
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 6))
    floats = st.floats(min_value=-2.0, max_value=0.0, allow_nan=False)

    def matrix(elements: st.SearchStrategy) -> list[list]:
        return draw(st.lists(st.lists(elements, min_size=t, max_size=t), min_size=b, max_size=b))

    mask = matrix(st.booleans())
    empty_rows = draw(st.lists(st.booleans(), min_size=b, max_size=b))
    mask = [[m and not e for m in row] for row, e in zip(mask, empty_rows, strict=True)]
    if draw(st.booleans()) and draw(st.booleans()):  # ~1/4 of the cases: nothing valid at all
        mask = [[False] * t for _ in range(b)]
    cuts = sorted(draw(st.lists(st.integers(0, b), max_size=4)))  # may create empty chunks
    return {
        "lp": torch.tensor(matrix(floats), dtype=F64),
        "old": torch.tensor(matrix(floats), dtype=F64),
        "rollout": torch.tensor(matrix(floats), dtype=F64),
        "ref": torch.tensor(matrix(floats), dtype=F64),
        "entropy": torch.tensor(matrix(st.floats(0.0, 3.0)), dtype=F64),
        "adv": torch.tensor(draw(st.lists(st.floats(-2.0, 2.0), min_size=b, max_size=b)), dtype=F64),
        "mask": torch.tensor(mask),
        "bounds": list(zip([0, *cuts], [*cuts, b], strict=True)),
    }  # fmt: skip


@settings(max_examples=50, deadline=None)
@given(batch=_masked_batch(), mode=st.sampled_from(LOSS_AGG_MODES))
def test_aggregate_loss_is_micro_batch_invariant(batch: dict, mode: str) -> None:
    mask, bounds = batch["mask"], batch["bounds"]
    t = mask.shape[1]

    def values_of(lp: torch.Tensor) -> torch.Tensor:
        return lp.square() + 0.5 * lp.exp()  # any smooth function of the logprobs

    whole_lp = batch["lp"].clone().requires_grad_(True)
    whole_norm = loss_denominator(mask, mode, loss_scale_length=t)
    whole = _aggregate(values_of(whole_lp), mask, mode, whole_norm)
    whole.backward()

    split_lp = batch["lp"].clone().requires_grad_(True)
    global_norm = sum(loss_denominator(mask[a:b], mode, loss_scale_length=t) for a, b in bounds)
    assert global_norm.item() == whole_norm.item()
    total = sum(
        _aggregate(values_of(split_lp[a:b]), mask[a:b], mode, global_norm) for a, b in bounds
    )
    total.backward()
    assert abs(total.item() - whole.item()) <= 1e-6
    torch.testing.assert_close(split_lp.grad, whole_lp.grad, atol=1e-6, rtol=0)


@settings(max_examples=50, deadline=None)
@given(
    batch=_masked_batch(),
    mode=st.sampled_from(LOSS_AGG_MODES),
    correction=st.sampled_from(["none", "tis", "mis"]),
    level=st.sampled_from(["token", "sequence"]),
)
def test_policy_loss_is_micro_batch_invariant(
    batch: dict, mode: str, correction: str, level: str
) -> None:
    mask, bounds = batch["mask"], batch["bounds"]
    t = mask.shape[1]
    # Padding holds -inf logprobs: must change nothing.
    lp_data = batch["lp"].masked_fill(~mask, -math.inf)
    corr = {"tis_cap": 1.5, "mis_low": 0.5, "mis_high": 2.0}
    loss_spec = spec(
        clip_ratio_c=3.0, loss_agg_mode=mode, loss_scale_length=t, rollout_correction=correction,
        rollout_correction_level=level, **corr, kl_coef=0.1, kl_estimator="k3", entropy_coef=0.01,
    )  # fmt: skip

    def run(lp: torch.Tensor, a: int, b: int, normalizer: torch.Tensor) -> torch.Tensor:
        return torch_policy_loss(
            LossInputs(lp[a:b], batch["old"][a:b], batch["adv"][a:b], mask[a:b],
                       normalizer=normalizer, rollout_logprobs_BT=batch["rollout"][a:b],
                       ref_logprobs_BT=batch["ref"][a:b], entropy_BT=batch["entropy"][a:b]),
            loss_spec,
        ).loss  # fmt: skip

    def denominator(a: int, b: int) -> torch.Tensor:
        # The denominator counts what survives MIS, as the caller is told to do.
        _, eff = rollout_correction_weights(
            batch["old"][a:b], batch["rollout"][a:b], mask[a:b], mode=correction, level=level, **corr
        )  # fmt: skip
        return loss_denominator(eff, mode, loss_scale_length=t)

    b_all = mask.shape[0]
    whole_lp = lp_data.clone().requires_grad_(True)
    whole = run(whole_lp, 0, b_all, denominator(0, b_all))
    whole.backward()

    split_lp = lp_data.clone().requires_grad_(True)
    global_norm = sum(denominator(a, b) for a, b in bounds)
    total = sum(run(split_lp, a, b, global_norm) for a, b in bounds)
    total.backward()
    assert math.isfinite(whole.item())
    assert abs(total.item() - whole.item()) <= 1e-6
    assert torch.isfinite(whole_lp.grad).all()
    torch.testing.assert_close(split_lp.grad, whole_lp.grad, atol=1e-6, rtol=0)


def _reference_token_loss(lr: float, a: float, low: float, high: float, c: float | None) -> float:
    """Independent scalar float64 transcription of the clipped surrogate."""
    r = math.exp(lr)
    loss = max(-a * r, -a * min(max(r, 1 - low), 1 + high))
    if c is not None and a < 0:
        loss = min(loss, -a * c)
    return loss


@settings(max_examples=50, deadline=None)
@given(
    tokens=st.lists(st.tuples(st.floats(-3.0, 3.0), st.floats(-5.0, 5.0)), min_size=1, max_size=12),
    low=st.floats(0.0, 0.99),
    high=st.floats(0.0, 5.0),
    c=st.one_of(st.none(), st.floats(1.01, 10.0)),
)
def test_clipped_loss_matches_reference_and_gradient_rule(
    tokens: list[tuple[float, float]], low: float, high: float, c: float | None
) -> None:
    lr = torch.tensor([[x[0] for x in tokens]], dtype=F64)
    adv = torch.tensor([[x[1] for x in tokens]], dtype=F64)
    lp = lr.clone().requires_grad_(True)  # old = 0, so lp is the log-ratio
    out = _clipped_pg(
        lp, torch.zeros_like(lr), adv, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c
    )
    out.loss_BT.sum().backward()
    for i, (x, a) in enumerate(tokens):
        expected = _reference_token_loss(x, a, low, high, c)
        assert out.loss_BT[0, i].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
        r = math.exp(x)
        kinks = [1 - low, 1 + high] + ([c] if c is not None else [])
        if min(abs(r - k) for k in kinks) < 1e-9:
            continue  # the derivative is not defined at a kink
        flagged = (
            out.clipped_upper_BT[0, i] or out.clipped_lower_BT[0, i] or out.dual_clipped_BT[0, i]
        )
        # Clipped tokens get no gradient; unclipped ones d(-A r)/d lp = -A r.
        expected_grad = 0.0 if flagged else -a * r
        assert lp.grad[0, i].item() == pytest.approx(expected_grad, rel=1e-12, abs=1e-12)
        # Pessimism: the clipped objective never goes below the unclipped one (without c).
        if c is None:
            assert out.loss_BT[0, i].item() >= -a * r - 1e-12


# ---------------------------------------------------------------------------------------
# Group advantages spread over a sample's tokens (expand_advantages).

# One correct answer out of four: mean 0.25, deviations [0.75, -0.25, -0.25, -0.25],
# unbiased variance (0.75^2 + 3 * 0.25^2) / (4 - 1) = 0.75 / 3 = 0.25, std 0.5.
ONE_OF_FOUR = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)


# ------------------------------------------ expand_advantages: one advantage per sample's tokens


def test_expand_advantages_spreads_group_advantages_over_tokens() -> None:
    advantages_B = group_advantages(ONE_OF_FOUR, eps=0.0).flatten()
    out = expand_advantages(advantages_B, torch.Size([4, 2]))
    # 1.5 and -0.5 from the hand-derived default case, repeated over 2 tokens
    assert out.tolist() == [[1.5, 1.5], [-0.5, -0.5], [-0.5, -0.5], [-0.5, -0.5]]


def test_expand_advantages_keeps_per_token_advantages() -> None:
    per_token_BT = torch.arange(6.0).reshape(2, 3)
    assert expand_advantages(per_token_BT, per_token_BT.shape) is per_token_BT


@pytest.mark.parametrize(
    ("advantages", "shape"),
    [(torch.zeros(2, 1), (2, 3)), (torch.zeros(3), (2, 3)), (torch.zeros(2, 3), (3, 2))],
)
def test_expand_advantages_rejects_bad_shapes(
    advantages: torch.Tensor, shape: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError, match="advantages_BT"):
        expand_advantages(advantages, torch.Size(shape))


def test_the_loss_has_one_public_entry_point() -> None:
    # pg_loss (kernels/pg_loss.py) is the loss the package calls; its two implementations
    # are reached only through it, and the loose-argument twins of the spec-taking pieces
    # are gone (their limits live in LossSpec alone).
    import ast
    from pathlib import Path

    import dapo_megatron.algorithms.loss as loss_module
    import dapo_megatron.kernels as kernels

    assert "pg_loss" in kernels.__all__
    assert not hasattr(loss_module, "aggregate_loss")
    assert not hasattr(loss_module, "clipped_pg_loss_per_token")
    package = Path(loss_module.__file__).parents[1]
    implementations = {
        "dapo_megatron.algorithms.loss": "torch_policy_loss",
        "dapo_megatron.kernels.triton_pg_loss": "triton_pg_loss",
    }
    callers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            wanted = isinstance(node, ast.ImportFrom) and implementations.get(node.module or "")
            if wanted and wanted in {a.name for a in node.names}:  # type: ignore[attr-defined]
                callers.add(str(path.relative_to(package)))
    assert callers == {"kernels/pg_loss.py"}
