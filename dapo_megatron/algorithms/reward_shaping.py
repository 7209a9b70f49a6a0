"""Reward shaping for DAPO: score rescaling, the soft overlong punishment and overlong filtering.

The verifier produces one raw score per sample; these functions turn it into the scalar reward
the advantage estimator sees (``scale_rewards``, then ``soft_overlong_penalty`` added; both
at once, per round, by ``shape_rewards`` under the run's ``RewardShaping``), and build the loss
mask that drops truncated samples (``overlong_filter_mask``), following DAPO (arXiv 2503.14476)
sections 3.4 and Eq. 13.

The loose-argument functions check their settings at each call; ``shape_rewards`` does not: its
``RewardShaping`` was validated once, when the run plan built it (algorithms/shaping_limits.py).

Shape suffixes: ``_B`` is one value per sample, ``_BT`` is B samples x T response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo_megatron.algorithms.shaping_limits import (
    OverlongPenalty,
    RewardShaping,
    ScoreScaling,
)
from dapo_megatron.shared.sampling import FINISH_REASON_LENGTH, FINISH_REASON_STOP

__all__ = [
    "overlong_filter_mask",
    "scale_rewards",
    "shape_rewards",
    "soft_overlong_penalty",
    "truncated_from_finish_reasons",
]


def _float_dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.is_floating_point() else torch.get_default_dtype()


def scale_rewards(
    rewards_B: torch.Tensor,
    *,
    source_min: float,
    source_max: float,
    target_min: float,
    target_max: float,
) -> torch.Tensor:
    """Clamp rewards to ``[source_min, source_max]`` and map them linearly onto the target range.

    ``source_min`` maps to ``target_min`` and ``source_max`` to ``target_max``; e.g. source
    ``[0, 1]`` onto target ``[-1, 1]`` sends 0.25 to -0.5. ``target_max < target_min`` is allowed
    (it flips the order).

    Args:
        rewards_B: raw scores, shape ``[B]`` (any shape works: the map is elementwise).
            Integer or bool tensors are promoted to the default float dtype.
        source_min: lower end of the raw score range; smaller scores are clamped up to it.
        source_max: upper end of the raw score range; must be > ``source_min``.
        target_min: value that ``source_min`` maps to.
        target_max: value that ``source_max`` maps to.

    Returns:
        Float tensor with the shape of ``rewards_B``, values within the target range.

    Raises:
        ValueError: on non-finite bounds, ``source_max <= source_min``, or NaN rewards.
    """
    # Building the value checks the bounds (shaping_limits.py's limits, written once).
    return _scaled(rewards_B, ScoreScaling(source_min, source_max, target_min, target_max))


def _scaled(rewards_B: torch.Tensor, scaling: ScoreScaling) -> torch.Tensor:
    """``scale_rewards`` under an already validated ``ScoreScaling``."""
    rewards = rewards_B.to(_float_dtype(rewards_B))
    # A NaN would survive the clamp and silently poison every advantage of its group; it is
    # the data, not the settings, so it is checked every call.
    if torch.isnan(rewards).any():
        raise ValueError("rewards_B must not contain NaN")
    lo, hi = scaling.source_min, scaling.source_max
    clamped = rewards.clamp(min=lo, max=hi)
    fraction = (clamped - lo) / (hi - lo)
    return scaling.target_min + fraction * (scaling.target_max - scaling.target_min)


def _check_lengths(response_lengths_B: torch.Tensor) -> None:
    if response_lengths_B.ndim != 1:
        raise ValueError(
            f"response_lengths_B must be 1-D [B], got shape {tuple(response_lengths_B.shape)}"
        )
    if response_lengths_B.dtype == torch.bool:
        raise ValueError("response_lengths_B must hold numbers, got a bool tensor")
    if response_lengths_B.numel() > 0:
        lowest = response_lengths_B.min().item()
        if not lowest >= 0:  # also catches NaN
            raise ValueError(f"response_lengths_B must be >= 0, got a length of {lowest!r}")


def soft_overlong_penalty(
    response_lengths_B: torch.Tensor,
    *,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float,
) -> torch.Tensor:
    """Length penalty of DAPO Eq. 13 ("soft overlong punishment"), one value per sample.

    With ``Lmax = max_response_length`` and ``Lcache = buffer_length``::

        penalty = 0                                               if L <= Lmax - Lcache
                = ((Lmax - Lcache) - L) / Lcache * penalty_factor if Lmax - Lcache < L <= Lmax
                = -penalty_factor                                 if L > Lmax

    The result always lies within ``[-penalty_factor, 0]``.

    ``max_response_length`` must be the RESPONSE-token cap actually given to the generation
    engine (its ``max_tokens``), never prompt + response: measured against a larger cap, a
    truncated sample would sit inside the ramp and be under-penalised.

    Args:
        response_lengths_B: number of generated response tokens per sample, shape ``[B]``,
            integer or float, all >= 0.
        max_response_length: ``Lmax``, the response generation cap (int > ``buffer_length``).
        buffer_length: ``Lcache``, width of the linear ramp before the cap (int > 0).
        penalty_factor: magnitude of the penalty at and beyond the cap (>= 0).

    Returns:
        Float tensor ``[B]`` (the lengths' dtype if floating, else the default float dtype).

    Raises:
        ValueError: on a bad cap / buffer / factor, a non-1-D tensor, or a negative length.
    """
    # The settings are checked (building the value) before the lengths, as the docs list them.
    overlong = OverlongPenalty(max_response_length, buffer_length, penalty_factor)
    _check_lengths(response_lengths_B)
    return _penalty(response_lengths_B, overlong)


def _penalty(response_lengths_B: torch.Tensor, overlong: OverlongPenalty) -> torch.Tensor:
    """``soft_overlong_penalty`` under an already validated ``OverlongPenalty``."""
    lengths = response_lengths_B.to(_float_dtype(response_lengths_B))
    factor, buffer = overlong.penalty_factor, overlong.buffer_length
    ramp_start = overlong.max_response_length - buffer
    # One linear expression clamped at both ends gives all three pieces of Eq. 13, and the clamp
    # is what keeps L > Lmax (an engine that overshoots its cap) at exactly -penalty_factor.
    linear = (ramp_start - lengths) / buffer * factor
    return linear.clamp(min=-factor, max=0.0)


def shape_rewards(
    scores_B: torch.Tensor, lengths_B: torch.Tensor, shaping: RewardShaping
) -> tuple[torch.Tensor, torch.Tensor]:
    """(shaped rewards, overlong penalties), float64 ``[B]``, of raw scores: the scaled score
    plus the soft overlong penalty, each where ``shaping`` switches it on.

    Called every round, it trusts ``shaping`` (validated once per run, when the run plan built
    it: config/run_plan.py ``build_reward_shaping``) and checks only the round's data (NaN
    scores, the lengths' shape and sign).

    Args:
        scores_B: raw verifier scores, shape ``[B]``.
        lengths_B: response tokens per sample, shape ``[B]``.
        shaping: the run's ``RunPlan.reward_shaping``.
    """
    rewards = scores_B.double()
    if shaping.scaling is not None:
        rewards = _scaled(rewards, shaping.scaling)
    penalty = torch.zeros_like(rewards)
    if shaping.overlong is not None:
        _check_lengths(lengths_B)
        penalty = _penalty(lengths_B, shaping.overlong).double()
    return rewards + penalty, penalty


def overlong_filter_mask(mask_BT: torch.Tensor, truncated_B: torch.Tensor) -> torch.Tensor:
    """Zero the loss-mask rows of samples that were cut off by the length cap (DAPO overlong filter).

    A truncated sample (finish reason "length") has no final answer, so its reward says little
    about the tokens it produced; filtering removes it from the loss instead of punishing it.

    Args:
        mask_BT: loss mask, shape ``[B, T]``, any dtype (bool, int or float).
        truncated_B: bool tensor ``[B]``, True where the sample hit the length cap.

    Returns:
        A new tensor with the dtype and shape of ``mask_BT`` whose truncated rows are 0 (False);
        ``mask_BT`` itself is left unchanged.

    Raises:
        ValueError: on wrong ranks, mismatched B, or a non-bool ``truncated_B``.
    """
    if mask_BT.ndim != 2:
        raise ValueError(f"mask_BT must be 2-D [B, T], got shape {tuple(mask_BT.shape)}")
    if truncated_B.ndim != 1 or truncated_B.shape[0] != mask_BT.shape[0]:
        raise ValueError(
            f"truncated_B must have shape [B]=({mask_BT.shape[0]},) to match mask_BT, got "
            f"{tuple(truncated_B.shape)}"
        )
    if truncated_B.dtype != torch.bool:
        raise ValueError(f"truncated_B must be a bool tensor, got dtype {truncated_B.dtype}")
    # masked_fill (not masked_fill_) returns a copy, so the caller's mask is never aliased.
    return mask_BT.masked_fill(truncated_B.to(mask_BT.device)[:, None], 0)


def truncated_from_finish_reasons(finish_reasons: Sequence[str]) -> torch.Tensor:
    """Turn engine finish reasons into the ``truncated_B`` flags of ``overlong_filter_mask``.

    Args:
        finish_reasons: one reason per sample, each ``"stop"`` (ended on a stop token) or
            ``"length"`` (hit the response-length cap).

    Returns:
        Bool tensor ``[B]`` (on CPU), True where the reason is ``"length"``.

    Raises:
        ValueError: if ``finish_reasons`` is a bare string or holds any other value
            (e.g. ``"abort"``, or ``None`` from an unfinished request).
    """
    if isinstance(finish_reasons, str):
        raise ValueError(
            f"finish_reasons must be a sequence of strings, got the single string "
            f"{finish_reasons!r}"
        )
    flags: list[bool] = []
    for index, reason in enumerate(finish_reasons):
        if reason not in (FINISH_REASON_STOP, FINISH_REASON_LENGTH):
            raise ValueError(
                f"finish_reasons[{index}] must be {FINISH_REASON_STOP!r} or "
                f"{FINISH_REASON_LENGTH!r}, got {reason!r}"
            )
        flags.append(reason == FINISH_REASON_LENGTH)
    return torch.tensor(flags, dtype=torch.bool)
