"""Rotary embeddings of packed (THD) sequences without a Python loop over the sequences.

Megatron-Core's unfused ``rope_utils._apply_rotary_pos_emb_thd`` (taken whenever
``apply_rope_fusion`` is off: the local spec on CPU, and TE layers without fused RoPE)
splits the packed tensor per sequence and slices the rotary angles for each one, for the
queries and again for the keys, on every layer. A pack of hundreds of short rollouts then
costs thousands of small tensor ops per forward pass; on the tiny CPU recipe that was more
time than the layers' matmuls. The angles depend only on the pack's boundaries, so
``apply_rotary_pos_emb_thd`` gathers, once per pack, the cos and sin of every packed token's
angle from the ``[max_s, 1, 1, d]`` table and reuses them for q and k, across layers and in
re-runs of the same pack (activation recompute). Applying them is Megatron's own elementwise
arithmetic (``_apply_rotary_pos_emb_bshd`` on the ``[t, 1, h, d]`` view), and a gathered
cos equals the cos of the gathered angle, so the result is bit-identical to Megatron's
function (tests/distributed/test_packed_attention.py compares them).

``install()`` puts it in place of Megatron's function. ``rope_utils.apply_rotary_pos_emb``
(what ``Attention.forward`` calls) looks the name up in its module at call time, so
replacing the module attribute is enough; nothing else in Megatron-Core calls it.
"""

from __future__ import annotations

import functools
import itertools
from collections import OrderedDict
from typing import Any

import torch
from megatron.core.models.common.embeddings import rope_utils
from torch import Tensor

from dapo_megatron.megatron.context_parallel import cached_boundaries, packed_cp_index

MEGATRON_APPLY_ROTARY_POS_EMB_THD = rope_utils._apply_rotary_pos_emb_thd
"""Megatron's own function (the reference of the tests)."""

# One entry per (angle table, pack, rank, dtype): a pack's q and k on all layers hit the
# same entry. A few entries cover the packs in flight (pipeline schedules interleave the
# forwards of several micro-batches; recompute re-runs a pack's forward in its backward);
# a miss only recomputes.
_COS_SIN_ENTRIES = 4
_cos_sin_cache: OrderedDict[tuple[Any, ...], tuple[Tensor, Tensor, Tensor]] = OrderedDict()


@functools.lru_cache(maxsize=32)
def _angle_rows(bounds: tuple[int, ...], cp_rank: int, cp_size: int, with_offsets: bool) -> Tensor:
    """``[t / cp]`` row of the angle table for each token this rank holds: its position in
    its own sequence (the rank's load-balanced chunks under CP), plus the sequence's start
    in the pack when the table covers the whole pack (Megatron's offset mode). Cached: do
    not modify."""
    pack_index = packed_cp_index(bounds, cp_rank, cp_size)
    if with_offsets:
        return pack_index
    starts = torch.tensor(bounds[:-1])
    local_lengths = torch.tensor(
        [(end - start) // cp_size for start, end in itertools.pairwise(bounds)]
    )
    return pack_index - starts.repeat_interleave(local_lengths)


def _packed_cos_sin(
    freqs: Tensor,
    bounds: tuple[int, ...],
    cp_rank: int,
    cp_size: int,
    mscale: float,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """``[t / cp, 1, 1, d]`` cos and sin (times ``mscale``, in ``dtype``) of this rank's
    packed tokens, as Megatron's ``_apply_rotary_pos_emb_bshd`` computes them."""
    key = (
        id(freqs),
        bounds,
        cp_rank,
        cp_size,
        mscale,
        dtype,
        torch.is_inference_mode_enabled(),  # inference tensors cannot be saved for backward
    )
    hit = _cos_sin_cache.get(key)
    # The entry holds the table itself, so while it lives no other tensor can take its id.
    if hit is not None and hit[0] is freqs:
        _cos_sin_cache.move_to_end(key)
        return hit[1], hit[2]
    with_offsets = freqs.size(0) == bounds[-1]
    rows = _angle_rows(bounds, cp_rank, cp_size, with_offsets).to(freqs.device)
    angles = freqs.index_select(0, rows)
    cos = (torch.cos(angles) * mscale).to(dtype)
    sin = (torch.sin(angles) * mscale).to(dtype)
    if not freqs.requires_grad:  # a differentiable table (never in Megatron) is not reused
        _cos_sin_cache[key] = (freqs, cos, sin)
        while len(_cos_sin_cache) > _COS_SIN_ENTRIES:
            _cos_sin_cache.popitem(last=False)
    return cos, sin


def apply_rotary_pos_emb_thd(
    t: Tensor,
    cu_seqlens: Tensor,
    freqs: Tensor,
    rotary_interleaved: bool = False,
    multi_latent_attention: bool = False,
    mscale: float = 1.0,
    cp_group: torch.distributed.ProcessGroup | None = None,
) -> Tensor:
    """Megatron's ``_apply_rotary_pos_emb_thd``, vectorised (same signature and result).

    Args:
        t: ``[t / cp, h, d]`` packed queries or keys of this CP rank.
        cu_seqlens: int32 ``[n + 1]`` GLOBAL cumulative (padded) lengths.
        freqs: ``[max_s, 1, 1, d_rot]`` angles for positions ``0 .. max_s - 1``; when
            ``max_s == cu_seqlens[-1]`` positions are offset by each sequence's start (as
            in Megatron).
        rotary_interleaved: rotate interleaved pairs instead of halves.
        multi_latent_attention: de-interleave ``t`` first (Megatron's MLA layout).
        mscale: magnitude scale of cos and sin.
        cp_group: the CP group (required, as in Megatron).

    Returns:
        ``[t / cp, h, d]``.
    """
    if cp_group is None:
        raise ValueError("cp_group must be provided for THD format RoPE")
    bounds = cached_boundaries(cu_seqlens)
    cos, sin = _packed_cos_sin(freqs, bounds, cp_group.rank(), cp_group.size(), mscale, t.dtype)
    x = t.unsqueeze(1)
    rot_dim = freqs.shape[-1]
    x, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    if multi_latent_attention:
        x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    x = (x * cos) + (rope_utils._rotate_half(x, rotary_interleaved) * sin)
    if x_pass.shape[-1]:
        x = torch.cat((x, x_pass), dim=-1)
    return x.squeeze(1)


def install() -> None:
    """Use ``apply_rotary_pos_emb_thd`` for Megatron's unfused THD RoPE (idempotent; on
    every device: it is exact, and the loop it replaces costs kernel launches on GPU too)."""
    rope_utils._apply_rotary_pos_emb_thd = apply_rotary_pos_emb_thd
