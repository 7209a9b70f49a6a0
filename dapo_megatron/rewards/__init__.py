"""Verifiers: turn a response and its ground truth into a 0/1 score.

Three verifiers are registered by name (the ``reward.verifier`` config values): ``math``
(DAPO-Math-17k / AIME, math-verify), ``gsm8k`` (final number) and ``arithmetic`` (exact
integer match for the synthetic task). Each module offers a pure ``score(response,
ground_truth) -> float``; training scores batches through :class:`VerifierPool`, which adds
per-sample time limits, crash isolation and counts of what went wrong.

Importing this package is light: math-verify (and sympy) load on the first math verification.
"""

from dapo_megatron.rewards.base import Judgement, Verifier
from dapo_megatron.rewards.pool import VerifierPool, VerifyResult
from dapo_megatron.rewards.registry import VERIFIERS, get_verifier, score
from dapo_megatron.rewards.worker import (
    STATUS_ERROR,
    STATUS_NO_ANSWER,
    STATUS_OK,
    STATUS_TIMEOUT,
    judge_safely,
)

__all__ = [
    "STATUS_ERROR",
    "STATUS_NO_ANSWER",
    "STATUS_OK",
    "STATUS_TIMEOUT",
    "VERIFIERS",
    "Judgement",
    "Verifier",
    "VerifierPool",
    "VerifyResult",
    "get_verifier",
    "judge_safely",
    "score",
]
