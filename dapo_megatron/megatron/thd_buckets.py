"""Index plan of packed (THD) attention at CP == 1: sequences grouped by power-of-two
length bucket, each bucket attended as one padded batch (``ContextParallelAttention``).

The plan depends only on the pack's boundaries, so it is built once per pack and reused
by every layer, forward and backward.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Sequences of one power-of-two length bucket, attended as one padded batch."""

    index: Tensor
    """``[w, n]`` packed position of token ``j`` of member ``r`` (``w``: the longest member);
    a shorter member's padding repeats its first position (masked, outputs dropped)."""
    causal_mask: Tensor
    """``[w, w]`` True where key position > query position."""


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    buckets: tuple[Bucket, ...]
    inverse: Tensor
    """``[t]``: row of each packed token in the concatenation of the buckets' flattened
    ``[w * n]`` outputs."""


@functools.lru_cache(maxsize=8)
def thd_buckets(bounds: tuple[int, ...], device: torch.device) -> BucketPlan:
    """The gather and scatter indices of ``ContextParallelAttention._thd_bucketed`` for one
    pack (cached: a pack passes through every layer, forward and backward, with the same
    boundaries; do not modify the tensors)."""
    lengths = [end - start for start, end in itertools.pairwise(bounds)]
    members: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        if length:
            members.setdefault((length - 1).bit_length(), []).append(i)
    buckets, flat_index, flat_real = [], [], []
    for rows in members.values():
        width = max(lengths[i] for i in rows)
        offsets = torch.arange(width)
        starts = torch.tensor([bounds[i] for i in rows])
        ends = torch.tensor([bounds[i] + lengths[i] for i in rows])
        index = starts[None, :] + offsets[:, None]
        real = index < ends[None, :]
        index = torch.where(real, index, starts[None, :])
        causal = offsets[None, :] > offsets[:, None]
        buckets.append(Bucket(index.to(device), causal.to(device)))
        flat_index.append(index.reshape(-1))
        flat_real.append(real.reshape(-1))
    inverse = torch.empty(bounds[-1], dtype=torch.long)
    if buckets:
        position, real = torch.cat(flat_index), torch.cat(flat_real)
        inverse[position[real]] = torch.arange(position.numel())[real]
    return BucketPlan(tuple(buckets), inverse.to(device))
