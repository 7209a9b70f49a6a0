"""What cached decoding needs of a Megatron-Core GPTModel, for megatron/inference.py: the
model's flags and methods changed for one ``generate`` call and restored afterwards
(sequence parallelism off, RoPE applied before the KV cache), the cache's row compaction,
and whether core attention honours an explicit padding mask.

The generation engine (inference.py) runs the decode loop; this module only adapts the
model and its ``StaticInferenceContext`` to it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import cast

import torch
from megatron.core.inference.contexts import StaticInferenceContext
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.attention import Attention
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from dapo_megatron.megatron.cp_attention import ContextParallelAttention

# The context attribute that switches its decode steps to _static_decode_step.
_STATIC_COLUMN = "dapo_static_column"

AdjustedKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, AttnMaskType, None]
"""What ``Attention._adjust_key_value_for_inference`` returns: query, key, value, rotary
embedding (consumed), attention mask type, block table (none)."""

# Module attributes through which Megatron layers decide to split/gather the sequence.
_SEQUENCE_PARALLEL_ATTRS = (
    "sequence_parallel",
    "scatter_to_sequence_parallel",
    "reduce_scatter_embeddings",
)


@contextlib.contextmanager
def sequence_parallel_off(model: torch.nn.Module) -> Iterator[None]:
    """Run without sequence parallelism, then restore every flag to its previous value."""
    config = cast(GPTModel, model).config
    saved: list[tuple[object, str, bool]] = [
        (config, "sequence_parallel", config.sequence_parallel)
    ]
    for module in model.modules():
        for attr in _SEQUENCE_PARALLEL_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, bool):
                saved.append((module, attr, value))
    try:
        for owner, attr, _ in saved:
            setattr(owner, attr, False)
        yield
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)


def honours_padding_mask(model: torch.nn.Module) -> bool:
    """True when core attention applies an explicit mask in prefill and decode alike.

    Megatron's local ``DotProductAttention`` masks with the given tensor whenever one is
    passed (torch softmax path). Transformer Engine drops masks once decoding (its mask
    type becomes no_mask) and the fused causal softmax kernel ignores them.

    A model built with ``packed=True`` (the policy's own model when colocated) has our
    ``ContextParallelAttention``, which at CP == 1 hands every unpacked call, so every
    prefill and decode step here, to an inner ``DotProductAttention``: that module decides.
    (Judging by the outer type sent such a model down the one-prompt-length-per-batch
    path: other batches than a plain model's, hence other sampling draws and RoPE offsets,
    so the colocated rollouts differed from those of a plain model with the same weights.)
    """
    gpt = cast(GPTModel, model)
    core = gpt.decoder.layers[0].self_attention.core_attention
    if isinstance(core, ContextParallelAttention) and core._unpacked is not None:
        core = core._unpacked
    fused = gpt.config.masked_softmax_fusion and torch.cuda.is_available()
    return type(core) is DotProductAttention and not fused


def _rotated_kv_cache_step(
    attention: Attention,
    context: StaticInferenceContext,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rotary_pos_emb: tuple[torch.Tensor, torch.Tensor] | None,
    *_unused: object,
    **_unused_kwargs: object,
) -> AdjustedKV:
    """``Attention._adjust_key_value_for_inference`` with RoPE applied BEFORE caching.

    Megatron's static path caches un-rotated keys and rotates the whole cache
    ``[0, end)`` again at every decode step: O(T) extra work per step, O(T^2) per response,
    which dominated CPU decoding. Here the new queries and keys are rotated once at their
    positions ``[start, end)`` with Megatron's own ``apply_rotary_pos_emb`` (the same
    arithmetic per key), the rotated keys are cached, and ``rotary_pos_emb=None`` tells
    the caller that RoPE is done. Cache layout and context bookkeeping are Megatron's.
    Shapes: query [sq, b, np, hn], key/value [sq, b, ng, hn]; returns the cached
    key/value [end, b, ng, hn].
    """
    if attention.layer_number not in context.key_value_memory_dict:
        # Zeroed, not Megatron's torch.empty: the static step attends over columns not yet
        # written, with weight 0, and 0 x a NaN left in fresh memory would be a NaN.
        context.key_value_memory_dict[attention.layer_number] = tuple(
            attention._allocate_memory(
                context.max_sequence_length, context.max_batch_size, t.shape[-1], t.dtype
            ).zero_()
            for t in (key, value)
        )
    key_memory, value_memory = context.key_value_memory_dict[attention.layer_number]
    column = getattr(context, _STATIC_COLUMN, None)
    if column is not None and key.shape[0] == 1:
        return _static_decode_step(
            attention, key_memory, value_memory, column, query, key, value, rotary_pos_emb
        )
    start, end = context.sequence_len_offset, context.sequence_len_offset + key.shape[0]
    rows = slice(context.batch_size_offset, context.batch_size_offset + key.shape[1])
    if end > key_memory.shape[0]:
        raise ValueError(f"KV cache holds {key_memory.shape[0]} positions, step needs {end}")
    if rotary_pos_emb is not None:
        q_freqs, k_freqs = rotary_pos_emb
        cp_group = attention.pg_collection.cp
        query = apply_rotary_pos_emb(query, q_freqs[start:end], attention.config, cp_group=cp_group)
        key = apply_rotary_pos_emb(key, k_freqs[start:end], attention.config, cp_group=cp_group)
    key_memory[start:end, rows] = key
    value_memory[start:end, rows] = value
    # The prompt pass keeps the layer's causal mask type; decode steps see every cached key.
    mask_type = attention.attn_mask_type if start == 0 else AttnMaskType.no_mask
    return query, key_memory[:end, rows], value_memory[:end, rows], None, mask_type, None


def _static_decode_step(
    attention: Attention,
    key_memory: torch.Tensor,
    value_memory: torch.Tensor,
    column: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rotary_pos_emb: tuple[torch.Tensor, torch.Tensor] | None,
) -> AdjustedKV:
    """A decode step whose shapes and arguments never change from one token to the next,
    so that one CUDA graph replays every step: the position is the device tensor
    ``column`` ([1] int64, advanced by the engine between steps), not the context's Python
    offset; the new key/value land in the cache with ``index_copy_`` at that column; the
    attention runs over the WHOLE cache ``[max_seq, b, ng, hn]``, and the engine's key
    mask hides the columns not yet written (and the padding). Same arithmetic per key as
    the growing step above; the masked columns add exact zeros to the softmax."""
    if rotary_pos_emb is not None:
        q_freqs, k_freqs = rotary_pos_emb
        cp_group = attention.pg_collection.cp
        query = apply_rotary_pos_emb(
            query, q_freqs.index_select(0, column), attention.config, cp_group=cp_group
        )
        key = apply_rotary_pos_emb(
            key, k_freqs.index_select(0, column), attention.config, cp_group=cp_group
        )
    key_memory.index_copy_(0, column, key)
    value_memory.index_copy_(0, column, value)
    return query, key_memory, value_memory, None, AttnMaskType.no_mask, None


def set_static_column(context: StaticInferenceContext, column: torch.Tensor | None) -> None:
    """Decode steps of ``context`` from now on take their position from ``column`` (a
    [1] int64 device tensor) and attend over the whole cache (``_static_decode_step``);
    None: back to the growing step. Every cache row must be decoded (no row offset)."""
    setattr(context, _STATIC_COLUMN, column)


class _NoForkTracker:
    """Megatron's RNG tracker with ``fork`` a no-op (everything else delegated)."""

    def __init__(self, tracker: object) -> None:
        self._tracker = tracker

    def fork(self, *_args: object, **_kwargs: object) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def __getattr__(self, name: str) -> object:
        return getattr(self._tracker, name)


@contextlib.contextmanager
def rng_forks_off() -> Iterator[None]:
    """Megatron's RNG-tracker forks become no-ops (restored on exit).

    Core attention wraps its dropout in ``get_cuda_rng_tracker().fork()`` at every forward
    (``megatron/core/transformer/dot_product_attention.py``, ``DotProductAttention.forward``),
    and ``CudaRNGStatesTracker.fork`` (``megatron/core/tensor_parallel/random.py``) swaps
    the CUDA generator's state in and out and compares the CPU generator's state with an
    ``.item()``: host work per layer per token, and a generator-state change that a CUDA
    graph capture cannot hold (``CudaGraphManager.__init__`` in
    ``megatron/core/transformer/cuda_graphs.py`` asserts an inference tracker for that
    reason). Megatron's own inference tracker (``initialize_rng_tracker(
    inference_rng_tracker=True)``) forks into a nullcontext; this does the same for the
    length of a generate call. Exact: in eval mode dropout draws nothing."""
    from megatron.core.tensor_parallel import random as mpu_random

    saved = mpu_random._CUDA_RNG_STATE_TRACKER
    if saved is None:
        yield
        return
    mpu_random._CUDA_RNG_STATE_TRACKER = _NoForkTracker(saved)
    try:
        yield
    finally:
        mpu_random._CUDA_RNG_STATE_TRACKER = saved


@contextlib.contextmanager
def rotate_before_caching(model: torch.nn.Module) -> Iterator[None]:
    """Install ``_rotated_kv_cache_step`` on every attention layer of ``model`` (instance
    attributes, removed on exit: the class's method serves training and other users)."""
    gpt = cast(GPTModel, model)
    if gpt.config.flash_decode:  # flash decoding rotates before caching by itself
        yield
        return
    layers = [layer.self_attention for layer in gpt.decoder.layers]
    for attention in layers:
        attention._adjust_key_value_for_inference = functools.partial(
            _rotated_kv_cache_step, attention
        )
    try:
        yield
    finally:
        for attention in layers:
            del attention._adjust_key_value_for_inference


def compact_cache(context: StaticInferenceContext, keep: torch.Tensor) -> None:
    """Keep only the cache rows ``keep`` (their filled positions) in every layer."""
    filled = context.sequence_len_offset
    for layer, (keys, values) in context.key_value_memory_dict.items():
        compacted = []
        for memory in (keys, values):
            new = memory.new_zeros(memory.shape[0], len(keep), *memory.shape[2:])
            new[:filled] = memory[:filled, keep]
            compacted.append(new)
        context.key_value_memory_dict[layer] = tuple(compacted)
    context.max_batch_size = len(keep)
