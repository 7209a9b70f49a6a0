"""The limits of the reward shaping's settings, written once (torch-free).

``algorithms/reward_shaping.py`` raises on the first problem of its arguments at each call;
config validation (config/validate.py) reports each one under its ``dapo.*`` key, before
any worker starts. Torch-free like loss_spec.py: config validation imports it.
"""

from __future__ import annotations

import math

from dapo_megatron.algorithms.loss_spec import Problem


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
