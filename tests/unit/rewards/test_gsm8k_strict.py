"""verl's and SkyRL's strict GSM8K rewards (rewards/gsm8k_strict.py), by hand from their
extract_solution/compute_score: verl takes the last `#### N` of the last 300 characters,
SkyRL the first `#### N` anywhere; both strip commas and `$` and compare as text."""

from __future__ import annotations

import pytest

from dapo_megatron.rewards.gsm8k_strict import judge_skyrl, judge_verl
from dapo_megatron.rewards.registry import get_verifier, score

CASES = [
    # (response, ground truth, verl score, skyrl score)
    ("so #### 72", "72", 1.0, 1.0),
    ("#### 1,200", "1200", 1.0, 1.0),  # commas dropped
    ("#### $5", "5", 0.0, 0.0),  # "$" is not in the number's class: no match at all
    ("#### 18.0", "18", 0.0, 0.0),  # text, not numbers
    ("the answer is 72", "72", 0.0, 0.0),  # no `#### N`: 0, no fallback to the last number
    ("#### 3 then #### 72", "72", 1.0, 0.0),  # verl the last, SkyRL the first
    ("#### 72" + " pad" * 100, "72", 0.0, 1.0),  # beyond verl's 300 trailing characters
    ("####72", "72", 0.0, 0.0),  # the space after #### is part of the pattern
    ("#### -3", "-3", 1.0, 1.0),
]


@pytest.mark.parametrize(("response", "truth", "verl", "skyrl"), CASES)
def test_strict_gsm8k_rewards(response, truth, verl, skyrl):
    assert judge_verl(response, truth).score == verl
    assert judge_skyrl(response, truth).score == skyrl
    # Through the registry, as the reward pool calls them (after clipping).
    assert score("gsm8k_verl", get_verifier("gsm8k_verl").clip(response), truth) == verl
    assert score("gsm8k_skyrl", get_verifier("gsm8k_skyrl").clip(response), truth) == skyrl


def test_our_gsm8k_verifier_is_more_lenient():
    """The reason the peers' rewards are verifiers of their own: ours falls back to the
    last number and compares decimals, so it scores 1 where theirs score 0."""
    assert score("gsm8k", "the answer is 72", "72") == 1.0
    assert score("gsm8k", "#### 18.0", "18") == 1.0
