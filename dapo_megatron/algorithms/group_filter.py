"""The two decisions of DAPO dynamic sampling, as pure functions.

``groups_with_variance``: which prompt groups carry a learning signal (their samples' raw
verifier metric is not constant; a constant group has zero advantage everywhere, DAPO,
arXiv 2503.14476, section 3.2). ``auto_batch_multiplier``: how many prompts a step generates
for an observed keep rate (``batch_multiplier: auto``). ``DynamicSampler``
(algorithms/dynamic_sampling.py) keeps the books around them.

Shape suffixes: ``_GN`` is G groups x N samples per group.
"""

from __future__ import annotations

import math

import torch

__all__ = ["auto_batch_multiplier", "groups_with_variance"]


def groups_with_variance(metric_GN: torch.Tensor) -> torch.Tensor:
    """Which groups have a metric that varies across their samples.

    Pass the RAW verifier metric (accuracy / score), not the shaped reward: length penalties
    can make the rewards of equally-correct samples differ, yet such a group still has no
    correctness signal to learn from.

    Exact comparison (``max != min``) is used on purpose: equal raw scores are bit-identical,
    whereas a std-based test would have to pick a noise threshold.

    Args:
        metric_GN: per-sample metric, shape ``[G, N]`` with N >= 1; bool, integer or float,
            and finite.

    Returns:
        Bool tensor ``[G]``, True where the group's metric is not constant (always False for
        N == 1).

    Raises:
        ValueError: on a non-2-D tensor, N == 0, or a non-finite metric.
    """
    if metric_GN.ndim != 2:
        raise ValueError(f"metric_GN must be 2-D [G, N], got shape {tuple(metric_GN.shape)}")
    if metric_GN.shape[1] < 1:
        raise ValueError(
            f"metric_GN must have N >= 1 samples per group, got N={metric_GN.shape[1]}"
        )
    metric = metric_GN.to(torch.int8) if metric_GN.dtype == torch.bool else metric_GN
    # NaN != NaN would mark a broken group as "varied" and feed it to training.
    if metric.is_floating_point() and not torch.isfinite(metric).all():
        raise ValueError("metric_GN must be finite (found NaN or inf)")
    return metric.amax(dim=1) != metric.amin(dim=1)


def auto_batch_multiplier(
    keep_rate: float, *, max_multiplier: float, headroom: float = 1.2
) -> float:
    """Batch multiplier for the next step from an observed keep rate (``batch_multiplier: auto``).

    With a keep rate k, generating ``remaining / k`` prompts fills the batch in one round on
    average; ``headroom`` (> 1) buys a margin against an unlucky round, whose surplus is carried
    rather than wasted. The result is clamped to ``[1, max_multiplier]``; a keep rate of 0
    (nothing kept yet) asks for the maximum.
    """
    if not 0.0 <= keep_rate <= 1.0 or math.isnan(keep_rate):
        raise ValueError(f"keep_rate must be in [0, 1], got {keep_rate}")
    if max_multiplier < 1.0:
        raise ValueError(f"max_multiplier must be >= 1, got {max_multiplier}")
    if headroom < 1.0:
        raise ValueError(f"headroom must be >= 1, got {headroom}")
    if keep_rate == 0.0:
        return float(max_multiplier)
    return float(min(max(headroom / keep_rate, 1.0), max_multiplier))


def prompts_for_kept(groups: float, keep: float, headroom_sd: float = 2.0) -> float:
    """Prompts to draw for ``groups`` kept groups at keep rate ``keep`` (in (0, 1]): the
    expected number plus ``headroom_sd`` standard deviations of the binomial keep count, so
    that the groups are rarely short (at 2 SD, ~2% of the time)."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    expected = groups / keep
    return expected + headroom_sd * math.sqrt(expected * keep * (1.0 - keep)) / keep
