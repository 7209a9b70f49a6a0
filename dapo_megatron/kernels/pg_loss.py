"""The DAPO policy loss with an implementation choice: torch (``algorithms.loss``) or fused Triton.

:func:`pg_loss` takes exactly the arguments of
:func:`dapo_megatron.algorithms.loss.torch_policy_loss` (one ``LossInputs`` and one ``LossSpec``)
plus ``impl`` and ``block``, and returns the same ``PolicyLossOutput`` (loss and metric sums,
same keys):

  ``"torch"``   calls ``torch_policy_loss`` itself (the reference semantics);
  ``"triton"``  the clipped PG term, rollout correction and metrics in one fused kernel
                (:mod:`.triton_pg_loss`); fp16/bf16/fp32 CUDA tensors (CPU tensors only under
                ``TRITON_INTERPRET=1``, for tests);
  ``"auto"``    ``"triton"`` for fp16/bf16/fp32 CUDA logprobs when triton imports, else
                ``"torch"``, so CPU runs are bit-for-bit the torch path.

What the Triton path does in torch, and why:

- the aggregation weight of each token (``loss_agg_mode`` and the global ``normalizer``
  expressed per token, see :mod:`.triton_pg_loss`): O(B) work, no host sync;
- sequence-level rollout correction: its log weight is a row sum
  (``level_log_weights(level="sequence")``), computed in torch and handed to the kernel as
  a stride-0 view; token-level TIS/MIS run entirely in the kernel;
- for ``seq-mean-token-mean`` with MIS, the per-sequence count of MIS-accepted tokens;
- the optional KL and entropy terms (and their ``kl_sum``/``entropy_sum`` metrics): formed by
  ``algorithms.kl.kl_entropy_terms``, the function ``torch_policy_loss`` adds them with, and
  aggregated with ``aggregate_terms`` on the same effective mask, which is exact because the
  aggregation is linear in the per-token values. The kernel itself computes only the clipped
  policy-gradient term and the rollout correction.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from dapo_megatron.algorithms.kl import kl_entropy_terms
from dapo_megatron.algorithms.loss import (
    PolicyLossOutput,
    aggregate_terms,
    expand_advantages,
    torch_policy_loss,
)
from dapo_megatron.algorithms.loss_inputs import LossInputs
from dapo_megatron.algorithms.loss_spec import LossSpec
from dapo_megatron.algorithms.rollout_correction import level_log_weights
from dapo_megatron.kernels.dispatch import (
    _triton_interpreted,
    triton_auto_allowed,
    triton_available,
)

PGLossImpl = Literal["auto", "torch", "triton"]
PG_LOSS_IMPLS: tuple[str, ...] = ("auto", "torch", "triton")
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def resolve_pg_loss_impl(impl: str, logprobs_BT: torch.Tensor) -> str:
    """The implementation ``impl`` stands for with these logprobs (``"torch"``/``"triton"``)."""
    if impl not in PG_LOSS_IMPLS:
        raise ValueError(f"impl must be one of {PG_LOSS_IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    if (
        logprobs_BT.is_cuda
        and logprobs_BT.dtype in _TRITON_DTYPES
        and triton_available()
        and triton_auto_allowed()
    ):
        return "triton"
    return "torch"


def _validate_triton_inputs(logprobs_BT: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
    """Checks ``torch_policy_loss`` does not need (it accepts any dtype/device mix torch accepts)."""
    if logprobs_BT.dtype not in _TRITON_DTYPES:
        raise ValueError(
            f"impl='triton' takes fp16/bf16/fp32 logprobs_BT, got {logprobs_BT.dtype} "
            "(use impl='torch' for float64)"
        )
    if not triton_available():
        raise ValueError("impl='triton' needs the triton package, which does not import")
    if not logprobs_BT.is_cuda and not _triton_interpreted():
        raise ValueError(
            f"impl='triton' needs CUDA tensors (got {logprobs_BT.device}); CPU tensors "
            "run only under TRITON_INTERPRET=1"
        )
    for name, t in tensors.items():
        if t.device != logprobs_BT.device:
            raise ValueError(f"{name} is on {t.device}, expected {logprobs_BT.device}")
        if t.is_complex() or (name != "mask_BT" and not t.is_floating_point()):
            raise ValueError(f"{name} must be a floating tensor, got dtype {t.dtype}")


def _inverse_normalizer(normalizer: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """``1 / normalizer`` as a 0-dim fp32 tensor, 0 when ``normalizer <= 0`` (no host sync)."""
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ValueError(
                f"normalizer has shape {tuple(normalizer.shape)}, expected a single element"
            )
        norm = normalizer.detach().reshape(()).to(device=device, dtype=torch.float32)
    elif isinstance(normalizer, (int, float)) and math.isfinite(normalizer):
        norm = torch.tensor(float(normalizer), dtype=torch.float32, device=device)
    else:
        raise ValueError(f"normalizer={normalizer!r} must be a finite number or a 1-element tensor")
    positive = norm > 0
    return torch.where(positive, 1.0 / torch.where(positive, norm, 1.0), 0.0)


def pg_loss(
    inputs: LossInputs,
    loss: LossSpec,
    *,
    impl: PGLossImpl = "auto",
    block: int | None = None,
) -> PolicyLossOutput:
    """DAPO policy loss of one micro-batch; same arguments and result as ``torch_policy_loss``.

    Args:
        inputs, loss: see :func:`dapo_megatron.algorithms.loss.torch_policy_loss` (``loss`` is
            trusted: it validated itself when it was built).
        impl: ``"auto"``, ``"torch"`` or ``"triton"`` (see the module docstring).
        block: tokens per Triton program (power of two; tests use small ones to cover
            several programs); None picks one per device. Ignored by the torch path.

    Returns:
        ``PolicyLossOutput``: a 0-dim loss (fp32 on the Triton path, ``torch_policy_loss``'s dtype
        on the torch path) and detached float64 metric sums with ``torch_policy_loss``'s keys.
    """
    logprobs_BT = inputs.logprobs_BT
    if resolve_pg_loss_impl(impl, logprobs_BT) == "torch":
        return torch_policy_loss(inputs, loss)

    inputs.check(loss)
    old_logprobs_BT, mask_BT = inputs.old_logprobs_BT, inputs.mask_BT
    rollout_logprobs_BT = inputs.rollout_logprobs_BT
    optional = {
        "old_logprobs_BT": old_logprobs_BT,
        "advantages": inputs.advantages,
        "mask_BT": mask_BT,
        "rollout_logprobs_BT": rollout_logprobs_BT,
        "ref_logprobs_BT": inputs.ref_logprobs_BT,
        "entropy_BT": inputs.entropy_BT,
    }
    _validate_triton_inputs(logprobs_BT, {k: v for k, v in optional.items() if v is not None})
    from dapo_megatron.kernels.triton_pg_loss import CORR_NONE, PGKernelConfig, triton_pg_loss

    shape = logprobs_BT.shape
    device = logprobs_BT.device
    advantages_BT = expand_advantages(inputs.advantages, shape)
    valid_BT = mask_BT != 0
    cfg = PGKernelConfig(loss, block=block)
    log_w_BT = None
    if cfg.correction != CORR_NONE:
        assert rollout_logprobs_BT is not None  # validated above
        if cfg.log_w_is_rollout:
            log_w_BT = rollout_logprobs_BT  # the kernel forms old - rollout itself
        else:
            # Row sums: torch. A stride-0 [B, T] view of one log weight per sequence.
            log_w_BT = level_log_weights(
                torch.where(valid_BT, old_logprobs_BT, 0),
                torch.where(valid_BT, rollout_logprobs_BT, 0),
                mask_BT,
                "sequence",
            )

    # The effective mask is needed in torch only for per-sequence lengths under MIS and for
    # the KL/entropy terms; otherwise it never leaves the kernel.
    extras = inputs.ref_logprobs_BT is not None or inputs.entropy_BT is not None
    effective_BT = valid_BT
    if loss.rollout_correction == "mis" and (extras or loss.loss_agg_mode == "seq-mean-token-mean"):
        effective_BT = _mis_effective_mask(
            old_logprobs_BT, rollout_logprobs_BT, mask_BT, log_w_BT, loss
        )

    inv_norm = _inverse_normalizer(inputs.normalizer, device)
    if loss.loss_agg_mode == "seq-mean-token-mean":
        lengths_B = effective_BT.sum(dim=-1).clamp(min=1).to(torch.float32)
        scale_B = inv_norm / lengths_B
    else:
        scale_B = inv_norm.expand(shape[0])
    scale_BT = scale_B.unsqueeze(-1).expand(shape)

    out = triton_pg_loss(
        logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, scale_BT, cfg, log_w_BT
    )
    metrics = dict(out.sums, ratio_max=out.ratio_max, ratio_min=out.ratio_min)
    total = out.loss
    if extras:
        terms = kl_entropy_terms(
            None,
            torch.where(valid_BT, logprobs_BT, 0),
            valid_BT,
            loss,
            ref_logprobs_BT=inputs.ref_logprobs_BT,
            entropy_BT=inputs.entropy_BT,
        )
        metrics.update(terms.metric_sums(effective_BT))
        if terms.per_token_BT is not None:
            extra = aggregate_terms(terms.per_token_BT, effective_BT, loss, inputs.normalizer)
            total = total + extra.to(total.dtype)
    return PolicyLossOutput(loss=total, metrics=metrics)


def _mis_effective_mask(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor | None,
    mask_BT: torch.Tensor,
    log_w_BT: torch.Tensor | None,
    loss: LossSpec,
) -> torch.Tensor:
    """The loss mask AND the MIS acceptance, computed in torch as the kernel does it."""
    if loss.rollout_correction_level == "token":
        assert rollout_logprobs_BT is not None  # validated by the caller
        log_w_full_BT = level_log_weights(old_logprobs_BT, rollout_logprobs_BT, mask_BT, "token")
    else:
        assert log_w_BT is not None  # the sequence-level log weight the kernel receives
        log_w_full_BT = log_w_BT
    log_low = math.log(loss.mis_low) if loss.mis_low > 0 else -math.inf
    # Compared in fp32, like the kernel, so both agree on tokens at the interval's edge.
    log_w32_BT = log_w_full_BT.float()
    accepted_BT = (log_w32_BT >= log_low) & (log_w32_BT <= math.log(loss.mis_high))
    return (mask_BT != 0) & accepted_BT
