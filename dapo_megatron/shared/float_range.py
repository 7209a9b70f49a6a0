"""``FloatRange``: the interval a float setting may take (torch-free, imports nothing).

Declared on the ground floor because two layers read the same declarations: the loss's
limits (algorithms/loss_spec.py ``LOSS_FLOAT_RANGES``) are written once as ranges, and the
config's generic float rule (config/float_ranges.py ``FLOAT_RANGES``) takes those entries
as they are, so the two can never disagree on a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FloatRange:
    """An interval of the real line; open at an end whose ``*_open`` is true."""

    low: float
    """Lower bound (-inf: none)."""
    high: float
    """Upper bound (inf: none; the value itself must still be finite)."""
    low_open: bool = False
    """The lower bound itself is excluded."""
    high_open: bool = False
    """The upper bound itself is excluded."""

    def contains(self, value: float) -> bool:
        """``value`` lies in the interval (NaN never does: it fails every comparison)."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def admits(self, value: object) -> bool:
        """``value`` is a finite real number (an int or a float, never a bool: True would
        silently mean 1) inside the interval."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return math.isfinite(value) and self.contains(value)

    def __str__(self) -> str:
        left = "(" if self.low_open or self.low == -math.inf else "["
        right = ")" if self.high_open or self.high == math.inf else "]"
        return f"{left}{_bound(self.low)}, {_bound(self.high)}{right}"


def _bound(x: float) -> str:
    return {math.inf: "inf", -math.inf: "-inf"}.get(x, f"{x:g}")


def positive(high: float = math.inf) -> FloatRange:
    """``(0, high]`` (``(0, inf)`` by default)."""
    return FloatRange(0.0, high, low_open=True)


NON_NEGATIVE = FloatRange(0.0, math.inf)
"""``[0, inf)``."""
FRACTION = FloatRange(0.0, 1.0)
"""``[0, 1]``."""
ANY = FloatRange(-math.inf, math.inf)
"""The whole real line (the value must still be finite)."""
