"""The arithmetic verifier: exact match for the synthetic arithmetic task.

The task's responses are just the result, so the rule is strict on purpose: the first line of
the response, with surrounding whitespace removed, must be the canonical decimal form of the
integer answer (``str(int(answer))``). Accepted for 19: ``"19"``, ``" 19 "``, ``"19\\n..."``.
Rejected: ``"019"``, ``"+19"``, ``"19.0"``, ``"19 apples"``, ``"-0"`` for 0. A strict rule
gives the tiny CPU policy a sharp signal and makes the reward independent of any parser.

Lines are split on ``"\\n"`` only. The caller passes the decoded response without the EOS
token (decode with ``skip_special_tokens``); the text after the first line is ignored.
"""

from __future__ import annotations

from dapo_megatron.rewards.base import Judgement, Verifier, clip_head

__all__ = ["MAX_RESPONSE_CHARS", "VERIFIER", "judge", "score"]

MAX_RESPONSE_CHARS = 256
"""Only the first this many characters (after leading whitespace) are read."""


def judge(response: str, ground_truth: str) -> Judgement:
    """Score ``response`` against the integer ``ground_truth`` (1.0 or 0.0).

    The candidate is compared as a string, never converted with ``int()``: a response of a
    million digits must not cost a big-integer conversion. Raises ``ValueError`` when the
    ground truth is not an integer.
    """
    expected = str(int(ground_truth.strip()))
    first_line = clip_head(response, MAX_RESPONSE_CHARS).split("\n", 1)[0].strip()
    if not first_line:
        return Judgement(0.0, None)
    return Judgement(1.0 if first_line == expected else 0.0, first_line)


def score(response: str, ground_truth: str) -> float:
    """Return 1.0 if the first line of ``response`` is exactly the integer answer, else 0.0."""
    return judge(response, ground_truth).score


VERIFIER = Verifier(
    name="arithmetic",
    judge=judge,
    cheap=True,
    keep="head",
    max_chars=MAX_RESPONSE_CHARS,
    warmup=("0", "0"),
)
"""Registry entry: a string comparison, scored in the caller's process."""
