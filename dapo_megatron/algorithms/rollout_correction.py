"""Correction for the mismatch between the rollout engine and the trainer.

The rollout engine (vLLM, with its own kernels, precision and sometimes quantisation) and the
trainer (Megatron) assign slightly different log-probabilities to the same sampled tokens. The
samples therefore come from ``pi_rollout`` while the PPO ratio is taken against ``pi_old`` (the
trainer before the update), which biases the gradient. Two corrections are offered, both based
on the importance weight ``w = pi_old / pi_rollout``:

- TIS (truncated importance sampling): multiply each token's policy-gradient loss by
  ``min(w, tis_cap)``; the cap bounds the variance.
- MIS (masked importance sampling): keep weights at 1 but drop tokens (or whole sequences)
  whose ``w`` falls outside ``[mis_low, mis_high]``: those samples are too off-policy to trust.

Either can use per-token weights (``level="token"``) or one weight per sequence
(``level="sequence"``, the product over the sequence's valid tokens).

Shapes: ``B`` samples x ``T`` response tokens, padded; ``mask_BT`` is non-zero on valid tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from dapo_megatron.algorithms.kl import (
    LOG_RATIO_CLAMP,
    check_same_shape,
    compute_dtype,
    kl_penalty,
)
from dapo_megatron.algorithms.loss_spec import (
    ROLLOUT_CORRECTION_LEVELS,
    LossSpec,
    RolloutCorrectionLevel,
    RolloutCorrectionMode,
    validate_choice,
    validate_rollout_correction_args,
)

MISMATCH_METRIC_KEYS: tuple[str, ...] = (
    "mismatch/token_mult_prob_error",
    "mismatch/abs_logprob_diff_mean",
    "mismatch/abs_logprob_diff_max",
    "mismatch/k3_kl",
)


def _check_inputs(
    old_logprobs_BT: torch.Tensor, rollout_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor
) -> None:
    if old_logprobs_BT.dim() != 2:
        raise ValueError(
            f"old_logprobs_BT has shape {tuple(old_logprobs_BT.shape)}, expected 2 dims [B, T]"
        )
    check_same_shape("old_logprobs_BT", old_logprobs_BT, "rollout_logprobs_BT", rollout_logprobs_BT)
    check_same_shape("old_logprobs_BT", old_logprobs_BT, "mask_BT", mask_BT)


def rollout_log_weights(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    level: RolloutCorrectionLevel,
) -> torch.Tensor:
    """Detached log importance weights ``log(pi_old / pi_rollout)``, shape ``[B, T]``.

    ``level="token"``: ``old - rollout`` per token. ``level="sequence"``: the sum of
    ``old - rollout`` over the sequence's valid tokens, broadcast to all its positions.
    Invalid (padding) positions hold 0 (weight 1) at token level, so that garbage there (e.g.
    ``-inf`` logprobs) never produces NaN; they are masked out downstream anyway.
    """
    validate_choice("level", level, ROLLOUT_CORRECTION_LEVELS)
    return level_log_weights(old_logprobs_BT, rollout_logprobs_BT, mask_BT, level)


def level_log_weights(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    level: RolloutCorrectionLevel,
) -> torch.Tensor:
    """``rollout_log_weights`` trusting ``level`` (a literal, or a ``LossSpec``'s value, which
    it validated when it was built): the per-micro-batch path validates nothing again."""
    _check_inputs(old_logprobs_BT, rollout_logprobs_BT, mask_BT)
    dtype = compute_dtype(old_logprobs_BT, rollout_logprobs_BT)
    valid_BT = mask_BT != 0
    diff_BT = old_logprobs_BT.detach().to(dtype) - rollout_logprobs_BT.detach().to(dtype)
    diff_BT = torch.where(valid_BT, diff_BT, 0.0)
    if level == "token":
        return diff_BT
    return diff_BT.sum(dim=-1, keepdim=True).expand_as(diff_BT)


def rollout_correction_weights(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    mode: RolloutCorrectionMode,
    level: RolloutCorrectionLevel,
    tis_cap: float,
    mis_low: float,
    mis_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights and loss mask correcting the rollout/trainer mismatch.

    With ``w = exp(old - rollout)`` per token (``level="token"``) or
    ``w = exp(sum over the sequence's valid tokens of (old - rollout))`` broadcast to the
    sequence's tokens (``level="sequence"``):

    - ``mode="none"``: weights 1, mask unchanged;
    - ``mode="tis"``: weights ``min(w, tis_cap)``, mask unchanged;
    - ``mode="mis"``: weights 1, mask zeroed where ``w`` lies outside ``[mis_low, mis_high]``
      (bounds inclusive); at sequence level the whole sequence is dropped.

    Args:
        old_logprobs_BT: ``[B, T]`` trainer log-probabilities before the update.
        rollout_logprobs_BT: ``[B, T]`` log-probabilities reported by the rollout engine.
        mask_BT: ``[B, T]`` loss mask (non-zero = valid token), any dtype.
        mode, level: see above.
        tis_cap: TIS truncation, > 0.
        mis_low, mis_high: MIS acceptance interval, ``0 <= mis_low < 1 < mis_high``.

    Returns:
        ``(weights_BT, mask_BT)``: detached weights in ``compute_dtype`` (>= float32; 1 at padding
        positions), and the new mask in the input mask's dtype.
    """
    validate_rollout_correction_args(mode, level, tis_cap, mis_low, mis_high)
    return _correction_weights(
        old_logprobs_BT, rollout_logprobs_BT, mask_BT, mode, level, tis_cap, mis_low, mis_high
    )


def correction_weights(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    loss: LossSpec,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rollout_correction_weights`` with the settings of ``loss``, trusted (``LossSpec``
    validated them when it was built): the per-micro-batch path validates nothing again."""
    return _correction_weights(
        old_logprobs_BT,
        rollout_logprobs_BT,
        mask_BT,
        loss.rollout_correction,
        loss.rollout_correction_level,
        loss.tis_cap,
        loss.mis_low,
        loss.mis_high,
    )


def _correction_weights(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: RolloutCorrectionMode,
    level: RolloutCorrectionLevel,
    tis_cap: float,
    mis_low: float,
    mis_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rollout_correction_weights`` with its settings trusted (the tensors are checked)."""
    _check_inputs(old_logprobs_BT, rollout_logprobs_BT, mask_BT)
    dtype = compute_dtype(old_logprobs_BT, rollout_logprobs_BT)
    ones_BT = torch.ones(mask_BT.shape, dtype=dtype, device=mask_BT.device)
    if mode == "none":
        return ones_BT, mask_BT.clone()

    log_w_BT = level_log_weights(old_logprobs_BT, rollout_logprobs_BT, mask_BT, level)
    if mode == "tis":
        # Truncating in log space means exp never sees more than log(tis_cap): no overflow even
        # for sequence-level weights, which are sums over thousands of tokens.
        weights_BT = torch.exp(log_w_BT.clamp(max=math.log(tis_cap)))
        return weights_BT, mask_BT.clone()

    # MIS: compare in log space so huge sequence-level log-weights are neither clamped nor
    # overflowed; log(0) = -inf accepts every weight on the low side, as intended for mis_low=0.
    log_low = math.log(mis_low) if mis_low > 0 else -math.inf
    keep_BT = (log_w_BT >= log_low) & (log_w_BT <= math.log(mis_high))
    new_mask_BT = ((mask_BT != 0) & keep_BT).to(mask_BT.dtype)
    return ones_BT, new_mask_BT


def mismatch_sums(
    train_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Detached sums / max of the mismatch diagnostics over valid tokens (float64 scalars).

    Keys: ``mismatch_mult_err_sum``, ``mismatch_abs_diff_sum``, ``mismatch_abs_diff_max``,
    ``mismatch_k3_sum``, ``mismatch_count``. Sums add and the ``_max`` takes the max across
    micro-batches and ranks (``algorithms.loss.metric_reduction``); ``mismatch_from_sums``
    turns the combined values into the means of ``mismatch_metrics``. The training pass
    reports them when it also provides the old logprobs (one update per rollout batch).
    """
    _check_inputs(train_logprobs_BT, rollout_logprobs_BT, mask_BT)
    with torch.no_grad():
        valid_BT = mask_BT != 0
        dtype = compute_dtype(train_logprobs_BT, rollout_logprobs_BT)
        train_BT = torch.where(valid_BT, train_logprobs_BT.to(dtype), 0.0)
        rollout_BT = torch.where(valid_BT, rollout_logprobs_BT.to(dtype), 0.0)
        diff_BT = train_BT - rollout_BT
        abs_diff_BT = diff_BT.abs()
        mult_err_BT = torch.expm1(diff_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).abs()
        k3_BT = kl_penalty(rollout_BT, train_BT, "k3")
        # padding holds |0 - 0| = 0, and |d| >= 0, so it cannot win the max
        max_abs = abs_diff_BT.amax() if abs_diff_BT.numel() > 0 else abs_diff_BT.new_zeros(())
        f64 = torch.float64
        return {
            "mismatch_mult_err_sum": mult_err_BT.sum().to(f64),
            "mismatch_abs_diff_sum": abs_diff_BT.sum().to(f64),
            "mismatch_abs_diff_max": max_abs.to(f64),
            "mismatch_k3_sum": k3_BT.where(valid_BT, 0.0).sum().to(f64),
            "mismatch_count": valid_BT.sum().to(f64),
        }


def mismatch_from_sums(sums: Mapping[str, torch.Tensor | float]) -> dict[str, float]:
    """The ``MISMATCH_METRIC_KEYS`` means from (combined) ``mismatch_sums``; an empty mask
    gives zeros, not NaN."""
    denom = max(float(sums["mismatch_count"]), 1.0)
    values = [
        float(sums["mismatch_mult_err_sum"]) / denom,
        float(sums["mismatch_abs_diff_sum"]) / denom,
        float(sums["mismatch_abs_diff_max"]),
        float(sums["mismatch_k3_sum"]) / denom,
    ]
    return dict(zip(MISMATCH_METRIC_KEYS, values, strict=True))


def mismatch_metrics(
    train_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
) -> dict[str, float]:
    """Diagnostics of how far the trainer's log-probabilities are from the rollout engine's.

    Means/max over valid tokens (``mask_BT != 0``) of this batch, with ``d = train - rollout``:

    - ``mismatch/token_mult_prob_error``: mean ``|exp(d) - 1|`` (relative probability error);
    - ``mismatch/abs_logprob_diff_mean``: mean ``|d|``;
    - ``mismatch/abs_logprob_diff_max``: max ``|d|``;
    - ``mismatch/k3_kl``: mean k3 estimate ``exp(d) - d - 1`` of ``KL(pi_rollout || pi_train)``
      (the tokens were sampled by the rollout engine).

    ``exp(d)`` uses ``d`` clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]``. An empty mask gives
    all zeros (no NaN).
    """
    sums = mismatch_sums(train_logprobs_BT, rollout_logprobs_BT, mask_BT)
    values = torch.stack(list(sums.values())).tolist()  # one device-to-host copy
    return mismatch_from_sums(dict(zip(sums, values, strict=True)))
