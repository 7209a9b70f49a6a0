"""The remainder task's verifier (issue 31, rewards/remainder.py)."""

from __future__ import annotations

import pytest

from dapo_megatron.rewards.registry import get_verifier, score


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("38 29 20 11 2\n2", 1.0),
        ("1 2 3\n2", 1.0),  # only the answer line counts
        ("38 29 20 11 2\n2\n", 1.0),
        ("38 29 20 11 2\n3", 0.0),
        ("38 29 20 11 2", 0.0),  # no answer line: cut at the cap
        ("38 29 20 11 2\n", 0.0),
        ("2", 0.0),
        ("38 29\n02", 0.0),
    ],
)
def test_verifier_scores_the_answer_line_only(response: str, expected: float) -> None:
    assert score("remainder", response, "38 29 20 11 2\n2") == expected
    assert get_verifier("remainder").cheap
