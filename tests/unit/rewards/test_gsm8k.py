"""The GSM8K verifier (rewards/gsm8k.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.rewards import Judgement, gsm8k

# ------------------------------------------------------------------------------ gsm8k

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("She sold 24 in May, so 48 + 24 = 72 in all.\n#### 72", GSM8K_SOLUTION, 1.0),
        ("She sold 24 in May, so 71 in all.", GSM8K_SOLUTION, 0.0),
        ("#### 1,234", "1234", 1.0),
        ("The total is $1,234.50.", "1234.5", 1.0),
        ("The answer is 42.0", "42", 1.0),
        ("The answer is 42.", "42", 1.0),
        ("It is -7 degrees outside.", "-7", 1.0),
        ("It is -7 degrees outside.", "7", 0.0),
        ("She read pages 10-12", "12", 1.0),  # a range, not -12
        ("#### 5\nthough the total is 6", "5", 1.0),  # #### beats the last number
        ("3, 4, and 5", "5", 1.0),
        ("It costs 18 dollars", "$18", 1.0),
        ("2/3 of 9 is 6", "6", 1.0),
        ("#### $18", "#### 18", 1.0),
    ],
)
def test_gsm8k_final_number(response: str, truth: str, expected: float) -> None:
    assert gsm8k.score(response, truth) == expected


def test_gsm8k_no_number_is_no_answer_and_bad_truth_raises() -> None:
    assert gsm8k.judge("no idea", "3") == Judgement(0.0, None)
    with pytest.raises(ValueError, match="holds no number"):
        gsm8k.judge("3", "three")


@settings(max_examples=50, deadline=None)
@given(n=st.integers(-(10**9), 10**9), dollar=st.booleans(), commas=st.booleans())
def test_gsm8k_formatted_integers(n: int, dollar: bool, commas: bool) -> None:
    text = f"{abs(n):,}" if commas else str(abs(n))
    text = ("-" if n < 0 else "") + ("$" if dollar else "") + text
    assert gsm8k.score(f"So the answer is\n#### {text}", str(n)) == 1.0
    assert gsm8k.score(f"So the answer is\n#### {text}", str(n + 1)) == 0.0
