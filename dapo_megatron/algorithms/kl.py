"""KL-divergence estimators and the entropy bonus of the policy loss.

The KL estimators follow J. Schulman, "Approximating KL Divergence" (2020). With samples drawn
from the policy whose log-probabilities are ``logprobs_BT`` and ``log r = ref - logprobs``:

- ``k1 = -log r = logprobs - ref``: unbiased, high variance, can be negative per token;
- ``k2 = 0.5 * (log r)^2``: biased, low variance, always >= 0;
- ``k3 = (r - 1) - log r``: unbiased, low variance, always >= 0.

All of them estimate ``KL(pi_logprobs || pi_ref)`` per token. Shapes: ``B`` samples x ``T``
response tokens (padded); the estimators are elementwise, masking and aggregation are the
caller's job (see ``dapo_megatron.algorithms.loss``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo_megatron.algorithms.loss_spec import (
    KL_ESTIMATORS,
    KLEstimator,
    LossSpec,
    validate_choice,
    validate_range,
)

# Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exponentiation:
# exp(20) ~ 4.9e8 is still finite in float32 (and bf16), whereas a -inf reference logprob or a
# bf16-rounded difference of ~90 would overflow to inf and poison the loss with inf/NaN.
LOG_RATIO_CLAMP = 20.0


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Dtype in which log-ratio arithmetic is done: the inputs' promoted dtype, at least float32.

    bf16/fp16 logprobs carry ~3 significant digits; subtracting two of them in that precision
    would destroy the small differences the ratios depend on, so we always upcast first.
    """
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """Raise ValueError unless ``b`` has the same shape as ``a`` (message names both)."""
    if a.shape != b.shape:
        raise ValueError(
            f"{name_b} has shape {tuple(b.shape)}, expected {tuple(a.shape)} (the shape of {name_a})"
        )


def kl_penalty(
    logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    estimator: KLEstimator,
) -> torch.Tensor:
    """Per-token KL estimate of ``KL(pi || pi_ref)`` from tokens sampled from ``pi``.

    Args:
        logprobs_BT: ``[B, T]`` log-probabilities of the sampled tokens under ``pi`` (the
            policy being trained; gradients flow through this argument).
        ref_logprobs_BT: ``[B, T]`` log-probabilities of the same tokens under ``pi_ref``.
        estimator: ``"k1"`` (``logprobs - ref``), ``"k2"`` (``0.5 * (logprobs - ref)^2``) or
            ``"k3"`` (``exp(ref - logprobs) - (ref - logprobs) - 1``).

    Returns:
        ``[B, T]`` per-token estimates in ``compute_dtype`` (>= float32), unmasked. For ``k3``
        the log-ratio is clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` (in both terms, so
        the result stays >= 0 and finite); beyond the clamp the estimate saturates and its
        gradient is zero.
    """
    validate_choice("estimator", estimator, KL_ESTIMATORS)
    return kl_estimate(logprobs_BT, ref_logprobs_BT, estimator)


def kl_estimate(
    logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, estimator: KLEstimator
) -> torch.Tensor:
    """``kl_penalty`` trusting ``estimator`` (a literal, or a ``LossSpec``'s value, validated
    when the spec was built): the per-micro-batch path validates nothing again."""
    check_same_shape("logprobs_BT", logprobs_BT, "ref_logprobs_BT", ref_logprobs_BT)
    dtype = compute_dtype(logprobs_BT, ref_logprobs_BT)
    diff_BT = logprobs_BT.to(dtype) - ref_logprobs_BT.to(dtype)  # = -log r
    if estimator == "k1":
        return diff_BT
    if estimator == "k2":
        return 0.5 * diff_BT.square()
    log_r_BT = (-diff_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # expm1(x) - x instead of exp(x) - 1 - x: for small |x| the latter cancels to an absolute
    # error of ~eps, which is larger than the x^2/2 value itself once |x| < sqrt(eps).
    return torch.expm1(log_r_BT) - log_r_BT


def entropy_bonus_per_token(entropy_BT: torch.Tensor, entropy_coef: float) -> torch.Tensor:
    """Per-token term that the entropy bonus adds to the loss: ``-entropy_coef * entropy_BT``.

    The loss is minimised, so subtracting the entropy rewards a more exploratory policy. Because
    aggregation is linear, adding this term per token before ``aggregate_terms`` equals subtracting
    ``entropy_coef`` times the aggregated entropy.

    Args:
        entropy_BT: ``[B, T]`` per-token entropy of the policy's next-token distribution
            (computed by the caller, usually vocab-parallel, with gradient if it is to be trained).
        entropy_coef: coefficient >= 0.

    Returns:
        ``[B, T]`` tensor in ``compute_dtype(entropy_BT)``, unmasked.
    """
    validate_range("entropy_coef", entropy_coef)
    return _entropy_bonus(entropy_BT, entropy_coef)


def _entropy_bonus(entropy_BT: torch.Tensor, entropy_coef: float) -> torch.Tensor:
    """``entropy_bonus_per_token`` trusting ``entropy_coef`` (checked by it, or a
    ``LossSpec``'s value)."""
    return -entropy_coef * entropy_BT.to(compute_dtype(entropy_BT))


# --------------------------------------------------------------------------------------------
# The KL and entropy terms of the policy loss (both loss implementations call this)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KLEntropyTerms:
    """The KL and entropy terms of one micro-batch's policy loss (``kl_entropy_terms``)."""

    per_token_BT: torch.Tensor | None
    """``[B, T]``: the per-token loss passed in plus ``kl_coef * kl`` and the entropy bonus,
    each added only when its coefficient is > 0; None when None was passed in and nothing was
    added."""
    kl_BT: torch.Tensor | None
    """``[B, T]`` ``kl_estimator`` estimate against the reference (0-filled inputs outside the
    loss mask); None without reference logprobs."""
    entropy_BT: torch.Tensor | None
    """``[B, T]`` entropy, 0 outside the loss mask; None without entropies."""

    def metric_sums(self, effective_BT: torch.Tensor) -> dict[str, torch.Tensor]:
        """``kl_sum`` / ``entropy_sum`` (for the terms present): detached float64 sums over
        ``effective_BT`` (the loss mask AND the MIS acceptance), as ``torch_policy_loss`` reports
        its other metrics."""

        def masked_sum(x_BT: torch.Tensor) -> torch.Tensor:
            return torch.where(effective_BT, x_BT.detach(), 0).sum().to(torch.float64)

        metrics: dict[str, torch.Tensor] = {}
        if self.kl_BT is not None:
            metrics["kl_sum"] = masked_sum(self.kl_BT)
        if self.entropy_BT is not None:
            metrics["entropy_sum"] = masked_sum(self.entropy_BT)
        return metrics


def kl_entropy_terms(
    per_token_BT: torch.Tensor | None,
    logprobs_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    loss: LossSpec,
    *,
    ref_logprobs_BT: torch.Tensor | None,
    entropy_BT: torch.Tensor | None,
) -> KLEntropyTerms:
    """Add ``kl_coef * kl`` and ``-entropy_coef * entropy`` to a per-token loss.

    The one place these terms are formed: the torch loss passes its rollout-weighted clipped
    PG term, the fused kernel's dispatch passes None (the kernel has aggregated the PG term
    already; the aggregation is linear, so the terms are aggregated apart and added).

    Args:
        per_token_BT: ``[B, T]`` per-token loss to add to, or None to start from nothing.
        logprobs_BT: ``[B, T]`` current log-probabilities, already 0 outside ``valid_BT``
            (the very tensor the PG term read, so both gradients meet in one node).
        valid_BT: ``[B, T]`` bool loss mask; padding in the optional inputs (NaN, -inf) is
            selected away with it before any arithmetic.
        loss: ``kl_coef``, ``kl_estimator``, ``kl_clamp`` and ``entropy_coef`` are read, trusted
            (``LossSpec`` validated them when it was built).
        ref_logprobs_BT: ``[B, T]`` reference log-probabilities, or None.
        entropy_BT: ``[B, T]`` per-token entropy, or None.
    """

    def clean(t_BT: torch.Tensor) -> torch.Tensor:
        return torch.where(valid_BT, t_BT, 0)

    kl_BT = None
    if ref_logprobs_BT is not None:
        kl_BT = kl_estimate(logprobs_BT, clean(ref_logprobs_BT), loss.kl_estimator)
        if loss.kl_clamp is not None:
            kl_BT = kl_BT.clamp(-loss.kl_clamp, loss.kl_clamp)
        if loss.kl_coef > 0:
            kl_term_BT = loss.kl_coef * kl_BT
            per_token_BT = kl_term_BT if per_token_BT is None else per_token_BT + kl_term_BT
    clean_entropy_BT = None
    if entropy_BT is not None:
        clean_entropy_BT = clean(entropy_BT)
        if loss.entropy_coef > 0:
            bonus_BT = _entropy_bonus(clean_entropy_BT, loss.entropy_coef)
            per_token_BT = bonus_BT if per_token_BT is None else per_token_BT + bonus_BT
    return KLEntropyTerms(per_token_BT=per_token_BT, kl_BT=kl_BT, entropy_BT=clean_entropy_BT)
