"""The policy loss's hyper-parameters as one frozen, validated value (torch-free).

``LossSpec`` is built once per run from ``dapo.loss`` (config/run_plan.py) and travels
unchanged from the policy step through the kernel dispatch (kernels/pg_loss.py) into
``algorithms.loss.policy_loss``. Its fields have no defaults: every default lives in
configs/dapo_base.yaml. The value sets (Literal types) are defined here once; the config
schema imports them, so a YAML value and a function argument can never disagree.

Torch-free on purpose: config validation imports this module and must stay fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
KLEstimator = Literal["k1", "k2", "k3"]
RolloutCorrectionMode = Literal["none", "tis", "mis"]
RolloutCorrectionLevel = Literal["token", "sequence"]

LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
ROLLOUT_CORRECTION_MODES: tuple[str, ...] = get_args(RolloutCorrectionMode)
ROLLOUT_CORRECTION_LEVELS: tuple[str, ...] = get_args(RolloutCorrectionLevel)


def validate_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError (naming ``name``) unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {choices}")


def validate_agg_mode(loss_agg_mode: str) -> None:
    """Raise ValueError unless ``loss_agg_mode`` is one of ``LOSS_AGG_MODES``."""
    validate_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)


def validate_clip_ratios(
    clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float | None = None
) -> None:
    """Raise ValueError unless ``0 <= low < 1``, ``high >= 0`` and (if set) ``c > 1``."""
    # `not (constraint)` also rejects NaN, which fails every comparison.
    if not (0 <= clip_ratio_low < 1):
        raise ValueError(f"clip_ratio_low={clip_ratio_low!r} must satisfy 0 <= clip_ratio_low < 1")
    if not (clip_ratio_high >= 0 and math.isfinite(clip_ratio_high)):
        raise ValueError(f"clip_ratio_high={clip_ratio_high!r} must be finite and >= 0")
    if clip_ratio_c is not None and not (clip_ratio_c > 1 and math.isfinite(clip_ratio_c)):
        raise ValueError(f"clip_ratio_c={clip_ratio_c!r} must be finite and > 1 (or None)")


def validate_rollout_correction_args(
    mode: str, level: str, tis_cap: float, mis_low: float, mis_high: float
) -> None:
    """Raise ValueError (naming the argument, its value and the constraint) on a bad setting.

    The caps are validated whatever the mode, so a misconfiguration surfaces at start-up and
    not only once someone switches the mode on.
    """
    validate_choice("mode", mode, ROLLOUT_CORRECTION_MODES)
    validate_choice("level", level, ROLLOUT_CORRECTION_LEVELS)
    # Written as `not (constraint)` so that NaN, which fails every comparison, is rejected too.
    if not (tis_cap > 0 and math.isfinite(tis_cap)):
        raise ValueError(f"tis_cap={tis_cap!r} must be finite and > 0")
    if not (0 <= mis_low < 1):
        raise ValueError(f"mis_low={mis_low!r} must satisfy 0 <= mis_low < 1")
    if not (mis_high > 1 and math.isfinite(mis_high)):
        raise ValueError(f"mis_high={mis_high!r} must be finite and > 1")


def validate_coef(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a finite, non-negative loss coefficient."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (is_number and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={value!r} must be a finite number >= 0")


@dataclass(frozen=True)
class LossSpec:
    """Hyper-parameters of the DAPO policy loss; validated on construction."""

    clip_ratio_low: float
    """eps_low: the ratio is clipped below at 1 - clip_ratio_low."""
    clip_ratio_high: float
    """eps_high: the ratio is clipped above at 1 + clip_ratio_high (clip-higher)."""
    clip_ratio_c: float | None
    """Dual-clip bound c > 1 for negative advantages; None disables dual clip."""
    loss_agg_mode: LossAggMode
    """How per-token losses are aggregated (see ``algorithms.loss.aggregate_loss``)."""
    loss_scale_length: int
    """Constant length of seq-mean-token-sum-norm (resolved: never None here)."""
    rollout_correction: RolloutCorrectionMode
    """Rollout/train mismatch correction: none, truncated (tis) or masked (mis) weights."""
    rollout_correction_level: RolloutCorrectionLevel
    """Whether the correction weight is per token or per sequence."""
    tis_cap: float
    """Upper truncation of the TIS weight."""
    mis_low: float
    """MIS lower bound: weights below it are masked out."""
    mis_high: float
    """MIS upper bound: weights above it are masked out."""
    kl_coef: float
    """Coefficient of the KL penalty against the reference policy (0 = off)."""
    kl_estimator: KLEstimator
    """KL estimator (k1, k2 or k3)."""
    entropy_coef: float
    """Entropy bonus coefficient (0 = off)."""

    def __post_init__(self) -> None:
        validate_clip_ratios(self.clip_ratio_low, self.clip_ratio_high, self.clip_ratio_c)
        validate_agg_mode(self.loss_agg_mode)
        length = self.loss_scale_length
        # bool is an int subclass: True would silently mean a length of 1.
        if not (isinstance(length, int) and not isinstance(length, bool) and length >= 1):
            raise ValueError(f"loss_scale_length={length!r} must be an int >= 1")
        # The field names first: validate_rollout_correction_args says "mode"/"level".
        validate_choice("rollout_correction", self.rollout_correction, ROLLOUT_CORRECTION_MODES)
        validate_choice(
            "rollout_correction_level", self.rollout_correction_level, ROLLOUT_CORRECTION_LEVELS
        )
        validate_rollout_correction_args(
            self.rollout_correction,
            self.rollout_correction_level,
            self.tis_cap,
            self.mis_low,
            self.mis_high,
        )
        validate_coef("kl_coef", self.kl_coef)
        validate_coef("entropy_coef", self.entropy_coef)
        validate_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
