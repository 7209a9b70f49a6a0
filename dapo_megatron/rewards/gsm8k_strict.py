"""The strict GSM8K rewards of verl and SkyRL: 1 when the response's `#### N` answer equals
the ground truth as a string, else 0; no `#### N` at all scores 0 (no fallback to the last
number, as the ``gsm8k`` verifier has). The two peers differ in which `#### N` they read:

- ``gsm8k_verl``: the LAST one within the last 300 characters (verl
  verl/utils/reward_score/gsm8k.py extract_solution, method "strict", _SOLUTION_CLIP_CHARS);
- ``gsm8k_skyrl``: the FIRST one anywhere in the response (SkyRL
  skyrl-gym/skyrl_gym/envs/gsm8k/utils.py extract_solution, method "strict").

Both drop commas and dollar signs from the answer and compare it with the ground truth as
text ("18.0" is not "18"), which holds GSM8K's final number without separators, as our
``gsm8k`` data format stores it (data/hub_datasets.py) and the peers' preprocessing does.
"""

from __future__ import annotations

import re

from dapo_megatron.rewards.base import Judgement, Verifier

__all__ = ["SKYRL_VERIFIER", "VERL_VERIFIER", "judge_skyrl", "judge_verl"]

_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
VERL_TAIL_CHARS = 300
"""verl reads only this many trailing characters of a response."""
SKYRL_MAX_CHARS = 1 << 22
"""SkyRL reads the whole response; this bound only guards the pool's transfer."""


def _clean(answer: str) -> str:
    return answer.replace(",", "").replace("$", "")


def _verdict(answer: str | None, ground_truth: str) -> Judgement:
    if answer is None:
        return Judgement(0.0, None)
    return Judgement(1.0 if answer == ground_truth.strip() else 0.0, answer)


def judge_verl(response: str, ground_truth: str) -> Judgement:
    """The last `#### N` of the response's last 300 characters, against the ground truth."""
    found = _ANSWER.findall(response[-VERL_TAIL_CHARS:])
    return _verdict(_clean(found[-1]) if found else None, ground_truth)


def judge_skyrl(response: str, ground_truth: str) -> Judgement:
    """The first `#### N` of the response, against the ground truth."""
    found = _ANSWER.search(response)
    return _verdict(_clean(found.group(1)) if found else None, ground_truth)


VERL_VERIFIER = Verifier(
    name="gsm8k_verl",
    judge=judge_verl,
    cheap=True,
    keep="tail",
    max_chars=VERL_TAIL_CHARS,
    warmup=("#### 1", "1"),
)
SKYRL_VERIFIER = Verifier(
    name="gsm8k_skyrl",
    judge=judge_skyrl,
    cheap=True,
    keep="head",
    max_chars=SKYRL_MAX_CHARS,
    warmup=("#### 1", "1"),
)
