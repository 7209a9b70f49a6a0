"""The math verifier (rewards/math.py), on real answer pairs (equivalent
LaTeX/fraction/decimal forms)."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.rewards import Judgement
from dapo_megatron.rewards import math as math_verifier
from unit.rewards.answer_pairs import MATH_PAIRS


@pytest.mark.parametrize(("response", "truth", "expected"), MATH_PAIRS)
def test_math_answer_pairs(response: str, truth: str, expected: float) -> None:
    assert math_verifier.score(response, truth) == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        # The Answer: line wins over any box, even one written after it.
        ("\\boxed{5}\nAnswer: 6", "6", 1.0),
        ("\\boxed{5}\nAnswer: 6", "5", 0.0),
        ("Answer: 6\nHmm, or maybe \\boxed{5}", "6", 1.0),
        # The last Answer: line and the last box win.
        ("Answer: 5\nWait, that is wrong.\nAnswer: 6", "6", 1.0),
        ("first \\boxed{5}, then \\boxed{6}", "6", 1.0),
        ("first \\boxed{5}, then \\boxed{6}", "5", 0.0),
        # "answer:" inside a sentence is not the answer line.
        ("So my answer: first we factor.\n\\boxed{5}", "5", 1.0),
        # An empty Answer: falls back to the box.
        ("\\boxed{7}\nAnswer:", "7", 1.0),
        ("\\fbox{7}", "7", 1.0),
        ("\\boxed 7", "7", 1.0),
    ],
)
def test_math_answer_precedence(response: str, truth: str, expected: float) -> None:
    assert math_verifier.score(response, truth) == expected


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{\\{1,2\\}} end", "\\{1,2\\}"),  # escaped braces are not groups
        ("\\boxed{a}\\boxed{b{c}}", "b{c}"),
        ("\\boxed{5} and cut off \\boxed{\\frac{1}{2", "5"),  # unterminated: previous box
        ("\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "{" * 10_000 + "1" + "}" * 10_000),
        ("no box", None),
        ("\\boxed{", None),
    ],
)
def test_last_boxed_matches_braces(text: str, content: str | None) -> None:
    assert math_verifier.last_boxed(text) == content


@pytest.mark.parametrize(
    "response",
    [
        "I think it is 34.",
        "",
        "Answer:",
        "Answer: " + "1" * (math_verifier.MAX_ANSWER_CHARS + 1),  # too long to be an answer
        "\\boxed{34}" + " and more" * math_verifier.MAX_RESPONSE_CHARS,  # outside the window
    ],
)
def test_math_no_answer(response: str) -> None:
    assert math_verifier.judge(response, "34") == Judgement(0.0, None)


def test_math_extraction_is_linear_on_pathological_boxes() -> None:
    # Thousands of unterminated boxes (quadratic for a scan per box), deep nesting. CPU
    # time of this process, not wall time: other processes' load must not fail the test.
    for response in ("\\boxed{" * 1200, "\\boxed{" + "{" * 8000, "\\boxed{\\{" * 1000):
        start = time.process_time()
        assert math_verifier.extract_answer(response) is None
        assert time.process_time() - start < 0.2


def test_math_reads_only_the_tail_of_huge_responses() -> None:
    response = "blah " * 200_000 + "\nAnswer: 34"
    start = time.process_time()  # CPU time: immune to other processes' load
    assert math_verifier.score(response, "34") == 1.0
    assert time.process_time() - start < 0.5


@settings(max_examples=20, deadline=None)
@given(
    p=st.integers(-50, 50),
    q=st.integers(1, 50),
    k=st.integers(2, 9),
)
def test_math_equivalent_fraction_forms(p: int, q: int, k: int) -> None:
    value = Fraction(p, q)
    truth = f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    assert math_verifier.score(f"Answer: {p * k}/{q * k}", truth) == 1.0
    wrong = value + Fraction(1, 7)
    assert math_verifier.score(f"Answer: {wrong.numerator}/{wrong.denominator}", truth) == 0.0
