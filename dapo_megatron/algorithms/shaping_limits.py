"""The limits of the reward shaping's settings, written once (torch-free).

``RewardShaping`` (below) raises on the first problem when the run plan builds it, once per
run; config validation (config/validate.py) reports each one under its ``dapo.*`` key,
before any worker starts; the loose-argument functions of algorithms/reward_shaping.py
check their arguments at each call. Torch-free like loss_spec.py: config validation imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dapo_megatron.algorithms.loss_spec import Problem, raise_first


def _real_problems(name: str, value: float) -> list[Problem]:
    # bool is an int subclass: True as a bound is always a config mistake.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [(name, value, "must be a real number")]
    return [] if math.isfinite(value) else [(name, value, "must be finite")]


def _int_problems(name: str, value: int) -> list[Problem]:
    # bool is an int subclass; True as a length is always a config mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        return [(name, value, "must be an int")]
    return []


def scaling_problems(
    *, source_min: float, source_max: float, target_min: float, target_max: float
) -> list[Problem]:
    """Finite bounds, and ``source_max > source_min`` (the target may be flipped)."""
    problems = [
        *_real_problems("source_min", source_min),
        *_real_problems("source_max", source_max),
        *_real_problems("target_min", target_min),
        *_real_problems("target_max", target_max),
    ]
    if not problems and not source_max > source_min:
        problems.append(("source_max", source_max, f"must be > source_min = {source_min!r}"))
    return problems


def overlong_problems(
    *, max_response_length: int, buffer_length: int, penalty_factor: float
) -> list[Problem]:
    """``0 < buffer_length < max_response_length`` (the buffer is the last part of the
    response cap) and ``penalty_factor >= 0``."""
    problems = [
        *_int_problems("max_response_length", max_response_length),
        *_int_problems("buffer_length", buffer_length),
        *_real_problems("penalty_factor", penalty_factor),
    ]
    if problems:
        return problems
    if not 0 < buffer_length < max_response_length:
        problems.append(
            (
                "buffer_length",
                buffer_length,
                f"must satisfy 0 < buffer_length < max_response_length = {max_response_length}"
                " (the buffer is the last part of the response cap)",
            )
        )
    if penalty_factor < 0:
        problems.append(("penalty_factor", penalty_factor, "must be >= 0"))
    return problems


@dataclass(frozen=True)
class ScoreScaling:
    """The clamp-and-map of raw scores (``dapo.reward_scaling``), validated on construction."""

    source_min: float
    """Lower end of the raw score range; smaller scores are clamped up to it."""
    source_max: float
    """Upper end of the raw score range (> source_min)."""
    target_min: float
    """Value that source_min maps to."""
    target_max: float
    """Value that source_max maps to (below target_min flips the order)."""

    def __post_init__(self) -> None:
        raise_first(scaling_problems(**vars(self)))


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's soft overlong punishment (``dapo.overlong_buffer``), validated on construction."""

    max_response_length: int
    """The response-token cap given to the engine (generation.max_response_length)."""
    buffer_length: int
    """Width of the linear ramp before the cap (0 < buffer_length < max_response_length)."""
    penalty_factor: float
    """Magnitude of the penalty at and beyond the cap (>= 0)."""

    def __post_init__(self) -> None:
        raise_first(overlong_problems(**vars(self)))


@dataclass(frozen=True)
class RewardShaping:
    """The run's reward shaping: built and validated once per run (config/run_plan.py
    ``RunPlan.reward_shaping``), then trusted by the per-round shaping
    (algorithms/reward_shaping.py ``shape_rewards``), which validates nothing again."""

    scaling: ScoreScaling | None
    """The score rescaling; None: scores are used as they are."""
    overlong: OverlongPenalty | None
    """The soft overlong penalty; None: no length penalty."""
