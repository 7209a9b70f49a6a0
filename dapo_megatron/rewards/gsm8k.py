"""The GSM8K verifier: the final number of a response against the ground-truth number.

The final number is the first number after the last ``####`` (GSM8K's own answer marker), or
else the last number in the text. Thousands separators and dollar signs are dropped and the
values are compared as decimals, so ``$1,234.00`` equals ``1234``. The ground truth may be a
bare number or a whole GSM8K solution ending in ``#### 42``; the same rule extracts it.

Only the last :data:`MAX_RESPONSE_CHARS` characters are read and the patterns are linear, so
the verifier is cheap on any input and runs in the caller's process.
"""

from __future__ import annotations

import re
from decimal import Decimal

from dapo_megatron.rewards.base import Judgement, Verifier, clip_tail

__all__ = ["MAX_RESPONSE_CHARS", "VERIFIER", "final_number", "judge", "score"]

MAX_RESPONSE_CHARS = 4096
"""Only this many trailing characters of a response are searched for the final number."""

# Grouped thousands are tried first so "1,234" is one number while "3, 4" stays two. A minus
# (ASCII or Unicode) is a sign only where no word or number precedes it: "pages 10-12" ends
# in 12, not -12. The dollar may sit on either side of the sign.
_NUMBER_RE = re.compile(
    r"(?:(?<![0-9A-Za-z])[-\u2212]\$?|\$[-\u2212]?)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
)
_MARKER = "####"


def _normalise(number: str) -> str:
    return number.replace(",", "").replace("$", "").replace("\u2212", "-")


def final_number(text: str) -> str | None:
    """Return the final number of ``text`` without separators (``"1234.5"``), or ``None``."""
    text = clip_tail(text, MAX_RESPONSE_CHARS)
    marker = text.rfind(_MARKER)
    if marker >= 0:
        after = _NUMBER_RE.search(text, marker + len(_MARKER))
        if after is not None:
            return _normalise(after.group(0))
    numbers = _NUMBER_RE.findall(text)
    return _normalise(numbers[-1]) if numbers else None


def judge(response: str, ground_truth: str) -> Judgement:
    """Score the final number of ``response`` against ``ground_truth`` (1.0 or 0.0).

    Raises ``ValueError`` when the ground truth holds no number (a data error, which the pool
    counts rather than scoring as a wrong answer).
    """
    truth = final_number(ground_truth)
    if truth is None:
        raise ValueError(f"ground truth {ground_truth[-80:]!r} holds no number")
    answer = final_number(response)
    if answer is None:
        return Judgement(0.0, None)
    return Judgement(1.0 if Decimal(answer) == Decimal(truth) else 0.0, answer)


def score(response: str, ground_truth: str) -> float:
    """Return 1.0 if the final number of ``response`` equals ``ground_truth``, else 0.0."""
    return judge(response, ground_truth).score


VERIFIER = Verifier(
    name="gsm8k",
    judge=judge,
    cheap=True,
    keep="tail",
    max_chars=MAX_RESPONSE_CHARS,
    warmup=("#### 1", "1"),
)
"""Registry entry: regexes over a bounded tail, cheap enough to run in the caller."""
