"""Verifiers by name: the values ``reward.verifier`` may take in a config."""

from __future__ import annotations

from dapo_megatron.rewards import arithmetic, gsm8k, gsm8k_strict, math, remainder
from dapo_megatron.rewards.base import Verifier

__all__ = ["VERIFIERS", "get_verifier", "score"]

VERIFIERS: dict[str, Verifier] = {
    v.name: v
    for v in (
        math.VERIFIER,
        gsm8k.VERIFIER,
        gsm8k_strict.VERL_VERIFIER,
        gsm8k_strict.SKYRL_VERIFIER,
        arithmetic.VERIFIER,
        remainder.VERIFIER,
    )
}
"""Every registered verifier, by name."""


def get_verifier(name: str) -> Verifier:
    """Return the verifier registered as ``name``; ``ValueError`` names the known ones."""
    try:
        return VERIFIERS[name]
    except KeyError:
        raise ValueError(f"unknown verifier {name!r}; known: {sorted(VERIFIERS)}") from None


def score(name: str, response: str, ground_truth: str) -> float:
    """Score one response in this process with the verifier ``name`` (no time limit)."""
    return get_verifier(name).judge(response, ground_truth).score
