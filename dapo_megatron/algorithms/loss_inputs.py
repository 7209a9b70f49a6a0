"""What the DAPO policy loss of one micro-batch reads: ``LossInputs``.

Both implementations of the loss take it, the torch reference
(``algorithms.loss.torch_policy_loss``) and the dispatcher to the fused kernel
(``kernels.pg_loss.pg_loss``), together with the loss's hyper-parameters (``LossSpec``), so a
new input is added here once and both see it; ``LossInputs.check`` is the one set of tensor
checks both run.

Shapes: ``B`` samples x ``T`` response tokens (padded), prediction-aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo_megatron.algorithms.kl import check_same_shape
from dapo_megatron.algorithms.loss_spec import LossSpec


@dataclass(frozen=True)
class LossInputs:
    """The tensors of one micro-batch's policy loss and its global normaliser."""

    logprobs_BT: torch.Tensor
    """``[B, T]`` current policy log-probabilities (with grad)."""
    old_logprobs_BT: torch.Tensor
    """``[B, T]`` trainer log-probabilities before the update (no grad needed)."""
    advantages: torch.Tensor
    """``[B, T]`` per-token or ``[B]`` per-sample advantages (broadcast over tokens)."""
    mask_BT: torch.Tensor
    """``[B, T]`` loss mask, any dtype, non-zero = valid token."""
    normalizer: torch.Tensor | float
    """The GLOBAL denominator: ``loss_denominator`` summed over every micro-batch of the
    mini-batch on every data-parallel rank (a number or a one-element tensor, detached)."""
    rollout_logprobs_BT: torch.Tensor | None = None
    """``[B, T]`` engine log-probabilities; required unless ``loss.rollout_correction`` is
    ``"none"``."""
    ref_logprobs_BT: torch.Tensor | None = None
    """``[B, T]`` reference-policy log-probabilities; required if ``loss.kl_coef > 0``, only
    reported (``kl_sum``) when given with ``kl_coef == 0``."""
    entropy_BT: torch.Tensor | None = None
    """``[B, T]`` per-token entropy (with grad if trained); required if
    ``loss.entropy_coef > 0``, only reported (``entropy_sum``) when given with
    ``entropy_coef == 0``."""

    def check(self, loss: LossSpec) -> None:
        """Shapes, and the optional inputs that ``loss`` makes required; raises ValueError
        naming the field. The scalars need no check: ``LossSpec`` validated them when it was
        built, and the normaliser is checked where it is used."""
        if self.logprobs_BT.dim() != 2:
            raise ValueError(
                f"logprobs_BT has shape {tuple(self.logprobs_BT.shape)}, expected 2 dims [B, T]"
            )
        tensors = (
            ("old_logprobs_BT", self.old_logprobs_BT),
            ("mask_BT", self.mask_BT),
            ("rollout_logprobs_BT", self.rollout_logprobs_BT),
            ("ref_logprobs_BT", self.ref_logprobs_BT),
            ("entropy_BT", self.entropy_BT),
        )
        for name, t in tensors:
            if t is not None:
                check_same_shape("logprobs_BT", self.logprobs_BT, name, t)
        if loss.rollout_correction != "none" and self.rollout_logprobs_BT is None:
            raise ValueError(
                f"rollout_correction={loss.rollout_correction!r} requires rollout_logprobs_BT "
                "(got None)"
            )
        if loss.kl_coef > 0 and self.ref_logprobs_BT is None:
            raise ValueError(f"kl_coef={loss.kl_coef!r} > 0 requires ref_logprobs_BT (got None)")
        if loss.entropy_coef > 0 and self.entropy_BT is None:
            raise ValueError(
                f"entropy_coef={loss.entropy_coef!r} > 0 requires entropy_BT (got None)"
            )
