"""Token logprobs (and entropy) straight from final hidden states and the output layer.

:func:`linear_logprob` is the single entry point the Megatron policy uses for its logprob
pass and train step. It never materialises the fp32 ``[tokens, vocab]`` logits (the chunked
path recomputes logit chunks in backward), works with a vocab-parallel output layer over a
tensor-parallel group, and picks an implementation with ``impl`` (see :mod:`.dispatch`).
:func:`pg_loss` is the DAPO policy loss with the same choice (torch, or the fused Triton
kernel of :mod:`.triton_pg_loss`; see :mod:`.pg_loss`).
"""

from dapo_megatron.kernels.dispatch import LOGPROB_IMPLS, LogprobImpl, linear_logprob
from dapo_megatron.kernels.pg_loss import PG_LOSS_IMPLS, PGLossImpl, pg_loss

__all__ = [
    "LOGPROB_IMPLS",
    "PG_LOSS_IMPLS",
    "LogprobImpl",
    "PGLossImpl",
    "linear_logprob",
    "pg_loss",
]
