"""Context parallelism (CP): how a sequence, or a pack of them, is split over the CP ranks.

Under CP each rank of a CP group holds a slice of every sequence. Megatron's layout is
load-balanced for causal attention: the sequence is cut into ``2 * cp`` equal chunks and
rank ``r`` holds chunks ``r`` and ``2 * cp - 1 - r``, concatenated (so every rank has the
same amount of work: one early, cheap chunk and one late, expensive one). Megatron's
``get_batch_on_this_cp_rank`` and ``RotaryEmbedding`` (``get_pos_emb_on_this_cp_rank``)
use this layout; ``split_for_context_parallel`` reproduces it for our batches.

What the model expects from callers under CP > 1:

* every input with a sequence dimension (``input_ids``, ``position_ids``, labels, loss
  masks) is split with ``split_for_context_parallel``; the sequence length must be a
  multiple of ``2 * cp`` (pad it);
* RoPE does not read ``position_ids``: GPTModel builds rotary angles for positions
  ``0 .. s-1`` (``s`` = local length x cp) and slices them with the same layout, so a
  rank's tokens must be exactly its split of a sequence starting at position 0;
* outputs (logits, per-token logprobs) are per rank in the split layout;
  ``gather_from_context_parallel`` restores the sequence order when a full copy is needed.

Packed sequences (THD). Several sequences concatenated without padding between them
into one row ``[1, T]``, described by ``cu_seqlens`` (int32 ``[n + 1]``, cumulative
lengths, ``cu_seqlens[0] == 0``, ``cu_seqlens[-1] == T``), passed to the model as
``PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=m,
max_seqlen_kv=m)``. The layout is TE's and Megatron's (``_apply_rotary_pos_emb_thd``):

* each sequence's length in ``cu_seqlens`` is its PADDED length: a multiple of ``2 * cp``
  under CP (times ``tp`` under sequence parallelism); the real tokens come first, the
  padding after them (the loss masks the padding's outputs; causal masking keeps it out
  of the real tokens' attention);
* ``cu_seqlens`` and ``m`` are GLOBAL (the whole pack, before the CP split) and equal on
  every rank; ``m`` is the longest padded length (Megatron sizes RoPE with it; ``m ==
  T`` with several sequences would switch Megatron's RoPE to offset positions, refused);
* under CP, rank ``r`` holds, for every sequence in order, that sequence's chunks ``r``
  and ``2 * cp - 1 - r`` of its ``2 * cp`` equal chunks: ``split_packed_for_context_
  parallel`` builds that from the global pack, ``gather_packed_from_context_parallel``
  inverts it, ``packed_cp_index`` gives the global pack index of each local token;
* RoPE positions restart at 0 in every sequence (``position_ids`` are not read).

The core attention that works on this layout without Transformer Engine is
``cp_attention.ContextParallelAttention``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from dapo_megatron.data.packing import local_order
from dapo_megatron.device import collectives


def _check_split(seq_len: int, cp_rank: int, cp_size: int) -> int:
    """Validate the layout arguments; returns the chunk length ``seq_len / (2 * cp_size)``.

    Without CP nothing is split, so any length is valid (the chunk length is then unused).
    """
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank={cp_rank}, cp_size={cp_size}: need 0 <= cp_rank < cp_size")
    if cp_size > 1 and seq_len % (2 * cp_size) != 0:
        raise ValueError(
            f"sequence length {seq_len} is not divisible by 2 * context_parallel_size = "
            f"{2 * cp_size}; pad the sequences to a multiple of {2 * cp_size}"
        )
    return seq_len // (2 * cp_size)


def cp_positions(seq_len: int, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Global positions of the tokens held by ``cp_rank``, in their local order.

    Args:
        seq_len: full sequence length ``s`` (a multiple of ``2 * cp_size``).
        cp_rank: this rank in the CP group.
        cp_size: CP group size.

    Returns:
        LongTensor ``[s / cp_size]`` (``arange(s)`` when ``cp_size == 1``): chunk ``cp_rank`` then chunk ``2 * cp_size - 1 -
        cp_rank``. Example: ``s = 8, cp = 2`` gives ``[0, 1, 6, 7]`` on rank 0 and
        ``[2, 3, 4, 5]`` on rank 1.
    """
    chunk = _check_split(seq_len, cp_rank, cp_size)
    if cp_size == 1:
        return torch.arange(seq_len)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    last_chunk = 2 * cp_size - 1 - cp_rank
    second = torch.arange(last_chunk * chunk, (last_chunk + 1) * chunk)
    return torch.cat([first, second])


def split_for_context_parallel(
    tensor: torch.Tensor, *, seq_dim: int, cp_rank: int, cp_size: int
) -> torch.Tensor:
    """This rank's part of ``tensor`` along ``seq_dim``, in Megatron's load-balanced layout.

    Args:
        tensor: any tensor whose dimension ``seq_dim`` is the full sequence ``s``
            (``input_ids [b, s]``: ``seq_dim=1``; hidden states ``[s, b, h]``: ``0``).
        seq_dim: the sequence dimension (negative values count from the end).
        cp_rank: this rank in the CP group.
        cp_size: CP group size; 1 returns ``tensor`` itself.

    Returns:
        Same shape except ``s / cp_size`` along ``seq_dim`` (a new tensor when cp > 1).

    Raises:
        ValueError: cp > 1 and ``s`` is not a multiple of ``2 * cp_size`` (the message
            names ``s``).
    """
    seq_len = tensor.shape[seq_dim]
    _check_split(seq_len, cp_rank, cp_size)
    if cp_size == 1:
        return tensor
    index = cp_positions(seq_len, cp_rank, cp_size).to(tensor.device)
    return tensor.index_select(seq_dim, index)


@functools.lru_cache(maxsize=64)
def rank_major_to_global_order(seq_len: int, cp_size: int) -> torch.Tensor:
    """Index that reorders the rank-major concatenation of all splits into sequence order.

    Concatenating every rank's split (rank 0 first) puts global position
    ``positions[i]`` at row ``i``; ``argsort`` inverts that permutation. Cached: every
    layer of every micro-batch asks for the same few lengths (callers must not modify it).
    """
    positions = torch.cat([cp_positions(seq_len, r, cp_size) for r in range(cp_size)])
    return torch.argsort(positions)


def gather_from_context_parallel(
    tensor: torch.Tensor, *, seq_dim: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Inverse of ``split_for_context_parallel``: the full sequence, on every rank of ``group``.

    Forward only: the result carries no autograd history (compute losses on the local
    split, where gradients are exact, and gather only values to report or store, such as
    per-token logprobs).

    Args:
        tensor: this rank's split, ``s / cp`` along ``seq_dim``; same shape on all ranks.
        seq_dim: the sequence dimension.
        group: the CP process group (``parallel_state.get_context_parallel_group()``);
            None or a group of size 1 returns a detached ``tensor``.

    Returns:
        ``[..., s, ...]``: all ranks' splits in sequence order.
    """
    cp_size = 1 if group is None else dist.get_world_size(group)
    if cp_size == 1:
        return tensor.detach()
    seq_dim = seq_dim % tensor.dim()
    local = tensor.detach().contiguous()
    parts = [torch.empty_like(local) for _ in range(cp_size)]
    collectives.all_gather(parts, local, group=group)
    rank_major = torch.cat(parts, dim=seq_dim)
    order = rank_major_to_global_order(rank_major.shape[seq_dim], cp_size)
    return rank_major.index_select(seq_dim, order.to(rank_major.device))


def _packed_boundaries(cu_seqlens: Tensor | Sequence[int]) -> tuple[int, ...]:
    """``cu_seqlens`` as a tuple of ints (a hashable cache key), validated."""
    bounds = tuple(
        int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else cu_seqlens)
    )
    if len(bounds) < 2 or bounds[0] != 0 or any(b < a for a, b in itertools.pairwise(bounds)):
        raise ValueError(
            f"cu_seqlens {list(bounds)}: need [0, ...] non-decreasing with at least one sequence"
        )
    return bounds


# (tensor, its in-place version, boundaries) of the last few cu_seqlens tensors seen: one
# pack's cu_seqlens reach every layer's attention and RoPE (q and k) as the same tensor, and
# reading it (a device-to-host copy on GPU) once per pack instead of per call is enough.
_BOUNDARY_ENTRIES = 4
_boundary_cache: list[tuple[Tensor, int, tuple[int, ...]]] = []


def cached_boundaries(cu_seqlens: Tensor | Sequence[int]) -> tuple[int, ...]:
    """``_packed_boundaries(cu_seqlens)``, remembered for the last few tensors by identity
    (an in-place change of the tensor is noticed through its version counter)."""
    if not isinstance(cu_seqlens, Tensor):
        return _packed_boundaries(cu_seqlens)
    for tensor, version, bounds in _boundary_cache:
        if tensor is cu_seqlens and tensor._version == version:
            return bounds
    bounds = _packed_boundaries(cu_seqlens)
    # The entry holds the tensor, so its id cannot be reused while it is cached.
    _boundary_cache.insert(0, (cu_seqlens, cu_seqlens._version, bounds))
    del _boundary_cache[_BOUNDARY_ENTRIES:]
    return bounds


def check_packed_split(bounds: tuple[int, ...], cp_rank: int, cp_size: int) -> None:
    """Every sequence of the pack must be splittable into ``2 * cp_size`` equal chunks."""
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        try:
            _check_split(end - start, cp_rank, cp_size)
        except ValueError as error:
            raise ValueError(f"packed sequence {i} (cu_seqlens {list(bounds)}): {error}") from None


@functools.lru_cache(maxsize=64)
def _packed_cp_index(bounds: tuple[int, ...], cp_rank: int, cp_size: int) -> Tensor:
    check_packed_split(bounds, cp_rank, cp_size)
    # One definition of the layout, shared with the batch packing (data/packing.py).
    return local_order([end - start for start, end in itertools.pairwise(bounds)], cp_rank, cp_size)


def packed_cp_index(cu_seqlens: Tensor | Sequence[int], cp_rank: int, cp_size: int) -> torch.Tensor:
    """Global pack index of each token that ``cp_rank`` holds, in its local order.

    Args:
        cu_seqlens: GLOBAL cumulative padded lengths ``[n + 1]`` (``[0, ..., T]``); every
            length must be a multiple of ``2 * cp_size`` when ``cp_size > 1``.
        cp_rank: this rank in the CP group.
        cp_size: CP group size.

    Returns:
        LongTensor ``[T / cp_size]``: for each sequence in order, ``start +
        cp_positions(length, cp_rank, cp_size)``. Example: ``cu_seqlens = [0, 4, 12]``,
        ``cp = 2``: rank 0 holds ``[0, 3, 4, 5, 10, 11]``, rank 1 ``[1, 2, 6, 7, 8, 9]``.
        Do not modify it (cached).

    Raises:
        ValueError: malformed ``cu_seqlens`` or a length not divisible by ``2 * cp_size``.
    """
    return _packed_cp_index(_packed_boundaries(cu_seqlens), cp_rank, cp_size)


def split_packed_for_context_parallel(
    tensor: torch.Tensor,
    cu_seqlens: Tensor | Sequence[int],
    *,
    seq_dim: int,
    cp_rank: int,
    cp_size: int,
) -> torch.Tensor:
    """This rank's part of a packed ``tensor`` (THD layout, see the module docstring).

    Args:
        tensor: dimension ``seq_dim`` is the whole pack, ``T = cu_seqlens[-1]`` tokens
            (``input_ids [1, T]``: ``seq_dim=1``).
        cu_seqlens: GLOBAL cumulative padded lengths.
        seq_dim: the packed dimension.
        cp_rank: this rank in the CP group.
        cp_size: CP group size; 1 returns ``tensor`` itself.

    Returns:
        ``T / cp_size`` along ``seq_dim``: per sequence, its chunks ``cp_rank`` and
        ``2 * cp_size - 1 - cp_rank``, sequences in pack order.
    """
    bounds = _packed_boundaries(cu_seqlens)
    if tensor.shape[seq_dim] != bounds[-1]:
        raise ValueError(
            f"packed dimension {seq_dim} has {tensor.shape[seq_dim]} tokens, cu_seqlens ends "
            f"at {bounds[-1]}"
        )
    index = _packed_cp_index(bounds, cp_rank, cp_size)
    if cp_size == 1:
        return tensor
    return tensor.index_select(seq_dim, index.to(tensor.device))


@functools.lru_cache(maxsize=64)
def packed_rank_major_to_global_order(bounds: tuple[int, ...], cp_size: int) -> Tensor:
    """Index that reorders the rank-major concatenation of all packed splits into pack
    order (the packed analogue of ``rank_major_to_global_order``; cached, do not modify).
    """
    positions = torch.cat([_packed_cp_index(bounds, r, cp_size) for r in range(cp_size)])
    return torch.argsort(positions)


def gather_packed_from_context_parallel(
    tensor: torch.Tensor,
    cu_seqlens: Tensor | Sequence[int],
    *,
    seq_dim: int,
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """Inverse of ``split_packed_for_context_parallel``: the whole pack on every rank.

    Forward only (detached), like ``gather_from_context_parallel``.

    Args:
        tensor: this rank's split, ``T / cp`` along ``seq_dim``; same shape on all ranks.
        cu_seqlens: GLOBAL cumulative padded lengths (``T = cu_seqlens[-1]``).
        seq_dim: the packed dimension.
        group: the CP process group; None or size 1 returns a detached ``tensor``.

    Returns:
        ``[..., T, ...]`` in pack order.
    """
    cp_size = 1 if group is None else dist.get_world_size(group)
    bounds = _packed_boundaries(cu_seqlens)
    seq_dim = seq_dim % tensor.dim()
    if tensor.shape[seq_dim] * cp_size != bounds[-1]:
        raise ValueError(
            f"{tensor.shape[seq_dim]} local tokens x cp {cp_size} != cu_seqlens[-1] = {bounds[-1]}"
        )
    if cp_size == 1:
        return tensor.detach()
    local = tensor.detach().contiguous()
    parts = [torch.empty_like(local) for _ in range(cp_size)]
    collectives.all_gather(parts, local, group=group)
    rank_major = torch.cat(parts, dim=seq_dim)
    order = packed_rank_major_to_global_order(bounds, cp_size)
    return rank_major.index_select(seq_dim, order.to(rank_major.device))
