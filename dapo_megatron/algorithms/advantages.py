"""Group-relative advantage estimation (GRPO / DAPO).

Each prompt is sampled N times; a sample's advantage is its reward relative to the other
samples of the same prompt (its group), optionally normalised by the group's reward spread.
The same scalar advantage then applies to every response token of the sample (the loss
spreads it: ``algorithms.loss.expand_advantages``).

Shape suffixes: ``_GN`` is G groups x N samples per prompt (a group's samples contiguous in a
row), ``_B`` is one value per sample, ``_BT`` is B samples x T response tokens.
"""

from __future__ import annotations

import math

import torch

__all__ = ["group_advantages"]


def group_advantages(
    rewards_GN: torch.Tensor,
    *,
    norm_by_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantage of every sample relative to its group.

    With ``mean_g`` and ``std_g`` the mean and the UNBIASED sample standard deviation (Bessel's
    correction, divisor N - 1, as ``torch.std``'s default) of the sample's group:

    - default (``norm_by_std=True``): ``(r - mean_g) / (std_g + eps)`` (GRPO / DAPO);
    - ``norm_by_std=False``: ``r - mean_g`` (Dr. GRPO: no per-group rescaling);
    - ``leave_one_out=True``: the baseline of sample i is the mean of the OTHER N - 1 samples of
      its group, ``r_i - (sum_g - r_i) / (N - 1)``; with ``norm_by_std`` also True this is
      divided by ``std_g + eps``.

    A group whose rewards are all equal carries no learning signal and gets advantage exactly 0
    (no division by a float-noise std). A group of a single sample (N == 1) has no baseline and
    also gets 0, with or without leave-one-out.

    Args:
        rewards_GN: rewards, shape ``[G, N]``, G >= 0, N >= 1; integer/bool are promoted to the
            default float dtype. Must be finite.
        norm_by_std: divide by the group's std (plus ``eps``).
        leave_one_out: use the mean of the other samples as the baseline (RLOO).
        eps: added to the std before dividing, >= 0.

    Returns:
        Float tensor ``[G, N]``; with the mean baseline each row sums to ~0.

    Raises:
        ValueError: on a non-2-D tensor, N == 0, non-finite rewards, or a bad ``eps``.
    """
    if rewards_GN.ndim != 2:
        raise ValueError(f"rewards_GN must be 2-D [G, N], got shape {tuple(rewards_GN.shape)}")
    group_size = rewards_GN.shape[1]
    if group_size < 1:
        raise ValueError(f"rewards_GN must have N >= 1 samples per group, got N={group_size}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps):
        raise ValueError(f"eps must be a finite real number, got {eps!r}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    dtype = rewards_GN.dtype if rewards_GN.is_floating_point() else torch.get_default_dtype()
    rewards = rewards_GN.to(dtype)
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards_GN must be finite (found NaN or inf)")
    if group_size == 1 or rewards.shape[0] == 0:
        # No baseline exists for a lone sample; an empty batch would make torch.std warn.
        return torch.zeros_like(rewards)

    mean_G1 = rewards.mean(dim=1, keepdim=True)
    centered = rewards - mean_G1
    # Leave-one-out: r_i - (S - r_i)/(N-1) = (N r_i - S)/(N-1) = N/(N-1) * (r_i - mean); the
    # centred form keeps shift invariance better than subtracting two large sums.
    loo_scale = group_size / (group_size - 1) if leave_one_out else 1.0
    advantages = centered * loo_scale
    if norm_by_std:
        std_G1 = rewards.std(dim=1, keepdim=True, correction=1)
        advantages = advantages / (std_G1 + eps)

    # Equal rewards can leave a ~1e-9 std from rounding in the mean; divided by a small eps that
    # would be an O(1e-3) spurious advantage, so constant groups are forced to exactly 0.
    constant_G1 = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    return torch.where(constant_G1, torch.zeros_like(advantages), advantages)
