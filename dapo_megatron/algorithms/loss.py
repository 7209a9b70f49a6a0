"""The DAPO policy loss in torch: clipped policy gradient, aggregation, the combined loss.

The loss has one public entry point, ``kernels.pg_loss.pg_loss`` (what the policy step
calls); ``torch_policy_loss`` here is its torch implementation (``impl="torch"``) and the
reference the fused Triton kernel is tested against. Pieces:

- ``_clipped_pg``: PPO clipped surrogate with DAPO's decoupled clip range ("clip-higher":
  ``clip_ratio_high`` may exceed ``clip_ratio_low``) and optional dual clip.
- ``loss_denominator`` / ``aggregate_terms``: reduction of per-token losses to a scalar with
  an explicit GLOBAL normaliser, so the mini-batch loss does not depend on how the
  mini-batch is split into micro-batches or data-parallel ranks.
- ``torch_policy_loss``: per-token ``weight * pg + kl_coef * kl - entropy_coef * entropy``,
  masked and aggregated, plus detached metric sums; ``reduce_loss_metrics`` turns those into
  means.

The hyper-parameters arrive as one ``LossSpec``, validated when it was built; nothing here
validates them again.

Shapes: ``B`` samples x ``T`` response tokens (padded). ``mask_BT`` is the loss mask, any dtype,
non-zero on valid tokens. Per-token values at invalid positions never reach the loss or its
gradient (they are selected away with ``torch.where``, not multiplied by 0, so that ``-inf``/NaN
padding cannot turn into NaN).

Micro-batch invariance, the contract between caller and this module::

    denom = sum(loss_denominator(mb.mask, mode) for mb in all micro-batches on all DP ranks)
    loss_mb = pg_loss(LossInputs(..., normalizer=denom), loss).loss  # each micro-batch
    sum(loss_mb) == loss of the whole mini-batch       # whatever the split

With data parallelism, the gradients of the per-rank sums are summed (not averaged) across
ranks; a framework that averages must multiply the loss by the DP size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from dapo_megatron.algorithms.kl import (
    LOG_RATIO_CLAMP,
    KLEntropyTerms,
    check_same_shape,
    compute_dtype,
    kl_entropy_terms,
    kl_estimate,
)
from dapo_megatron.algorithms.loss_inputs import LossInputs

# LossAggMode and LOSS_AGG_MODES are re-exported: callers import them from here.
from dapo_megatron.algorithms.loss_spec import LOSS_AGG_MODES as LOSS_AGG_MODES
from dapo_megatron.algorithms.loss_spec import LossAggMode as LossAggMode
from dapo_megatron.algorithms.loss_spec import (
    LossSpec,
    validate_agg_mode,
)
from dapo_megatron.algorithms.rollout_correction import correction_weights


def _check_2d(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected 2 dims [B, T]")


def expand_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Accept per-token ``[B, T]`` or per-sample ``[B]`` advantages; return ``[B, T]``."""
    if advantages.shape == shape:
        return advantages
    if advantages.dim() == 1 and len(shape) == 2 and advantages.shape[0] == shape[0]:
        return advantages.unsqueeze(-1).expand(shape)
    raise ValueError(
        f"advantages_BT has shape {tuple(advantages.shape)}, expected {tuple(shape)} "
        f"or [{shape[0] if len(shape) else '?'}] (one advantage per sample)"
    )


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------


def loss_denominator(
    mask_BT: torch.Tensor,
    loss_agg_mode: LossAggMode,
    *,
    loss_scale_length: int | None = None,
) -> torch.Tensor:
    """This micro-batch's contribution to the global loss normaliser.

    Sum the returned values over every micro-batch of the mini-batch on every data-parallel
    rank (e.g. with an all-reduce) and pass the total as ``normalizer`` to ``aggregate_terms`` /
    ``torch_policy_loss`` for each micro-batch.

    - ``"token-mean"``: number of valid tokens.
    - ``"seq-mean-token-sum"``, ``"seq-mean-token-mean"``: number of sequences with at least one
      valid token. Sequences whose mask is entirely zero (e.g. overlong-filtered samples) are not
      counted, so they do not dilute the mean.
    - ``"seq-mean-token-sum-norm"``: (number of sequences with >= 1 valid token) *
      ``loss_scale_length``, a constant such as the maximum response length (required here).

    Args:
        mask_BT: ``[B, T]`` loss mask, non-zero = valid token.
        loss_agg_mode: one of ``LOSS_AGG_MODES``.
        loss_scale_length: positive int, used (and required) only by ``"seq-mean-token-sum-norm"``.

    Returns:
        0-dim float64 tensor on ``mask_BT``'s device. float64 keeps counts exact up to 2^53, so
        summing them over many micro-batches and ranks loses nothing (float32 stops at 2^24).
    """
    _check_2d("mask_BT", mask_BT)
    validate_agg_mode(loss_agg_mode)
    valid_BT = mask_BT != 0
    if loss_agg_mode == "token-mean":
        return valid_BT.sum().to(torch.float64)
    num_seqs = valid_BT.any(dim=-1).sum().to(torch.float64)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if (
            not isinstance(loss_scale_length, int)
            or isinstance(loss_scale_length, bool)
            or loss_scale_length <= 0
        ):
            raise ValueError(
                f"loss_scale_length={loss_scale_length!r} must be a positive int "
                "for loss_agg_mode='seq-mean-token-sum-norm'"
            )
        return num_seqs * loss_scale_length
    return num_seqs


def aggregate_terms(
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    loss: LossSpec,
    normalizer: torch.Tensor | float,
) -> torch.Tensor:
    """``_aggregate`` with ``loss.loss_agg_mode``, trusting ``loss`` (it validated itself
    when it was built): the per-micro-batch path validates no hyper-parameter again."""
    return _aggregate(values_BT, mask_BT, loss.loss_agg_mode, normalizer)


def _aggregate(
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    loss_agg_mode: LossAggMode,
    normalizer: torch.Tensor | float,
) -> torch.Tensor:
    """Reduce per-token values to this micro-batch's share of the mini-batch loss.

    Never divides by a local count: with ``normalizer`` the global sum of ``loss_denominator``,
    the results of all micro-batches SUM to the mini-batch loss.

    - ``"token-mean"``, ``"seq-mean-token-sum"``, ``"seq-mean-token-sum-norm"``:
      ``sum(values * mask) / normalizer`` (the modes differ only by their denominator);
    - ``"seq-mean-token-mean"``: ``sum_s(sum_t(values * mask) / max(len_s, 1)) / normalizer``,
      ``len_s`` the number of valid tokens of sequence ``s``.

    If ``normalizer <= 0`` (no valid token in the whole mini-batch) the result is
    ``0 * sum(masked values)``: zero, finite, and still attached to the graph so that
    ``backward()`` works. This branch is taken on device, without a host sync.

    The loss mode is trusted (a ``LossSpec``'s: ``aggregate_terms``); the tensors are checked.

    Args:
        values_BT: ``[B, T]`` per-token values (with grad).
        mask_BT: ``[B, T]`` mask, non-zero = valid; invalid positions are ignored whatever
            their value (even NaN).
        loss_agg_mode: one of ``LOSS_AGG_MODES``.
        normalizer: global denominator, a Python number or a one-element tensor (detached).

    Returns:
        0-dim tensor in ``compute_dtype(values_BT)`` (>= float32).
    """
    _check_2d("values_BT", values_BT)
    check_same_shape("values_BT", values_BT, "mask_BT", mask_BT)
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ValueError(
                f"normalizer has shape {tuple(normalizer.shape)}, expected a single element"
            )
        normalizer = normalizer.detach().reshape(())
    elif not (isinstance(normalizer, (int, float)) and math.isfinite(normalizer)):
        raise ValueError(f"normalizer={normalizer!r} must be a finite number or a 1-element tensor")

    dtype = compute_dtype(values_BT)
    valid_BT = mask_BT != 0
    masked_BT = torch.where(valid_BT, values_BT.to(dtype), 0.0)
    if loss_agg_mode == "seq-mean-token-mean":
        lengths_B = valid_BT.sum(dim=-1).clamp(min=1).to(dtype)
        total = (masked_BT.sum(dim=-1) / lengths_B).sum()
    else:
        total = masked_BT.sum()

    norm = torch.as_tensor(normalizer, dtype=dtype, device=total.device)
    positive = norm > 0
    safe_norm = torch.where(positive, norm, torch.ones_like(norm))
    return torch.where(positive, total / safe_norm, total * 0.0)


# --------------------------------------------------------------------------------------------
# Clipped policy gradient
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClippedPGOutput:
    """Per-token results of ``_clipped_pg`` (all ``[B, T]``, unmasked)."""

    loss_BT: torch.Tensor
    """Per-token clipped surrogate loss (with grad), dtype >= float32."""
    ratio_BT: torch.Tensor
    """``exp(clamped log-ratio)`` = pi_theta / pi_old (with grad)."""
    log_ratio_BT: torch.Tensor
    """``logprobs - old_logprobs``, clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]``."""
    clipped_upper_BT: torch.Tensor
    """bool: ``A > 0`` and ``ratio > 1 + clip_ratio_high`` (zero gradient)."""
    clipped_lower_BT: torch.Tensor
    """bool: ``A < 0`` and ``ratio < 1 - clip_ratio_low`` (zero gradient)."""
    dual_clipped_BT: torch.Tensor
    """bool: ``A < 0`` and ``ratio > clip_ratio_c`` (zero gradient); all False without dual clip."""


def _clipped_pg(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
) -> ClippedPGOutput:
    """PPO clipped surrogate with decoupled clip range (DAPO clip-higher) and dual clip.

    With ``ratio = exp(logprobs - old_logprobs)`` and advantage ``A``::

        loss = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))
        if clip_ratio_c is set and A < 0:  loss = min(loss, -A * clip_ratio_c)

    The dual clip bounds the loss of negative-advantage tokens whose ratio has exploded (the
    plain max would otherwise grow without bound with the ratio).

    Args:
        logprobs_BT: ``[B, T]`` current policy log-probabilities (with grad).
        old_logprobs_BT: ``[B, T]`` log-probabilities before the update (no grad needed).
        advantages_BT: ``[B, T]`` per-token or ``[B]`` per-sample advantages.
        clip_ratio_low, clip_ratio_high, clip_ratio_c: a ``LossSpec``'s (trusted: validated
            when the spec was built); ``clip_ratio_c`` None disables the dual clip.

    Returns:
        ``ClippedPGOutput`` with the per-token loss, ratio, log-ratio and clip indicators, all
        unmasked and in ``compute_dtype`` (>= float32).
    """
    low, high, c = clip_ratio_low, clip_ratio_high, clip_ratio_c
    _check_2d("logprobs_BT", logprobs_BT)
    check_same_shape("logprobs_BT", logprobs_BT, "old_logprobs_BT", old_logprobs_BT)
    advantages_BT = expand_advantages(advantages_BT, logprobs_BT.shape)

    dtype = compute_dtype(logprobs_BT, old_logprobs_BT, advantages_BT)
    # Difference in >= float32 (bf16 would round away the small differences that matter), and
    # clamped before exp: a difference of ~89 overflows float32 to inf and inf * 0 = NaN.
    # Clamped tokens get zero gradient, which only matters for an A < 0 token without dual clip
    # whose ratio exceeds e^20; its true gradient (~A * 5e8) would wreck the update anyway.
    log_ratio_BT = (logprobs_BT.to(dtype) - old_logprobs_BT.to(dtype)).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    ratio_BT = torch.exp(log_ratio_BT)
    adv_BT = advantages_BT.to(dtype)

    surrogate_BT = -adv_BT * ratio_BT
    clipped_surrogate_BT = -adv_BT * ratio_BT.clamp(1.0 - low, 1.0 + high)
    loss_BT = torch.maximum(surrogate_BT, clipped_surrogate_BT)

    positive_BT = adv_BT > 0
    negative_BT = adv_BT < 0
    clipped_upper_BT = positive_BT & (ratio_BT > 1.0 + high)
    clipped_lower_BT = negative_BT & (ratio_BT < 1.0 - low)
    if c is not None:
        # Only for A < 0: for A >= 0 the bound -A * c would be <= 0 and wrongly cap the loss.
        loss_BT = torch.where(negative_BT, torch.minimum(loss_BT, -adv_BT * c), loss_BT)
        dual_clipped_BT = negative_BT & (ratio_BT > c)
    else:
        dual_clipped_BT = torch.zeros_like(negative_BT)
    return ClippedPGOutput(
        loss_BT=loss_BT,
        ratio_BT=ratio_BT,
        log_ratio_BT=log_ratio_BT,
        clipped_upper_BT=clipped_upper_BT,
        clipped_lower_BT=clipped_lower_BT,
        dual_clipped_BT=dual_clipped_BT,
    )


# --------------------------------------------------------------------------------------------
# Combined loss and metrics
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyLossOutput:
    """Result of ``torch_policy_loss`` for one micro-batch."""

    loss: torch.Tensor
    """0-dim loss with grad: this micro-batch's share; shares sum to the mini-batch loss."""
    metrics: dict[str, torch.Tensor]
    """Detached 0-dim float64 tensors: SUMS over this micro-batch's effective tokens (loss mask
    AND MIS mask), ``*_max``/``*_min`` extrema, and counts. Reduce across micro-batches/ranks by
    the op of ``metric_reduction(key)``, then call ``reduce_loss_metrics``. Keys: ``pg_loss_sum``
    (correction-weighted), ``clipfrac_upper_sum``, ``clipfrac_lower_sum``, ``clipfrac_dual_sum``,
    ``approx_kl_sum`` (k3 of KL(pi_old || pi_theta)), ``ratio_sum``, ``ratio_max``, ``ratio_min``
    (-inf / +inf when empty), ``rollout_weight_sum``, ``num_valid_tokens``, ``num_masked_by_mis``
    (valid tokens dropped by MIS), plus ``kl_sum`` if ``ref_logprobs_BT`` was given and
    ``entropy_sum`` if ``entropy_BT`` was given."""


_ALWAYS_PRESENT_METRICS: tuple[str, ...] = (
    "pg_loss_sum",
    "clipfrac_upper_sum",
    "clipfrac_lower_sum",
    "clipfrac_dual_sum",
    "approx_kl_sum",
    "ratio_sum",
    "ratio_max",
    "ratio_min",
    "rollout_weight_sum",
    "num_valid_tokens",
    "num_masked_by_mis",
)


def metric_reduction(key: str) -> Literal["sum", "max", "min"]:
    """How a ``PolicyLossOutput.metrics`` entry combines across micro-batches and ranks."""
    if key.endswith("_max"):
        return "max"
    if key.endswith("_min"):
        return "min"
    return "sum"


def _loss_metrics(
    pg: ClippedPGOutput,
    weighted_pg_BT: torch.Tensor,
    weights_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    logprobs_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    effective_BT: torch.Tensor,
    terms: KLEntropyTerms,
) -> dict[str, torch.Tensor]:
    """Detached per-micro-batch sums/extrema over the effective tokens (see PolicyLossOutput)."""
    f64 = torch.float64

    def masked_sum(x_BT: torch.Tensor) -> torch.Tensor:
        return torch.where(effective_BT, x_BT.detach(), 0).sum().to(f64)

    ratio_BT = pg.ratio_BT.detach()
    if ratio_BT.numel() > 0:
        ratio_max = torch.where(effective_BT, ratio_BT, -math.inf).amax().to(f64)
        ratio_min = torch.where(effective_BT, ratio_BT, math.inf).amin().to(f64)
    else:  # amax/amin refuse empty tensors; use the neutral elements of max/min
        ratio_max = torch.tensor(-math.inf, dtype=f64, device=ratio_BT.device)
        ratio_min = torch.tensor(math.inf, dtype=f64, device=ratio_BT.device)
    metrics = {
        "pg_loss_sum": masked_sum(weighted_pg_BT),
        "clipfrac_upper_sum": masked_sum(pg.clipped_upper_BT),
        "clipfrac_lower_sum": masked_sum(pg.clipped_lower_BT),
        "clipfrac_dual_sum": masked_sum(pg.dual_clipped_BT),
        # Tokens were sampled (approximately) from pi_old, so k3 with log r = new - old
        # estimates KL(pi_old || pi_theta).
        "approx_kl_sum": masked_sum(kl_estimate(old_logprobs_BT, logprobs_BT.detach(), "k3")),
        "ratio_sum": masked_sum(ratio_BT),
        "ratio_max": ratio_max,
        "ratio_min": ratio_min,
        "rollout_weight_sum": masked_sum(weights_BT),
        "num_valid_tokens": effective_BT.sum().to(f64),
        "num_masked_by_mis": (valid_BT & ~effective_BT).sum().to(f64),
    }
    metrics.update(terms.metric_sums(effective_BT))
    return metrics


def torch_policy_loss(inputs: LossInputs, loss: LossSpec) -> PolicyLossOutput:
    """DAPO policy loss of one micro-batch, in torch: what ``kernels.pg_loss.pg_loss`` (the
    loss's one entry point) runs for ``impl="torch"``, and the Triton kernel's reference.

    Per token: ``w * pg + kl_coef * kl - entropy_coef * entropy`` where ``pg`` is
    ``_clipped_pg``, ``w`` the rollout-correction weight (TIS; 1 otherwise), ``kl``
    the ``kl_estimator`` estimate against ``ref_logprobs_BT`` (added only if ``kl_coef > 0``) and
    the entropy term added only if ``entropy_coef > 0`` (all settings from ``loss``). Tokens
    outside ``mask_BT`` or rejected by MIS are dropped; the rest is reduced with
    ``aggregate_terms(..., loss, normalizer)``.

    ``normalizer`` must be the global sum of ``loss_denominator`` over the mini-batch. With MIS,
    compute it from the mask returned by ``rollout_correction_weights`` (MIS depends only on
    old/rollout logprobs, known before training) so that rejected tokens do not dilute the mean;
    using the raw mask instead counts them as zero-loss tokens (still micro-batch invariant).

    Args:
        inputs: the micro-batch's tensors and the global normaliser (see ``LossInputs``).
        loss: the loss's hyper-parameters (clip ratios: see ``_clipped_pg``;
            rollout correction: see ``rollout_correction_weights``; KL and entropy: see
            ``kl.kl_entropy_terms``), trusted: ``LossSpec`` validated them when it was built,
            so no micro-batch validates them again.

    Returns:
        ``PolicyLossOutput`` (loss and detached metric sums).
    """
    inputs.check(loss)
    logprobs_BT, mask_BT = inputs.logprobs_BT, inputs.mask_BT
    rollout_logprobs_BT = inputs.rollout_logprobs_BT

    valid_BT = mask_BT != 0

    # Padding may hold garbage (-inf logprobs, NaN entropies). Selecting it away here keeps
    # both passes clean: masking only at the end would still backpropagate 0 * NaN = NaN.
    def clean(t_BT: torch.Tensor) -> torch.Tensor:
        return torch.where(valid_BT, t_BT, 0)

    lp_BT = clean(logprobs_BT)
    old_BT = clean(inputs.old_logprobs_BT)
    adv_BT = clean(expand_advantages(inputs.advantages, logprobs_BT.shape))

    pg = _clipped_pg(
        lp_BT, old_BT, adv_BT, loss.clip_ratio_low, loss.clip_ratio_high, loss.clip_ratio_c
    )
    dtype = pg.loss_BT.dtype
    if rollout_logprobs_BT is not None:
        weights_BT, corrected_mask_BT = correction_weights(
            old_BT, clean(rollout_logprobs_BT), mask_BT, loss
        )
        effective_BT = valid_BT & (corrected_mask_BT != 0)
    else:
        weights_BT = torch.ones_like(pg.loss_BT)
        effective_BT = valid_BT

    weighted_pg_BT = weights_BT.to(dtype) * pg.loss_BT
    terms = kl_entropy_terms(
        weighted_pg_BT,
        lp_BT,
        valid_BT,
        loss,
        ref_logprobs_BT=inputs.ref_logprobs_BT,
        entropy_BT=inputs.entropy_BT,
    )
    assert terms.per_token_BT is not None  # it started from weighted_pg_BT

    total = aggregate_terms(terms.per_token_BT, effective_BT, loss, inputs.normalizer)
    metrics = _loss_metrics(
        pg,
        weighted_pg_BT,
        weights_BT,
        old_BT,
        lp_BT,
        valid_BT,
        effective_BT,
        terms,
    )
    return PolicyLossOutput(loss=total, metrics=metrics)


def reduce_loss_metrics(
    metrics_list: Sequence[Mapping[str, torch.Tensor | float]],
) -> dict[str, float]:
    """Combine ``PolicyLossOutput.metrics`` of several micro-batches (or ranks) into means.

    Sums and counts are added, ``*_max``/``*_min`` reduced by max/min, then each sum is divided
    by the total ``num_valid_tokens`` (0 when there is no valid token; ratio extrema too).
    All dicts must have the same keys. Output keys: ``loss/pg_loss``, ``clipfrac/upper``,
    ``clipfrac/lower``, ``clipfrac/dual``, ``clipfrac/total``, ``policy/approx_kl``,
    ``policy/ratio_mean``, ``policy/ratio_max``, ``policy/ratio_min``,
    ``rollout_correction/weight_mean``, ``rollout_correction/mis_masked_frac`` (share of loss-mask
    tokens dropped by MIS), ``num_valid_tokens``, ``num_masked_by_mis``, and ``kl/ref_kl`` /
    ``policy/entropy`` when the inputs carry ``kl_sum`` / ``entropy_sum``.

    Each tensor value costs a host sync: across ranks, all-reduce the raw dicts first (one
    stacked tensor per ``metric_reduction`` op) and call this once on the result.
    """
    if len(metrics_list) == 0:
        raise ValueError("metrics_list is empty, expected at least one metrics dict")
    keys = set(metrics_list[0])
    for i, m in enumerate(metrics_list):
        if set(m) != keys:
            raise ValueError(
                f"metrics_list[{i}] has keys {sorted(m)}, expected {sorted(keys)} (as item 0)"
            )
    if not set(_ALWAYS_PRESENT_METRICS) <= keys:
        required = set(_ALWAYS_PRESENT_METRICS)
        raise ValueError(f"metrics_list lacks keys {sorted(required - keys)}")

    combine: dict[str, Callable[[Iterable[float]], float]] = {"sum": sum, "max": max, "min": min}
    totals = {k: combine[metric_reduction(k)](float(m[k]) for m in metrics_list) for k in keys}
    n = totals["num_valid_tokens"]

    def mean(key: str) -> float:
        return totals[key] / n if n > 0 else 0.0

    num_masked = totals["num_masked_by_mis"]
    out = {
        "loss/pg_loss": mean("pg_loss_sum"),
        "clipfrac/upper": mean("clipfrac_upper_sum"),
        "clipfrac/lower": mean("clipfrac_lower_sum"),
        "clipfrac/dual": mean("clipfrac_dual_sum"),
        # The three clip events are disjoint (A > 0 / A < 0 with ratio < 1 / A < 0 with ratio > c).
        "clipfrac/total": mean("clipfrac_upper_sum")
        + mean("clipfrac_lower_sum")
        + mean("clipfrac_dual_sum"),
        "policy/approx_kl": mean("approx_kl_sum"),
        "policy/ratio_mean": mean("ratio_sum"),
        "policy/ratio_max": totals["ratio_max"] if n > 0 else 0.0,
        "policy/ratio_min": totals["ratio_min"] if n > 0 else 0.0,
        "rollout_correction/weight_mean": mean("rollout_weight_sum"),
        "rollout_correction/mis_masked_frac": (
            num_masked / (n + num_masked) if n + num_masked > 0 else 0.0
        ),
        "num_valid_tokens": n,
        "num_masked_by_mis": num_masked,
    }
    if "kl_sum" in keys:
        out["kl/ref_kl"] = mean("kl_sum")
    if "entropy_sum" in keys:
        out["policy/entropy"] = mean("entropy_sum")
    return out
