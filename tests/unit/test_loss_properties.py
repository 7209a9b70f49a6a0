"""Property tests of dapo_megatron.algorithms.loss (hypothesis): micro-batch invariance of the
aggregation and of the whole policy loss, and the clipped loss against a per-token reference
with its gradient rule. The hand-derived cases are in test_loss.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_loss import F64, spec

from dapo_megatron.algorithms.loss import (
    LOSS_AGG_MODES,
    aggregate_loss,
    clipped_pg_loss_per_token,
    loss_denominator,
    policy_loss,
)
from dapo_megatron.algorithms.loss_inputs import LossInputs
from dapo_megatron.algorithms.rollout_correction import rollout_correction_weights


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
    whole = aggregate_loss(values_of(whole_lp), mask, mode, whole_norm)
    whole.backward()

    split_lp = batch["lp"].clone().requires_grad_(True)
    global_norm = sum(loss_denominator(mask[a:b], mode, loss_scale_length=t) for a, b in bounds)
    assert global_norm.item() == whole_norm.item()
    total = sum(
        aggregate_loss(values_of(split_lp[a:b]), mask[a:b], mode, global_norm) for a, b in bounds
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
        return policy_loss(
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
    out = clipped_pg_loss_per_token(
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
