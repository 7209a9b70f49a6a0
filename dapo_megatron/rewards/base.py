"""What every verifier is: a pure ``judge`` function plus the facts the pool needs about it.

A verifier reads one response and its ground truth and returns a :class:`Judgement` (the score
and the answer it extracted, ``None`` when the response holds no answer). The pool runs the
same ``judge`` in worker processes, so it must be a module-level function (picklable by name),
and it must be total on its inputs: whatever the response, it returns or raises, and the pool
turns an exception into a counted error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["Judgement", "Verifier", "clip_head", "clip_tail"]


class Judgement(NamedTuple):
    """The verdict on one response."""

    score: float
    """1.0 when the extracted answer matches the ground truth, else 0.0."""
    answer: str | None
    """The answer read from the response (after clipping); ``None`` when there is none."""


@dataclass(frozen=True)
class Verifier:
    """A named verifier and how to run it."""

    name: str
    """Registry name, the value of ``reward.verifier`` in the config."""
    judge: Callable[[str, str], Judgement]
    """``judge(response, ground_truth)``: module-level, so worker processes can unpickle it."""
    cheap: bool
    """Bounded, microsecond-scale work on any input: scored in the caller's process, since a
    process round trip would cost more than the verification and no time limit is needed."""
    keep: Literal["head", "tail"]
    """Which end of a response can hold the answer; the other end is dropped before the
    response crosses a process boundary."""
    max_chars: int
    """How many characters of that end the verifier reads (the pre-truncation guard)."""
    warmup: tuple[str, str] = ("", "0")
    """A (response, ground_truth) pair a fresh worker judges before it takes work, so lazy
    imports and first-call caches do not eat into a real sample's time limit."""

    def clip(self, response: str) -> str:
        """Return the part of ``response`` this verifier reads."""
        if self.keep == "head":
            return clip_head(response, self.max_chars)
        return clip_tail(response, self.max_chars)


def clip_tail(text: str, max_chars: int) -> str:
    """Return the last ``max_chars`` characters of ``text``.

    Answers sit at the end of a reasoning trace, so a 10^6-character response costs no more to
    verify than a short one.
    """
    return text if len(text) <= max_chars else text[-max_chars:]


def clip_head(text: str, max_chars: int) -> str:
    """Return the first ``max_chars`` characters of ``text`` after its leading whitespace."""
    text = text.lstrip()
    return text if len(text) <= max_chars else text[:max_chars]
