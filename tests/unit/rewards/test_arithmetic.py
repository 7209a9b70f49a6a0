"""The arithmetic verifier (rewards/arithmetic.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.rewards import Judgement, arithmetic

# ------------------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("19", 1.0),
        (" 19 ", 1.0),
        ("\n19\n", 1.0),
        ("19\nbecause 12 + 7 = 19", 1.0),
        ("019", 0.0),
        ("+19", 0.0),
        ("19.0", 0.0),
        ("19 apples", 0.0),
        ("1 9", 0.0),
        ("18", 0.0),
        ("1" * 10**6, 0.0),
    ],
)
def test_arithmetic_exact_match(response: str, expected: float) -> None:
    assert arithmetic.score(response, "19") == expected


def test_arithmetic_negative_and_empty() -> None:
    assert arithmetic.score("-3", "-3") == 1.0
    assert arithmetic.score("-0", "0") == 0.0
    assert arithmetic.judge("   \n ", "3") == Judgement(0.0, None)


_NUMERIC_LOOKING = st.integers(-(10**6), 10**6).map(str) | st.from_regex(
    r"[+-]?0*\d{1,6}(\.0*)?", fullmatch=True
)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(-(10**6), 10**6), candidate=_NUMERIC_LOOKING)
def test_arithmetic_accepts_exactly_the_canonical_integer(n: int, candidate: str) -> None:
    assert arithmetic.score(candidate, str(n)) == (1.0 if candidate == str(n) else 0.0)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(),
    lead=st.text(alphabet=" \t\n", max_size=4),
    trail=st.text(alphabet=" \t\r", max_size=3),
    rest=st.text(max_size=20),
)
def test_arithmetic_ignores_whitespace_and_later_lines(
    n: int, lead: str, trail: str, rest: str
) -> None:
    assert arithmetic.score(lead + str(n) + trail + "\n" + rest, str(n)) == 1.0
