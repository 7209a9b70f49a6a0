"""Fused Triton kernel for the DAPO clipped policy-gradient loss: loss, gradient, metrics.

One elementwise pass over the ``[B, T]`` tokens replaces the ~40 small torch kernels of
:func:`dapo_megatron.algorithms.loss.torch_policy_loss` (each reading and writing ``[B, T]``
tensors, plus the autograd graph that keeps them alive). Per token, with ``lp``, ``old``,
``A`` zeroed outside the loss mask (as ``torch_policy_loss`` does) and ``eff`` the effective mask
(loss mask AND the MIS acceptance test)::

    r      = exp(clamp(lp - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    pg     = max(-A r, -A clamp(r, 1 - eps_low, 1 + eps_high))
    pg     = min(pg, -A c)                       if dual clip and A < 0
    w      = min(exp(log_w), tis_cap)  (TIS)  |  1  (MIS, none)
    out    = eff * s * w * pg                    s = the aggregation weight of the token

``s`` expresses ``loss_agg_mode`` and the global normaliser as a per-token weight (built by
:mod:`.pg_loss`): ``1 / normalizer`` for ``token-mean``, ``seq-mean-token-sum`` and
``seq-mean-token-sum-norm`` (they differ only in the normaliser), and
``1 / (max(len_s, 1) * normalizer)`` for ``seq-mean-token-mean``; 0 when the normaliser is
<= 0. The loss is the sum of ``out``, so ``d loss / d lp`` is a per-token value, written in
the same pass and saved for backward (no recompute: it is O(N), not O(N x V)).

The gradient follows torch autograd's conventions exactly (ties of ``maximum``/``minimum``
split the gradient in half; clamps pass the gradient on their closed interval), so the
fused path matches ``torch_policy_loss`` in value AND gradient, not only almost everywhere.

``log_w`` (the log importance weight of the rollout correction) is computed in-kernel as
``old - rollout`` for token-level TIS/MIS. Sequence-level correction needs a row reduction
first; the caller computes the per-sequence log weight in torch
(:func:`~dapo_megatron.algorithms.rollout_correction.rollout_log_weights`) and passes it
as a stride-0 ``[B, T]`` view, so the kernel itself stays purely elementwise.

Metrics (the ``PolicyLossOutput.metrics`` sums of ``torch_policy_loss``) are reduced per program
into a ``[programs, NUM_SUMS]`` buffer and summed in float64 by torch: deterministic (no
atomics) and exact enough for counts.

Every input is read through its own (batch, token) strides, so per-sample advantages
``[B]`` broadcast with stride 0 and nothing is copied. Computation is fp32 whatever the
input dtype (fp16/bf16/fp32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from dapo_megatron.algorithms.kl import LOG_RATIO_CLAMP
from dapo_megatron.algorithms.loss_spec import LossSpec
from dapo_megatron.kernels.chunked import _TensorOptions
from dapo_megatron.kernels.compile_check import KernelSpec
from dapo_megatron.kernels.triton_interpret import patch_interpreter

patch_interpreter()  # Triton 3.6's interpreter with NumPy >= 2.4 (triton_interpret.py)

# Column order of the per-program sums buffer.
SUM_KEYS: tuple[str, ...] = (
    "loss",
    "pg_loss_sum",
    "clipfrac_upper_sum",
    "clipfrac_lower_sum",
    "clipfrac_dual_sum",
    "approx_kl_sum",
    "ratio_sum",
    "rollout_weight_sum",
    "num_valid_tokens",
    "num_masked_by_mis",
)
NUM_SUMS = len(SUM_KEYS)

# Rollout-correction variants of the kernel (a constexpr, so each compiles to its own code).
CORR_NONE, CORR_TIS, CORR_MIS = 0, 1, 2


@triton.jit
def _k3_of_log_ratio(x):
    """``expm1(x) - x`` (the k3 KL estimate), accurate for small ``|x|``.

    ``exp(x) - 1 - x`` cancels to an absolute error of ~1e-7 when the value itself is
    ~x^2/2; below |x| = 0.5 the Taylor series (next term x^9/9!, relative error < 4e-8)
    is used instead. Triton has no expm1.
    """
    series = (
        x
        * x
        * (
            0.5
            + x
            * (
                1.0 / 6.0
                + x * (1.0 / 24.0 + x * (1.0 / 120.0 + x * (1.0 / 720.0 + x * (1.0 / 5040.0 + x / 40320.0))))
            )
        )
    )  # fmt: skip
    return tl.where(tl.abs(x) < 0.5, series, tl.exp(x) - 1.0 - x)


@triton.jit
def _pg_loss_kernel(
    lp_ptr,
    old_ptr,
    adv_ptr,
    mask_ptr,
    logw_ptr,
    scale_ptr,
    out_ptr,
    grad_ptr,
    sums_ptr,
    ext_ptr,
    n_tokens,
    seq_len,
    s_lp_b,
    s_lp_t,
    s_old_b,
    s_old_t,
    s_adv_b,
    s_adv_t,
    s_mask_b,
    s_mask_t,
    s_logw_b,
    s_logw_t,
    s_scale_b,
    s_scale_t,
    ratio_lo,
    ratio_hi,
    clip_c,
    log_clamp,
    log_tis_cap,
    mis_log_low,
    mis_log_high,
    DUAL: tl.constexpr,
    CORR: tl.constexpr,
    LOGW_IS_ROLLOUT: tl.constexpr,
    NSUMS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    in_bounds = offs < n_tokens
    offs64 = offs.to(tl.int64)
    b = offs64 // seq_len
    t = offs64 % seq_len

    mask = tl.load(mask_ptr + b * s_mask_b + t * s_mask_t, mask=in_bounds, other=0)
    valid = in_bounds & (mask != 0)
    # Masked loads read 0 at invalid tokens: the same values torch_policy_loss's torch.where(valid,
    # x, 0) produces, so padding garbage (-inf, NaN) never enters any arithmetic.
    lp = tl.load(lp_ptr + b * s_lp_b + t * s_lp_t, mask=valid, other=0.0).to(tl.float32)
    old = tl.load(old_ptr + b * s_old_b + t * s_old_t, mask=valid, other=0.0).to(tl.float32)
    adv = tl.load(adv_ptr + b * s_adv_b + t * s_adv_t, mask=valid, other=0.0).to(tl.float32)

    raw_log_ratio = lp - old
    log_ratio = tl.minimum(tl.maximum(raw_log_ratio, -log_clamp), log_clamp)
    inside_clamp = (raw_log_ratio >= -log_clamp) & (raw_log_ratio <= log_clamp)
    ratio = tl.exp(log_ratio)
    neg_adv = -adv

    surrogate = neg_adv * ratio
    ratio_clipped = tl.minimum(tl.maximum(ratio, ratio_lo), ratio_hi)
    inside_clip = (ratio >= ratio_lo) & (ratio <= ratio_hi)
    clipped = neg_adv * ratio_clipped
    loss = tl.maximum(surrogate, clipped)
    # d loss / d ratio through maximum(): the larger branch's derivative, half of each on a
    # tie (autograd's rule); the clipped branch has derivative -A only inside the clip range.
    d_clipped = tl.where(inside_clip, neg_adv, 0.0)
    d_ratio = tl.where(
        surrogate > clipped,
        neg_adv,
        tl.where(surrogate < clipped, d_clipped, 0.5 * (neg_adv + d_clipped)),
    )
    negative = adv < 0.0
    positive = adv > 0.0
    if DUAL:
        bound = neg_adv * clip_c
        keep_frac = tl.where(loss < bound, 1.0, tl.where(loss == bound, 0.5, 0.0))
        d_ratio = tl.where(negative, d_ratio * keep_frac, d_ratio)
        loss = tl.where(negative, tl.minimum(loss, bound), loss)
        dual_clipped = negative & (ratio > clip_c)
    else:
        dual_clipped = ratio != ratio  # all False (ratio is finite), with the right shape
    d_lp = tl.where(inside_clamp, d_ratio * ratio, 0.0)

    weight = tl.full((BLOCK,), 1.0, tl.float32)
    effective = valid
    if CORR != 0:
        if LOGW_IS_ROLLOUT:
            rollout = tl.load(logw_ptr + b * s_logw_b + t * s_logw_t, mask=valid, other=0.0)
            log_w = old - rollout.to(tl.float32)
        else:
            log_w = tl.load(logw_ptr + b * s_logw_b + t * s_logw_t, mask=valid, other=0.0)
            log_w = log_w.to(tl.float32)
        if CORR == 1:
            # Truncate in log space, as rollout_correction_weights does: exp never overflows.
            weight = tl.exp(tl.minimum(log_w, log_tis_cap))
        else:
            effective = valid & (log_w >= mis_log_low) & (log_w <= mis_log_high)

    scale = tl.load(scale_ptr + b * s_scale_b + t * s_scale_t, mask=effective, other=0.0)
    weighted_pg = weight * loss
    out = tl.where(effective, weighted_pg * scale, 0.0)
    grad = tl.where(effective, d_lp * (weight * scale), 0.0)
    tl.store(out_ptr + offs64, out, mask=in_bounds)
    tl.store(grad_ptr + offs64, grad, mask=in_bounds)

    one = tl.full((BLOCK,), 1.0, tl.float32)
    sums = sums_ptr + pid.to(tl.int64) * NSUMS
    tl.store(sums + 0, tl.sum(out, axis=0))
    tl.store(sums + 1, tl.sum(tl.where(effective, weighted_pg, 0.0), axis=0))
    upper = effective & positive & (ratio > ratio_hi)
    lower = effective & negative & (ratio < ratio_lo)
    tl.store(sums + 2, tl.sum(tl.where(upper, one, 0.0), axis=0))
    tl.store(sums + 3, tl.sum(tl.where(lower, one, 0.0), axis=0))
    tl.store(sums + 4, tl.sum(tl.where(effective & dual_clipped, one, 0.0), axis=0))
    # k3 of KL(pi_old || pi_theta), on the clamped log-ratio like kl_penalty(old, lp, "k3").
    tl.store(sums + 5, tl.sum(tl.where(effective, _k3_of_log_ratio(log_ratio), 0.0), axis=0))
    tl.store(sums + 6, tl.sum(tl.where(effective, ratio, 0.0), axis=0))
    tl.store(sums + 7, tl.sum(tl.where(effective, weight, 0.0), axis=0))
    tl.store(sums + 8, tl.sum(tl.where(effective, one, 0.0), axis=0))
    tl.store(sums + 9, tl.sum(tl.where(valid & (effective == 0), one, 0.0), axis=0))
    ext = ext_ptr + pid.to(tl.int64) * 2
    tl.store(ext + 0, tl.max(tl.where(effective, ratio, float("-inf")), axis=0))
    tl.store(ext + 1, tl.min(tl.where(effective, ratio, float("inf")), axis=0))


_CORRECTIONS = {"none": CORR_NONE, "tis": CORR_TIS, "mis": CORR_MIS}


@dataclass(frozen=True)
class PGKernelConfig:
    """Settings of one fused PG-loss call: the run's ``LossSpec`` (trusted: it validated
    itself on construction) and the launch's block size; the kernel's scalars are read from
    the spec, never copied."""

    loss: LossSpec
    """The loss's hyper-parameters (clip ratios, rollout correction)."""
    block: int | None = None
    """Tokens per program (power of two); None picks one per device."""

    @property
    def correction(self) -> int:
        """CORR_NONE, CORR_TIS or CORR_MIS."""
        return _CORRECTIONS[self.loss.rollout_correction]

    @property
    def log_w_is_rollout(self) -> bool:
        """True: the ``log_w`` input holds rollout logprobs (token level,
        ``log_w = old - rollout`` in-kernel); False: it holds the log weight itself
        (sequence level, computed in torch)."""
        return self.loss.rollout_correction_level == "token"


@dataclass(frozen=True)
class TritonPGOutput:
    """Result of :func:`triton_pg_loss`."""

    loss: torch.Tensor
    """0-dim fp32 loss (sum of ``per_token``), differentiable w.r.t. the logprobs."""
    per_token_BT: torch.Tensor
    """``[B, T]`` fp32 per-token loss contributions (detached; 0 at non-effective tokens)."""
    sums: dict[str, torch.Tensor]
    """Detached 0-dim float64 metric sums, keys ``SUM_KEYS`` without ``"loss"``."""
    ratio_max: torch.Tensor
    """Detached 0-dim float64 max ratio over effective tokens (-inf when none)."""
    ratio_min: torch.Tensor
    """Detached 0-dim float64 min ratio over effective tokens (+inf when none)."""


def _block(device: torch.device, block: int | None) -> int:
    """Tokens per program: 1024 on a GPU (4 warps x 8 elements per thread); larger under the
    interpreter, which pays per program, not per element."""
    if block is not None:
        return block
    return 1024 if device.type == "cuda" else 4096


def compile_specs(arch: int) -> list[KernelSpec]:
    """The launches of :class:`TritonPGLoss` on a GPU of compute capability ``arch``, for the
    ahead-of-time compile check (:mod:`.compile_check`): fp32 logprobs (what
    ``linear_logprob`` returns) with a bool mask, every rollout-correction variant, dual clip
    on. Elementwise: no tensor-core instructions expected."""
    ptrs = ("lp", "old", "adv", "mask", "logw", "scale", "out", "grad", "sums", "ext")
    args = {f"{p}_ptr": "*u8" if p == "mask" else "*fp32" for p in ptrs}
    ints = ("n_tokens", "seq_len") + tuple(
        f"s_{p}_{d}" for p in ("lp", "old", "adv", "mask", "logw", "scale") for d in "bt"
    )
    args.update(dict.fromkeys(ints, "i32"))
    floats = ("ratio_lo", "ratio_hi", "clip_c", "log_clamp", "log_tis_cap", "mis_log_low")
    args.update(dict.fromkeys((*floats, "mis_log_high"), "fp32"))
    divisible = tuple(f"{p}_ptr" for p in ptrs) + ("n_tokens", "seq_len")
    return [
        KernelSpec(
            label=f"pg_loss[{name}]",
            module=__name__,
            kernel="_pg_loss_kernel",
            arch=arch,
            dtype="fp32",
            args=args,
            divisible=divisible,
            constexprs=dict(
                DUAL=True,
                CORR=corr,
                LOGW_IS_ROLLOUT=True,
                NSUMS=NUM_SUMS,
                BLOCK=_block(torch.device("cuda"), None),
            ),
        )  # fmt: skip
        for name, corr in _CORRECTIONS.items()
    ]


def _strides(t: torch.Tensor) -> tuple[int, int]:
    return t.stride(0), t.stride(1)


class TritonPGLoss(torch.autograd.Function):
    """autograd.Function of the fused loss: forward runs the kernel, which also writes
    ``d loss / d lp``; backward scales that saved gradient by the upstream gradient.

    Outputs ``(loss, per_token_BT, sums_K, extrema_2)``; only ``loss`` is differentiable.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logprobs_BT: torch.Tensor,
        old_logprobs_BT: torch.Tensor,
        advantages_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        log_w_BT: torch.Tensor | None,
        scale_BT: torch.Tensor,
        cfg: PGKernelConfig,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        n_seqs, seq_len = logprobs_BT.shape
        n_tokens = n_seqs * seq_len
        device = logprobs_BT.device
        block = _block(device, cfg.block)
        # One program even for an empty batch, so the sums/extrema buffers are always written
        # (with 0 and -inf/+inf) and no special case is needed below.
        programs = max(1, triton.cdiv(n_tokens, block))
        f32 = _TensorOptions(dtype=torch.float32, device=device)
        out_BT = torch.empty(n_seqs, seq_len, **f32)
        grad_BT = torch.empty(n_seqs, seq_len, **f32)
        sums_PK = torch.empty(programs, NUM_SUMS, **f32)
        ext_P2 = torch.empty(programs, 2, **f32)
        if mask_BT.dtype == torch.bool:
            mask_BT = mask_BT.view(torch.uint8)  # Triton loads bool pointers as int1
        logw = log_w_BT if log_w_BT is not None else logprobs_BT  # dummy, never read
        loss = cfg.loss
        mis_log_low = math.log(loss.mis_low) if loss.mis_low > 0 else -math.inf
        _pg_loss_kernel[(programs,)](
            logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, logw, scale_BT,
            out_BT, grad_BT, sums_PK, ext_P2,
            n_tokens, max(seq_len, 1),
            *_strides(logprobs_BT), *_strides(old_logprobs_BT), *_strides(advantages_BT),
            *_strides(mask_BT), *_strides(logw), *_strides(scale_BT),
            1.0 - loss.clip_ratio_low, 1.0 + loss.clip_ratio_high,
            loss.clip_ratio_c if loss.clip_ratio_c is not None else 0.0,
            LOG_RATIO_CLAMP, math.log(loss.tis_cap), mis_log_low, math.log(loss.mis_high),
            DUAL=loss.clip_ratio_c is not None, CORR=cfg.correction,
            LOGW_IS_ROLLOUT=cfg.log_w_is_rollout, NSUMS=NUM_SUMS, BLOCK=block,
        )  # fmt: skip
        sums_K = sums_PK.sum(dim=0, dtype=torch.float64)
        extrema_2 = torch.stack([ext_P2[:, 0].amax(), ext_P2[:, 1].amin()]).to(torch.float64)
        total = sums_K[0].to(torch.float32)
        ctx.save_for_backward(grad_BT)
        ctx.lp_dtype = logprobs_BT.dtype
        ctx.mark_non_differentiable(out_BT, sums_K, extrema_2)
        return total, out_BT, sums_K, extrema_2

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        (grad_BT,) = ctx.saved_tensors
        grad_lp = None
        if ctx.needs_input_grad[0]:
            grad_lp = (grad_BT * grad_loss.to(torch.float32)).to(ctx.lp_dtype)
        return grad_lp, None, None, None, None, None, None


def triton_pg_loss(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    scale_BT: torch.Tensor,
    cfg: PGKernelConfig,
    log_w_BT: torch.Tensor | None = None,
) -> TritonPGOutput:
    """Fused clipped-PG loss, gradient and metric sums; inputs assumed valid (see
    :func:`dapo_megatron.kernels.pg_loss.pg_loss`, which builds ``scale_BT``).

    Args:
        logprobs_BT: ``[B, T]`` fp16/bf16/fp32 current logprobs (with grad); CUDA, or CPU
            under ``TRITON_INTERPRET=1``.
        old_logprobs_BT: ``[B, T]`` logprobs before the update.
        advantages_BT: ``[B, T]`` advantages (a stride-0 view for per-sample advantages).
        mask_BT: ``[B, T]`` loss mask, non-zero = valid (any dtype, bool included).
        scale_BT: ``[B, T]`` fp32 aggregation weight of each token (usually a stride-0 view
            of a per-sequence ``[B]`` tensor).
        cfg: the loss's settings and the block size.
        log_w_BT: ``[B, T]`` rollout logprobs (``cfg.log_w_is_rollout``) or log importance
            weights; required unless ``cfg.correction == CORR_NONE``.

    Returns:
        ``TritonPGOutput``.
    """
    loss, out_BT, sums_K, extrema_2 = TritonPGLoss.apply(
        logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, log_w_BT, scale_BT, cfg
    )
    sums = {key: sums_K[i] for i, key in enumerate(SUM_KEYS) if key != "loss"}
    return TritonPGOutput(
        loss=loss, per_token_BT=out_BT, sums=sums, ratio_max=extrema_2[0], ratio_min=extrema_2[1]
    )
