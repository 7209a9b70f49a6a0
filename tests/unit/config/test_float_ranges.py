"""Every float key of the schema is finite and in its range at validation (issue: values that
validate and then crash mid-run): `.inf`, `-.inf`, `.nan` and a value just outside the
declared range are each refused by load_config, naming the key, before any worker starts."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.float_ranges import FLOAT_RANGES, float_keys
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.shared.float_range import FloatRange

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
KEYS = float_keys(DapoMegatronConfig)


def _outside(r: FloatRange) -> float | None:
    """A finite value just outside ``r`` (None for the whole real line)."""
    if math.isfinite(r.low):
        return r.low if r.low_open else r.low - max(1.0, abs(r.low))
    if math.isfinite(r.high):
        return r.high if r.high_open else r.high + max(1.0, abs(r.high))
    return None


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(TINY, list(overrides))
    return str(e.value)


def test_every_float_key_of_the_schema_has_a_range() -> None:
    assert len(KEYS) >= 40  # the walk found the schema's float keys (41 when written)
    assert sorted(set(KEYS) - set(FLOAT_RANGES)) == []
    assert sorted(set(FLOAT_RANGES) - set(KEYS)) == []  # no stale entry


@pytest.mark.parametrize("key", KEYS)
def test_non_finite_and_out_of_range_values_are_refused_naming_the_key(key: str) -> None:
    for text in (".inf", "-.inf", ".nan"):
        message = _error(f"{key}={text}")
        assert f"{key} = " in message and "must be a finite number" in message, message
        # Reported once, by the generic rule, not again by a per-key check.
        assert len(re.findall(rf"(?m)^(?:\s*- )?{re.escape(key)} = ", message)) == 1, message
    outside = _outside(FLOAT_RANGES[key])
    if outside is not None:
        message = _error(f"{key}={outside!r}")
        assert f"{key} = {outside!r}" in message and "must be in" in message, message


def test_the_crashes_found_are_refused() -> None:
    # Both passed validation and --dry-run before, then crashed mid-run with OverflowError.
    assert "rollout.abort_tail_oversample = inf" in _error("rollout.abort_tail_oversample=.inf")
    assert "run.collective_timeout_s = inf" in _error("run.collective_timeout_s=.inf")
    # A call timeout too small to start a worker (a restart that can never succeed).
    assert "run.call_timeout_s = 0.001" in _error("run.call_timeout_s=0.001")


def test_ranges_print_as_intervals() -> None:
    assert str(FloatRange(0.0, 1.0, high_open=True)) == "[0, 1)"
    assert str(FloatRange(0.0, math.inf, low_open=True)) == "(0, inf)"
    assert str(FloatRange(-math.inf, math.inf)) == "(-inf, inf)"
    assert FloatRange(0.0, 1.0, low_open=True).contains(1.0)
    assert not FloatRange(0.0, 1.0, low_open=True).contains(0.0)


def test_a_key_another_key_makes_inert_is_refused_naming_both() -> None:
    message = _error("rollout.abort_tail=true", "dapo.dynamic_sampling.enabled=false")
    assert "rollout.abort_tail = True" in message
    assert "dapo.dynamic_sampling.enabled=false" in message
