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

__all__ = ["STD_OVER", "group_advantages"]

STD_OVER = ("group", "others")
"""Whose reward spread normalises a sample: its whole group's, or its N - 1 others'."""


def group_advantages(
    rewards_GN: torch.Tensor,
    *,
    norm_by_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
    std_over: str = "group",
) -> torch.Tensor:
    """Advantage of every sample relative to its group.

    With ``mean_g`` and ``std_g`` the mean and the UNBIASED sample standard deviation (Bessel's
    correction, divisor N - 1, as ``torch.std``'s default) of the sample's group:

    - default (``norm_by_std=True``): ``(r - mean_g) / (std_g + eps)`` (GRPO / DAPO);
    - ``norm_by_std=False``: ``r - mean_g`` (Dr. GRPO: no per-group rescaling);
    - ``leave_one_out=True``: the baseline of sample i is the mean of the OTHER N - 1 samples of
      its group, ``r_i - (sum_g - r_i) / (N - 1)``; with ``norm_by_std`` also True this is
      divided by ``std_g + eps``;
    - ``std_over="others"`` (with ``norm_by_std``): sample i is divided by ``std_-i + eps``
      instead, the unbiased std of the OTHER N - 1 samples of its group (divisor N - 2), and
      left unscaled where those others all agree (``std_-i`` is 0, or undefined for N = 2).
      With ``leave_one_out`` this is NeMo RL's GRPO estimator (nemo_rl/algorithms/
      advantage_estimator.py GRPOAdvantageEstimator.compute_advantage over
      algorithms/utils.py calculate_baseline_and_std_per_prompt, whose leave-one-out std is
      taken over the same N - 1 samples as the baseline).

    A group whose rewards are all equal carries no learning signal and gets advantage exactly 0
    (no division by a float-noise std). A group of a single sample (N == 1) has no baseline and
    also gets 0, with or without leave-one-out.

    Args:
        rewards_GN: rewards, shape ``[G, N]``, G >= 0, N >= 1; integer/bool are promoted to the
            default float dtype. Must be finite.
        norm_by_std: divide by the group's std (plus ``eps``).
        leave_one_out: use the mean of the other samples as the baseline (RLOO).
        eps: added to the std before dividing, >= 0.
        std_over: ``"group"`` (the whole group's std) or ``"others"`` (each sample's N - 1
            others'); read only with ``norm_by_std``.

    Returns:
        Float tensor ``[G, N]``; with the mean baseline each row sums to ~0.

    Raises:
        ValueError: on a non-2-D tensor, N == 0, non-finite rewards, a bad ``eps`` or
            ``std_over``.
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
    if std_over not in STD_OVER:
        raise ValueError(f"std_over must be one of {STD_OVER}, got {std_over!r}")
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
    if norm_by_std and std_over == "others":
        advantages = _divide_by_others_std(rewards, advantages, eps)
    elif norm_by_std:
        std_G1 = rewards.std(dim=1, keepdim=True, correction=1)
        advantages = advantages / (std_G1 + eps)

    # Equal rewards can leave a ~1e-9 std from rounding in the mean; divided by a small eps that
    # would be an O(1e-3) spurious advantage, so constant groups are forced to exactly 0.
    constant_G1 = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    return torch.where(constant_G1, torch.zeros_like(advantages), advantages)


def _divide_by_others_std(
    rewards_GN: torch.Tensor, advantages_GN: torch.Tensor, eps: float
) -> torch.Tensor:
    """``advantages`` divided, sample by sample, by the unbiased std of the sample's N - 1
    others plus ``eps``; unchanged where the others all agree (NeMo RL skips a zero std:
    advantage_estimator.py `non_zero_std_mask = std > 0`)."""
    group_size = rewards_GN.shape[1]
    if group_size < 3:
        # One other sample has no spread (NeMo RL's (N-1)/(N-2) factor turns it into 0).
        return advantages_GN
    others = ~torch.eye(group_size, dtype=torch.bool, device=rewards_GN.device)
    # [G, N, N - 1]: row i holds the rewards of the group's samples other than i.
    others_GNM = (
        rewards_GN.unsqueeze(1)
        .expand(-1, group_size, -1)[:, others]
        .reshape(rewards_GN.shape[0], group_size, group_size - 1)
    )
    std_GN = others_GNM.std(dim=2, correction=1)
    # Exact agreement, not a float-noise std: equal others give a ~1e-17 std from rounding.
    agree_GN = others_GNM.amax(dim=2) == others_GNM.amin(dim=2)
    return torch.where(agree_GN, advantages_GN, advantages_GN / (std_GN + eps))
