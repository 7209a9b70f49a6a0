"""Sampling one token per row from the last logits (temperature, top-k, then top-p), the
step of megatron/inference.py's decode loop that draws the next tokens."""

from __future__ import annotations

import torch

from dapo_megatron.shared.sampling import SamplingParams


def sample_next_tokens(
    logits_BV: torch.Tensor, sampling: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens [B] int64, logprobs [B] fp32).

    The logprob is ``log_softmax(logits / temperature)`` at the sampled token, over the
    whole vocabulary (before truncation). Truncation: top-k keeps the k largest logits
    (ties at the k-th value kept), then top-p keeps the smallest prefix of the remaining
    tokens, by decreasing probability, whose renormalised mass reaches top_p. top_k=1 is
    the argmax and draws nothing from the generator.

    Args:
        logits_BV: fp32 logits over the real vocabulary (padding rows already removed).
        sampling: temperature, top_k, top_p.
        generator: the call's random generator, on the logits' device.
    """
    scaled = logits_BV / sampling.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    vocab = scaled.shape[-1]
    if sampling.top_k == 1:
        tokens = scaled.argmax(dim=-1)
    else:
        if 1 < sampling.top_k < vocab:
            kth = scaled.topk(sampling.top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if sampling.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            # A token is dropped when the more likely ones already reach top_p; the first
            # token is never dropped (mass_before == 0 < top_p).
            drop_sorted = mass_before >= sampling.top_p
            drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
        # Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks i with probability
        # p_i / sum(p), for any unnormalised p; unlike multinomial it needs no host sync.
        # The clamp keeps a zero draw (possible in fp32) from turning 0/0 into a NaN winner.
        race = torch.empty_like(probs).exponential_(generator=generator)
        race.clamp_(min=torch.finfo(race.dtype).tiny)
        tokens = (probs / race).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
