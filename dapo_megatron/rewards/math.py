"""The math verifier: DAPO-Math-17k / AIME style answers, compared with math-verify.

The answer of a response is the rest of its LAST line that starts with ``Answer:`` (DAPO's
prompt asks for a final line ``Answer: $Answer``; ``**Answer:**`` and ``Final Answer:`` count
too); a response without one falls back to its last complete ``\\boxed{...}``. The answer is
then compared with the ground truth:

1. equal strings after whitespace and ``\\dfrac``/``\\tfrac`` normalisation score 1 at once;
2. two plain integers (the whole of DAPO-Math-17k and AIME) are compared as integers;
3. anything else goes to math-verify (``parse`` of both, wrapped in ``\\boxed{}`` so LaTeX and
   plain forms parse alike, then ``verify``), so 1/2, 0.5 and \\frac{1}{2} are one answer.

math-verify's own timeouts use ``signal.alarm``, which only works in a process's main thread,
so they are switched off here; time limits are the caller's job (``rewards.pool`` kills a
worker process that overruns). Only the last :data:`MAX_RESPONSE_CHARS` characters of a
response are read and an answer longer than :data:`MAX_ANSWER_CHARS` counts as no answer,
which keeps megabyte outputs and garbage "answers" away from the LaTeX parser.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any

from dapo_megatron.rewards.base import Judgement, Verifier, clip_tail

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_RESPONSE_CHARS",
    "VERIFIER",
    "extract_answer",
    "is_equivalent",
    "judge",
    "last_boxed",
    "score",
]

MAX_RESPONSE_CHARS = 8192
"""Only this many trailing characters of a response are searched for the answer."""

MAX_ANSWER_CHARS = 512
"""Longer extracted answers count as no answer (competition answers are far shorter)."""

# "Answer:", "Final Answer:", "**Answer:**", "**Answer**:", "## Answer:" at the start of a
# line. Only at the start: "so my answer: first, ..." mid-reasoning must not hide the box.
_ANSWER_RE = re.compile(r"^[ \t>#*_]*(?:final[ \t]+)?answer[ \t*_]*:", re.IGNORECASE | re.MULTILINE)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# An escaped character (so \{ and \} are not groups), or a brace.
_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)
_BARE_ARGUMENT_RE = re.compile(r"[^\s${}\\]+")
_INTEGER_RE = re.compile(r"[-+]?\d+")
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)"), ("**", "**"))
_SPACE_RE = re.compile(r"\s+")


def last_boxed(text: str) -> str | None:
    """Return the content of the last complete ``\\boxed{...}`` (or ``\\fbox``) in ``text``.

    Braces are paired with a stack in one pass, not a regex, so nested groups such as
    ``\\boxed{\\frac{1}{2}}`` come out whole, and deep nesting or thousands of unterminated
    boxes cost linear time. Escaped braces (``\\{``) do not count. An unterminated box (a
    response cut off mid-answer) is skipped in favour of the previous complete one.
    ``\\boxed 5`` (no braces) gives ``5``.
    """
    boxes = list(_BOX_RE.finditer(text))
    if not boxes:
        return None
    # Braces before the first box cannot change how the braces after it pair up.
    pairs = _brace_pairs(text, boxes[0].start())
    for box in reversed(boxes):
        i = box.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            if i in pairs:
                return text[i + 1 : pairs[i]]
        else:
            # TeX's "\boxed 5": the argument is the next token.
            token = _BARE_ARGUMENT_RE.match(text, i)
            if token:
                return token.group(0)
    return None


def _brace_pairs(text: str, start: int) -> dict[int, int]:
    """Map the index of each ``{`` at or after ``start`` to the index of its ``}``."""
    pairs: dict[int, int] = {}
    open_at: list[int] = []
    for token in _BRACE_TOKEN_RE.finditer(text, start):
        char = token.group()
        if char == "{":
            open_at.append(token.start())
        elif char == "}" and open_at:
            pairs[open_at.pop()] = token.start()
    return pairs


def _after_last_answer_marker(text: str) -> str | None:
    matches = list(_ANSWER_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :]
    line = rest.split("\n", 1)[0]
    if _clean(line) is not None:
        return line
    # "Answer:" alone on its line, the answer in the next paragraph (e.g. display math).
    return rest.lstrip("\n").split("\n\n", 1)[0]


def _clean(answer: str) -> str | None:
    """Strip the decoration around an answer; ``None`` when nothing (sensible) is left."""
    if len(answer) > 4 * MAX_ANSWER_CHARS:  # decoration is a few characters; skip the work
        return None
    text = _strip_decoration(answer)
    if not text or len(text) > MAX_ANSWER_CHARS:
        return None
    return text


def _strip_decoration(answer: str) -> str:
    boxed = last_boxed(answer)
    text = (boxed if boxed is not None else answer).strip()
    changed = True
    while changed and text:
        changed = False
        for opening, closing in _WRAPPERS:
            fits = len(text) >= len(opening) + len(closing)
            if fits and text.startswith(opening) and text.endswith(closing):
                text = text[len(opening) : -len(closing)].strip()
                changed = True
        # A sentence-final period, or bold markers left by "**Answer:** 42".
        stripped = text.rstrip(".").strip("*").strip()
        if stripped != text:
            text, changed = stripped, True
    return text


def extract_answer(response: str) -> str | None:
    """Return the answer of ``response``: the last ``Answer:`` line, else the last box.

    The ``Answer:`` line wins even over a box written after it: it is the format DAPO's
    prompt asks for. An unterminated last box (a response cut off mid-answer) is skipped in
    favour of the previous complete one.

    Delimiters around the answer (``$...$``, ``\\(...\\)``, ``**``, a box, a final period)
    are removed. ``None`` when the response holds neither form, or the answer is longer than
    :data:`MAX_ANSWER_CHARS`.
    """
    text = clip_tail(response, MAX_RESPONSE_CHARS)
    after_marker = _after_last_answer_marker(text)
    answer = None if after_marker is None else _clean(after_marker)
    if answer is not None:
        return answer
    # No "Answer:", or nothing usable after it ("Answer:" as the last words): the box.
    boxed = last_boxed(text)
    return None if boxed is None else _clean(boxed)


def _squash(answer: str) -> str:
    text = _SPACE_RE.sub("", answer)
    return text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


class _DropDisabledTimeoutWarning(logging.Filter):
    # math-verify warns that its timeouts are off; that is deliberate here (see the module
    # docstring) and would otherwise be printed by every fresh worker process.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@functools.lru_cache(maxsize=1)
def _math_verify() -> tuple[Callable[..., list[Any]], Callable[..., bool]]:
    # Imported on first use: it pulls in sympy (about a second), which a process that never
    # verifies math (the controller, the arithmetic task) should not pay for.
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropDisabledTimeoutWarning())
    return math_verify.parse, math_verify.verify


@functools.lru_cache(maxsize=4096)
def _parse(answer: str) -> tuple[Any, ...]:
    parse, _ = _math_verify()
    # Wrapping in \boxed{} makes math-verify read the whole string as one LaTeX answer,
    # whether it is written as LaTeX (\frac{1}{2}) or plain text (1/2, 0.5).
    return tuple(parse("\\boxed{" + answer + "}", parsing_timeout=None))


@functools.lru_cache(maxsize=16384)
def is_equivalent(answer: str, ground_truth: str) -> bool:
    """Return whether two cleaned answers are the same mathematical object.

    Cached: the samples of one prompt group share a ground truth and often an answer. Not
    time-limited; see the module docstring.
    """
    if _squash(answer) == _squash(ground_truth):
        return True
    if _INTEGER_RE.fullmatch(answer) and _INTEGER_RE.fullmatch(ground_truth):
        return int(answer) == int(ground_truth)
    gold, predicted = _parse(ground_truth), _parse(answer)
    if not gold or not predicted:
        return False
    _, verify = _math_verify()
    return bool(verify(list(gold), list(predicted), timeout_seconds=None))


def judge(response: str, ground_truth: str) -> Judgement:
    """Score ``response`` against ``ground_truth`` (1.0 or 0.0) and return the answer read.

    The ground truth is cleaned like an answer, so ``$\\frac{1}{2}$`` or ``\\boxed{3}`` work.
    """
    answer = extract_answer(response)
    if answer is None:
        return Judgement(0.0, None)
    truth = _strip_decoration(ground_truth)  # trusted data: no length guard
    if not truth:
        raise ValueError(f"ground truth {ground_truth!r} is empty")
    return Judgement(1.0 if is_equivalent(answer, truth) else 0.0, answer)


def score(response: str, ground_truth: str) -> float:
    """Return 1.0 if ``response`` answers ``ground_truth`` correctly, else 0.0."""
    return judge(response, ground_truth).score


VERIFIER = Verifier(
    name="math",
    judge=judge,
    cheap=False,
    keep="tail",
    max_chars=MAX_RESPONSE_CHARS,
    warmup=("Answer: \\frac{1}{2}", "0.5"),
)
"""Registry entry: math-verify can take seconds (or hang) on adversarial input, so it runs in
the process pool."""
