"""Straightforward torch reference for token logprobs from hidden states and an output layer.

This is the ground truth the chunked and (future) Triton paths are tested against: it
materialises the full ``[N, V]`` logits in whatever dtype it is given (tests pass float64),
so it is only meant for small shapes, single process, full vocabulary. Autograd provides its
gradients, which makes it an independent check of the hand-written backward passes.
"""

from __future__ import annotations

import torch


def linear_logprob_reference(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    targets_N: torch.Tensor,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of ``targets_N`` (and optionally the entropy) under ``softmax(h W^T / T)``.

    Args:
        hidden_NH: final hidden states ``[N, H]``.
        weight_VH: output-layer weight over the FULL vocabulary ``[V, H]``, same dtype.
        targets_N: target token ids ``[N]`` (int64), each in ``[0, V)``.
        temperature: logits are divided by it (sampling temperature of the rollout).
        compute_entropy: also return the entropy ``-sum_v p_v log p_v`` of each row.

    Returns:
        ``(logprob_N, entropy_N or None)`` in the dtype of the inputs; differentiable.
    """
    logits_NV = (hidden_NH @ weight_VH.T) / temperature
    logp_NV = torch.log_softmax(logits_NV, dim=-1)
    logprob_N = logp_NV.gather(-1, targets_N.long().unsqueeze(-1)).squeeze(-1)
    entropy_N = None
    if compute_entropy:
        entropy_N = -(logp_NV.exp() * logp_NV).sum(dim=-1)
    return logprob_N, entropy_N
