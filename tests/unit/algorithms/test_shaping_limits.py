"""The run's reward shaping as one value validated once per run (algorithms/shaping_limits.py
``RewardShaping``, built by config/run_plan.py ``build_reward_shaping``)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from dapo_megatron.algorithms.shaping_limits import OverlongPenalty, RewardShaping, ScoreScaling
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.run_plan import build_reward_shaping

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: ScoreScaling(1.0, 1.0, -1.0, 1.0), r"source_max=1.0 must be > source_min"),
        (lambda: ScoreScaling(0.0, math.inf, -1.0, 1.0), r"source_max=inf must be finite"),
        (lambda: OverlongPenalty(16, 16, 1.0), r"buffer_length=16 must satisfy 0 < buffer"),
        (lambda: OverlongPenalty(16, 4, -1.0), r"penalty_factor=-1.0 must be >= 0"),
        (lambda: OverlongPenalty(16, True, 1.0), r"buffer_length=True must be an int"),
    ],
)
def test_a_bad_setting_cannot_be_built(build: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()  # type: ignore[operator]


def test_the_plan_carries_the_configured_shaping() -> None:
    loaded = load_config(
        TINY,
        [
            "dapo.reward_scaling.enabled=true",
            "dapo.reward_scaling.target_min=-1.0",
            "dapo.overlong_buffer.enabled=true",
            "dapo.overlong_buffer.length=4",
        ],
    )
    shaping = loaded.plan.reward_shaping
    config = loaded.config
    assert shaping == build_reward_shaping(config)
    assert shaping.scaling is not None and shaping.scaling.target_min == -1.0
    assert shaping.overlong == OverlongPenalty(
        config.generation.max_response_length, 4, config.dapo.overlong_buffer.penalty_factor
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        shaping.scaling = None  # type: ignore[misc]


def test_switched_off_parts_are_none() -> None:
    loaded = load_config(
        TINY, ["dapo.reward_scaling.enabled=false", "dapo.overlong_buffer.enabled=false"]
    )
    assert loaded.plan.reward_shaping == RewardShaping(scaling=None, overlong=None)
