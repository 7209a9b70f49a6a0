"""Tests of dapo_megatron.algorithms.kl: KL estimators and the entropy bonus."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.algorithms.kl import (
    LOG_RATIO_CLAMP,
    compute_dtype,
    entropy_bonus_per_token,
    kl_penalty,
)

F64 = torch.float64

# Three tokens used by several tests, in float64:
#   logprobs = [-1.0, -2.0, -0.7], ref = [-1.5, -1.0, -0.7]
#   logprobs - ref = [0.5, -1.0, 0.0];  log r = ref - logprobs = [-0.5, 1.0, 0.0]
LP = [[-1.0, -2.0, -0.7]]
REF = [[-1.5, -1.0, -0.7]]


def _lp_ref() -> tuple[torch.Tensor, torch.Tensor]:
    lp = torch.tensor(LP, dtype=F64, requires_grad=True)
    ref = torch.tensor(REF, dtype=F64)
    return lp, ref


def test_k1_values_and_gradient() -> None:
    lp, ref = _lp_ref()
    kl = kl_penalty(lp, ref, "k1")
    # k1 = logprobs - ref = [0.5, -1.0, 0.0]; can be negative per token.
    torch.testing.assert_close(kl, torch.tensor([[0.5, -1.0, 0.0]], dtype=F64))
    kl.sum().backward()
    # d k1 / d logprobs = 1 everywhere.
    torch.testing.assert_close(lp.grad, torch.ones(1, 3, dtype=F64))


def test_k2_values_and_gradient() -> None:
    lp, ref = _lp_ref()
    kl = kl_penalty(lp, ref, "k2")
    # k2 = 0.5 * d^2: 0.5 * 0.25 = 0.125; 0.5 * 1 = 0.5; 0.
    torch.testing.assert_close(kl, torch.tensor([[0.125, 0.5, 0.0]], dtype=F64))
    kl.sum().backward()
    # d k2 / d logprobs = d = [0.5, -1.0, 0.0].
    torch.testing.assert_close(lp.grad, torch.tensor([[0.5, -1.0, 0.0]], dtype=F64))


def test_k3_values_and_gradient() -> None:
    lp, ref = _lp_ref()
    kl = kl_penalty(lp, ref, "k3")
    # k3 = exp(log r) - log r - 1:
    #   log r = -0.5: 0.6065306597 + 0.5 - 1 = 0.1065306597
    #   log r =  1.0: 2.7182818285 - 1.0 - 1 = 0.7182818285
    #   log r =  0.0: 1 - 0 - 1 = 0
    expected = torch.tensor([[0.1065306597, 0.7182818285, 0.0]], dtype=F64)
    torch.testing.assert_close(kl, expected, atol=1e-9, rtol=0)
    kl.sum().backward()
    # d k3 / d logprobs = -exp(ref - lp) + 1: 1 - 0.6065306597 = 0.3934693403,
    # 1 - 2.7182818285 = -1.7182818285, 1 - 1 = 0.
    expected_grad = torch.tensor([[0.3934693403, -1.7182818285, 0.0]], dtype=F64)
    torch.testing.assert_close(lp.grad, expected_grad, atol=1e-9, rtol=0)


def test_k3_is_clamped_and_finite_for_huge_differences() -> None:
    lp = torch.tensor([[0.0, -1000.0, 0.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1000.0, 0.0, -math.inf]], dtype=F64)
    kl = kl_penalty(lp, ref, "k3")
    # log r = [-1000, +1000, -inf] clamped to [-20, 20, -20]:
    #   exp(-20) + 20 - 1 = 19.000000002061154;  exp(20) - 20 - 1 = 485165174.40979
    expected = torch.tensor(
        [[19.0 + math.exp(-20.0), math.exp(20.0) - 21.0, 19.0 + math.exp(-20.0)]], dtype=F64
    )
    torch.testing.assert_close(kl, expected)
    kl.sum().backward()
    # Outside the clamp the estimate is constant in logprobs: zero gradient, not NaN.
    torch.testing.assert_close(lp.grad, torch.zeros(1, 3, dtype=F64))
    assert LOG_RATIO_CLAMP == 20.0


def test_bf16_inputs_are_upcast_to_float32() -> None:
    # -1.0 and -1.125 are exact in bf16; log r = -1.125 - (-1.0) = -0.125.
    lp = torch.tensor([[-1.0]], dtype=torch.bfloat16)
    ref = torch.tensor([[-1.125]], dtype=torch.bfloat16)
    kl = kl_penalty(lp, ref, "k3")
    assert kl.dtype == torch.float32
    # exp(-0.125) + 0.125 - 1 = 0.8824969026 - 0.875 = 0.0074969026
    assert kl.item() == pytest.approx(0.0074969026, abs=1e-7)
    assert compute_dtype(lp, ref) == torch.float32
    assert compute_dtype(lp, torch.zeros(1, dtype=F64)) == F64


def test_kl_penalty_rejects_bad_arguments() -> None:
    lp, ref = _lp_ref()
    with pytest.raises(ValueError, match=r"estimator='k4'.*k1"):
        kl_penalty(lp, ref, "k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ref_logprobs_BT has shape \(1, 2\)"):
        kl_penalty(lp, ref[:, :2], "k3")


def test_entropy_bonus_sign_and_gradient() -> None:
    entropy = torch.tensor([[2.0, 1.0]], dtype=F64, requires_grad=True)
    term = entropy_bonus_per_token(entropy, 0.01)
    # -coef * entropy = [-0.02, -0.01]: adding it to a minimised loss rewards entropy.
    torch.testing.assert_close(term, torch.tensor([[-0.02, -0.01]], dtype=F64))
    term.sum().backward()
    torch.testing.assert_close(entropy.grad, torch.full((1, 2), -0.01, dtype=F64))


@pytest.mark.parametrize("coef", [-0.1, math.nan, math.inf, True])
def test_entropy_bonus_rejects_bad_coef(coef: float) -> None:
    with pytest.raises(ValueError, match=r"entropy_coef=.* must be a finite number in \[0, inf\)"):
        entropy_bonus_per_token(torch.ones(1, 1), coef)


_logprob = st.floats(min_value=-50.0, max_value=0.0, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(
    pairs=st.lists(st.tuples(_logprob, _logprob), min_size=1, max_size=16),
)
def test_k2_k3_are_nonnegative_and_match_float64_formulas(
    pairs: list[tuple[float, float]],
) -> None:
    lp = torch.tensor([[p[0] for p in pairs]], dtype=F64)
    ref = torch.tensor([[p[1] for p in pairs]], dtype=F64)
    k1 = kl_penalty(lp, ref, "k1")
    k2 = kl_penalty(lp, ref, "k2")
    k3 = kl_penalty(lp, ref, "k3")
    assert (k2 >= 0).all()
    assert (k3 >= 0).all()
    for i, (a, b) in enumerate(pairs):
        log_r = min(max(b - a, -20.0), 20.0)
        assert k1[0, i].item() == pytest.approx(a - b, abs=1e-12)
        assert k2[0, i].item() == pytest.approx(0.5 * (a - b) ** 2, rel=1e-12, abs=1e-12)
        assert k3[0, i].item() == pytest.approx(math.expm1(log_r) - log_r, rel=1e-9, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    logits=st.lists(
        st.tuples(
            st.floats(min_value=-4.0, max_value=4.0),
            st.floats(min_value=-4.0, max_value=4.0),
        ),
        min_size=2,
        max_size=8,
    )
)
def test_k1_and_k3_are_unbiased_over_an_exact_expectation(
    logits: list[tuple[float, float]],
) -> None:
    # For categorical p (policy) and q (reference) over a few outcomes, the exact expectation
    # sum_i p_i * k(i) of k1 and k3 must equal KL(p || q) = sum_i p_i (log p_i - log q_i).
    logp = torch.log_softmax(torch.tensor([x[0] for x in logits], dtype=F64), dim=0)
    logq = torch.log_softmax(torch.tensor([x[1] for x in logits], dtype=F64), dim=0)
    p = logp.exp()
    exact_kl = float((p * (logp - logq)).sum())
    k1 = kl_penalty(logp[None], logq[None], "k1")[0]
    k3 = kl_penalty(logp[None], logq[None], "k3")[0]
    assert float((p * k1).sum()) == pytest.approx(exact_kl, abs=1e-10)
    assert float((p * k3).sum()) == pytest.approx(exact_kl, abs=1e-10)


def test_kl_clamp_bounds_each_token_and_stops_its_gradient() -> None:
    """dapo.loss.kl_clamp = NeMo RL's kl_output_clamp_value: the per-token estimate is
    clamped to [-c, c] before kl_coef weighs it. Tokens: log r = [-0.5, 1.0, 0.0];
    k3 = e^x - 1 - x = [0.10653, 0.71828, 0]; at c = 0.5 the second saturates."""
    import dataclasses

    from dapo_megatron.algorithms.kl import kl_entropy_terms
    from dapo_megatron.config.run_plan import shipped_loss_spec

    spec = shipped_loss_spec(3, kl_coef=0.1, kl_estimator="k3", kl_clamp=0.5, entropy_coef=0.0)
    lp, ref = _lp_ref()
    valid = torch.ones(1, 3, dtype=torch.bool)
    terms = kl_entropy_terms(None, lp, valid, spec, ref_logprobs_BT=ref, entropy_BT=None)
    k3 = [math.exp(-0.5) - 1 + 0.5, 0.5, 0.0]
    torch.testing.assert_close(terms.kl_BT, torch.tensor([k3], dtype=F64))
    terms.per_token_BT.sum().backward()
    # d(0.1 * k3)/d lp = 0.1 * (1 - e^{log r}) where not clamped; 0 at the clamped token.
    torch.testing.assert_close(
        lp.grad, torch.tensor([[0.1 * (1 - math.exp(-0.5)), 0.0, 0.0]], dtype=F64)
    )
    unclamped = dataclasses.replace(spec, kl_clamp=None)
    free = kl_entropy_terms(
        None, lp.detach(), valid, unclamped, ref_logprobs_BT=ref, entropy_BT=None
    )
    assert free.kl_BT[0, 1].item() == pytest.approx(math.e - 2)
    with pytest.raises(ValueError, match="kl_clamp"):
        dataclasses.replace(spec, kl_clamp=0.0)
