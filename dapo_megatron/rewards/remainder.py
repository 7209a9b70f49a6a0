"""The remainder verifier: the final answer of a worked solution, nothing else.

The task (data/remainder.py) asks for the intermediate numbers, then the answer on its own
line. Only that answer line is scored: the text after the LAST ``"\\n"`` of the response,
stripped, must equal the answer line of the ground truth (the reference solution, whose
last line is the integer answer), in canonical decimal form. The scratchpad is not checked:
a wrong step followed by the right answer scores 1, a right scratchpad with a wrong answer 0.

A response without a newline has no answer line and scores 0: a solution cut at the
response cap (its scratchpad unfinished) is wrong, whatever digits it ends with. The caller
passes the decoded response without the EOS token.
"""

from __future__ import annotations

from dapo_megatron.rewards.base import Judgement, Verifier, clip_tail

__all__ = ["MAX_RESPONSE_CHARS", "VERIFIER", "judge", "score"]

MAX_RESPONSE_CHARS = 256
"""Only the last this many characters are read (the answer line is at the end)."""


def judge(response: str, ground_truth: str) -> Judgement:
    """Score the answer line of ``response`` against that of ``ground_truth`` (1.0 or 0.0).

    Compared as strings (no ``int()`` of an arbitrarily long candidate). Raises
    ``ValueError`` when the ground truth's last line is not an integer.
    """
    expected = str(int(ground_truth.rsplit("\n", 1)[-1].strip()))
    text = clip_tail(response.rstrip(), MAX_RESPONSE_CHARS)
    if "\n" not in text:
        return Judgement(0.0, None)
    answer = text.rsplit("\n", 1)[1].strip()
    if not answer:
        return Judgement(0.0, None)
    return Judgement(1.0 if answer == expected else 0.0, answer)


def score(response: str, ground_truth: str) -> float:
    """Return 1.0 if the answer line of ``response`` is exactly the integer answer, else 0.0."""
    return judge(response, ground_truth).score


VERIFIER = Verifier(
    name="remainder",
    judge=judge,
    cheap=True,
    keep="tail",
    max_chars=MAX_RESPONSE_CHARS,
    warmup=("0\n0", "0\n0"),
)
"""Registry entry: a string comparison, scored in the caller's process."""
