"""Core attention under context parallelism without Transformer Engine (K/V all-gather).

Megatron's own CP attention exists only in Transformer Engine (its local
``DotProductAttention`` refuses CP > 1), and TE needs CUDA. ``ContextParallelAttention``
is a drop-in ``core_attention`` for the local layer spec that all-gathers K and V over the
CP group, so each rank attends with its own queries to the whole sequence. It costs
``O(s)`` memory for K/V per rank (a ring exchange would not), which is fine for CPU runs
and small GPU jobs without TE; on GPU with TE installed the TE spec is used instead.

``ContextParallelAttention`` implements THD for the local spec at any CP size (the model
uses it whenever ``build_model(..., packed=True)``): a token attends to the tokens of its
own sequence at positions ``<=`` its own, never across sequence boundaries.

The sequence layouts it works on (load-balanced CP split, packed THD) are described and
built in ``context_parallel.py``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide
from torch import Tensor

from dapo_megatron.device import collectives
from dapo_megatron.megatron.context_parallel import (
    cached_boundaries,
    check_packed_split,
    cp_positions,
    packed_rank_major_to_global_order,
    rank_major_to_global_order,
)
from dapo_megatron.megatron.thd_buckets import thd_buckets


class _AllGatherSequence(torch.autograd.Function):
    """All-gather along dim 0 (rank-major) whose backward is a reduce-scatter.

    Every rank uses the gathered tensor for its own queries, so the loss is a sum over
    ranks and the gradient of rank ``r``'s input is the sum over all ranks of the
    gradient flowing into rows ``[r * n, (r + 1) * n)`` of the gathered tensor: an
    all-reduce of the whole gradient, then this rank's slice. The slice is taken in
    rank-major order, the order the forward concatenated in; the load-balanced layout
    only matters for the reordering done outside this function (a local, differentiable
    ``index_select``). ``torch.distributed.nn.functional.all_gather`` gave wrong gradients
    inside the model under gloo (notes/cpu-findings.md), hence this function.
    """

    @staticmethod
    def forward(ctx: Any, local: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        ctx.rows = local.shape[0]
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        collectives.all_gather(parts, local, group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        # Clone: the incoming gradient may be shared with other autograd consumers, and
        # the all-reduce works in place.
        grad = grad.contiguous().clone()
        collectives.all_reduce(grad, group=ctx.group)
        return grad.narrow(0, ctx.rank * ctx.rows, ctx.rows), None


# Megatron-Core ships no type information: MegatronModule is Any to mypy.
class ContextParallelAttention(MegatronModule):  # type: ignore[misc]
    """Causal core attention under context parallelism by all-gathering K and V.

    A replacement for ``megatron.core.transformer.dot_product_attention.
    DotProductAttention`` in the local layer spec (same constructor and forward), which
    also works when ``config.context_parallel_size > 1``. Each rank keeps its own queries
    ``[s/cp, b, np, hn]``, gathers the keys and values of the whole sequence from the CP
    group, and masks by global position (query at position ``p`` sees keys ``<= p``).
    Grouped-query attention repeats the KV heads after the gather (less to send). The
    softmax runs in fp32; probabilities are cast back to the value dtype before the
    product with V, as in Megatron's local attention. At CP == 1 it computes the same
    function as ``DotProductAttention`` (the model uses it when CP > 1 or for packed
    sequences).

    Packed sequences (``packed_seq_params.qkv_format == "thd"``, layout in
    context_parallel.py's docstring): queries ``[t/cp, np, hn]``; K/V are gathered and reordered to pack order
    in the same way, then each sequence attends on its own (block-diagonal attention).

    Not supported (a clear error): attention bias, sliding windows, non-vanilla softmax,
    K/V longer than the queries (a KV cache or cross-attention: inference under CP is not
    supported), and with THD an explicit attention mask or different q/kv packings.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.window_size is not None:
            raise NotImplementedError("ContextParallelAttention: sliding-window attention")
        if config.softmax_type != "vanilla":
            raise NotImplementedError(
                f"ContextParallelAttention: softmax_type {config.softmax_type!r}"
            )
        self.config: TransformerConfig = config
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        # cp_comm_type picks TE's exchange pattern (p2p, all_gather, a2a); there is only
        # one pattern here, an all-gather, so the value is accepted and ignored.
        del cp_comm_type
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        self.pg_collection = pg_collection
        self.tp_group = pg_collection.tp
        cp_group = getattr(pg_collection, "cp", None)
        self.cp_group = (
            cp_group
            if cp_group is not None
            else parallel_state.get_context_parallel_group(check_initialized=False)
        )

        tp_size = self.tp_group.size()
        projection_size = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection_size, tp_size)
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, tp_size)
        head_dim = divide(projection_size, config.num_attention_heads)
        self.softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
        # Megatron's query-key layer scaling divides the scores by the layer number before
        # the (low-precision) matmul and multiplies them back in fp32 inside the softmax.
        self.coeff = None
        if config.apply_query_key_layer_scaling:
            self.coeff = float(self.layer_number)
            self.softmax_scale /= self.coeff
        self.attention_dropout = torch.nn.Dropout(
            config.attention_dropout if attention_dropout is None else attention_dropout
        )
        # Unpacked batches at CP == 1 go to Megatron's own DotProductAttention (no
        # parameters, so checkpoints are unchanged): a model built for packing then runs
        # its padded passes and its KV-cache decoding (colocated generation) exactly as the
        # standard local spec does.
        self._unpacked = (
            DotProductAttention(
                config,
                layer_number,
                attn_mask_type,
                attention_type,
                attention_dropout=attention_dropout,
                softmax_scale=softmax_scale,
                pg_collection=pg_collection,
            )
            if config.context_parallel_size == 1
            else None
        )

    def _cp_size_rank(self) -> tuple[int, int]:
        if self.cp_group is None:
            return 1, 0
        return self.cp_group.size(), self.cp_group.rank()

    def _mask(
        self,
        attention_mask: Tensor | None,
        mask_type: AttnMaskType,
        q_positions: Tensor,
        seq_len: int,
    ) -> Tensor | None:
        """Boolean mask (True = hidden), broadcastable to scores ``[b, np, s/cp, s]``.

        Megatron's rule: for a causal layer an explicit mask replaces the causal one; for
        padding_causal both apply. An explicit mask holds this rank's query rows and all
        keys in sequence order (how ``get_batch_on_this_cp_rank`` splits masks).
        """
        causal = None
        if mask_type in (AttnMaskType.causal, AttnMaskType.padding_causal):
            key_positions = torch.arange(seq_len, device=q_positions.device)
            causal = key_positions[None, :] > q_positions[:, None]
        if attention_mask is None:
            return causal
        if mask_type == AttnMaskType.padding_causal:
            assert causal is not None  # built above for padding_causal
            return attention_mask.bool() | causal
        return attention_mask.bool()

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        """Attention of this rank's queries to the whole sequence.

        Args:
            query: ``[s/cp, b, np, hn]`` (np: query heads of this TP rank); with THD
                ``[t/cp, np, hn]`` (Megatron's ``Attention`` squeezes the batch of 1).
            key: ``[s/cp, b, ng, hn]`` (ng: KV heads of this TP rank; np % ng == 0); THD
                ``[t/cp, ng, hn]``.
            value: same shape as ``key``.
            attention_mask: None (causal by global position) or a boolean mask, True =
                hidden, broadcastable to ``[b, np, s/cp, s]``, keys in sequence order.
                Must be None with THD.
            attn_mask_type: overrides the layer's mask type when given.
            attention_bias: must be None.
            packed_seq_params: None, or THD parameters (``cu_seqlens_q`` global and padded,
                see context_parallel.py's docstring).

        Returns:
            ``[s/cp, b, np * hn]``, the layout of ``DotProductAttention``; with THD
            ``[t/cp, np * hn]`` (what TE returns; ``Attention`` reshapes it to
            ``[t/cp, 1, np * hn]``).
        """
        if packed_seq_params is None and self._unpacked is not None:
            out: torch.Tensor = self._unpacked(
                query,
                key,
                value,
                attention_mask,
                attn_mask_type=attn_mask_type,
                attention_bias=attention_bias,
            )
            return out
        if attention_bias is not None:
            raise NotImplementedError("ContextParallelAttention: attention bias")
        if key.shape[0] != query.shape[0]:
            raise NotImplementedError(
                f"ContextParallelAttention: {key.shape[0]} keys for {query.shape[0]} queries "
                "(a KV cache or cross-attention); only self-attention on the CP split is "
                "supported"
            )
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        if packed_seq_params is not None:
            return self._forward_thd(
                query, key, value, attention_mask, mask_type, packed_seq_params
            )
        cp_size, cp_rank = self._cp_size_rank()
        local_len = query.shape[0]
        seq_len = local_len * cp_size
        q_positions = cp_positions(seq_len, cp_rank, cp_size).to(query.device)

        if cp_size > 1:
            # One collective per layer: K and V travel together.
            k_dim = key.shape[-1]
            # torch's autograd.Function.apply is unannotated.
            kv = _AllGatherSequence.apply(torch.cat([key, value], dim=-1), self.cp_group)  # type: ignore[no-untyped-call]
            kv = kv.index_select(0, rank_major_to_global_order(seq_len, cp_size).to(kv.device))
            key, value = kv[..., :k_dim], kv[..., k_dim:]

        mask = self._mask(attention_mask, mask_type, q_positions, seq_len)
        return self._attend(query, key, value, mask)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> Tensor:
        """Softmax attention of ``query [sq, b, np, hn]`` to ``key``/``value [sk, b, ng, hn]``
        (keys already gathered and in order) under ``mask`` (True = hidden, broadcastable
        to ``[b, np, sq, sk]``). Returns ``[sq, b, np * hn]``."""
        local_len, batch, heads, _ = query.shape
        seq_len = key.shape[0]
        groups_per_head = (
            self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        )
        if groups_per_head > 1:
            key = key.repeat_interleave(groups_per_head, dim=2)
            value = value.repeat_interleave(groups_per_head, dim=2)

        # [s, b, np, hn] -> [b * np, s, hn]
        q = query.reshape(local_len, batch * heads, -1).transpose(0, 1)
        k = key.reshape(seq_len, batch * heads, -1).transpose(0, 1)
        v = value.reshape(seq_len, batch * heads, -1).transpose(0, 1)
        # baddbmm with beta=0 like Megatron: the scale is applied inside the matmul, which
        # keeps CP=1 results equal to DotProductAttention's rounding.
        scores = torch.baddbmm(
            torch.empty(batch * heads, local_len, seq_len, dtype=q.dtype, device=q.device),
            q,
            k.transpose(1, 2),
            beta=0.0,
            alpha=self.softmax_scale,
        ).view(batch, heads, local_len, seq_len)

        scores = scores.float()
        if self.coeff is not None:
            scores = scores * self.coeff
        if mask is not None:
            # The most negative finite value rather than -inf: a fully masked row (only
            # possible with an explicit mask) gives a uniform row instead of NaNs.
            scores = scores.masked_fill(mask, torch.finfo(torch.float32).min)
        probs = torch.softmax(scores, dim=-1).to(value.dtype)

        # Same RNG discipline as DotProductAttention: without SP, dropout masks must
        # differ across TP ranks (each holds different heads), so draw from the TP stream.
        if not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = self.attention_dropout(probs)
        else:
            probs = self.attention_dropout(probs)

        context = torch.bmm(probs.view(batch * heads, local_len, seq_len), v)
        # [b * np, s/cp, hn] -> [s/cp, b, np * hn]
        context = context.view(batch, heads, local_len, -1).permute(2, 0, 1, 3).contiguous()
        return context.view(local_len, batch, self.hidden_size_per_partition)

    def _thd_boundaries(self, params: PackedSeqParams, cp_size: int) -> tuple[int, ...]:
        """The pack's global boundaries from ``params`` (the padded ones when given, as
        Megatron's RoPE uses them), after checking what this module can honour."""
        if params.qkv_format != "thd":
            raise NotImplementedError(
                f"ContextParallelAttention: packed qkv_format {params.qkv_format!r} (only thd)"
            )
        if params.cp_group is not None and params.cp_group.size() != cp_size:
            raise ValueError(
                f"packed_seq_params.cp_group has {params.cp_group.size()} ranks, the layer's "
                f"CP group {cp_size}"
            )
        if params.local_cp_size is not None and params.local_cp_size != cp_size:
            raise NotImplementedError(
                f"ContextParallelAttention: local_cp_size={params.local_cp_size} (dynamic "
                f"CP); the CP group has {cp_size} ranks"
            )
        if params.cu_seqlens_q is None:
            raise ValueError("packed_seq_params.cu_seqlens_q is required for thd")
        real_q = cached_boundaries(params.cu_seqlens_q)
        real_kv = (
            real_q if params.cu_seqlens_kv is None else cached_boundaries(params.cu_seqlens_kv)
        )
        if real_kv != real_q:
            raise NotImplementedError(
                "ContextParallelAttention: cu_seqlens_kv differs from cu_seqlens_q (only "
                "self-attention over one packing)"
            )
        if (params.cu_seqlens_q_padded is None) != (params.cu_seqlens_kv_padded is None):
            # Attention.forward would rotate q by one packing and k by the other.
            raise ValueError("set both cu_seqlens_q_padded and cu_seqlens_kv_padded, or neither")
        if params.cu_seqlens_q_padded is None:
            return real_q
        bounds = cached_boundaries(params.cu_seqlens_q_padded)
        if cached_boundaries(params.cu_seqlens_kv_padded) != bounds:
            raise NotImplementedError(
                "ContextParallelAttention: cu_seqlens_kv_padded differs from cu_seqlens_q_padded"
            )
        # The padded packing is the memory layout; the real lengths only say where each
        # sequence's padding starts. Padding follows the real tokens, so causal masking
        # already hides it from them: the layout is all this module needs.
        if len(real_q) != len(bounds) or any(
            r_end - r_start > p_end - p_start
            for (r_start, r_end), (p_start, p_end) in zip(
                itertools.pairwise(real_q), itertools.pairwise(bounds), strict=True
            )
        ):
            raise ValueError(
                f"cu_seqlens_q {list(real_q)} does not fit cu_seqlens_q_padded {list(bounds)} "
                "(same number of sequences, each real length <= its padded length)"
            )
        return bounds

    def _thd_bucketed(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        bounds: tuple[int, ...],
        mask_type: AttnMaskType,
    ) -> Tensor:
        """Packed attention at CP == 1, batched: sequences whose lengths share a power-of-two
        bucket run as one padded ``[L, n, ...]`` batch. A Python loop over sequences costs
        a few small kernels per sequence and layer (hundreds of short rollouts per pack);
        a bucket pads each sequence to at most twice its length, in attention only (the
        projections and MLP stay packed). Padding is at the end of each row, so causal
        masking keeps it from every real query; its own outputs are dropped. The gather
        indices depend only on the pack, so they are built once per pack (``thd_buckets``)
        and every layer, forward and backward, reuses them."""
        plan = thd_buckets(bounds, query.device)
        causal = mask_type in (AttnMaskType.causal, AttnMaskType.padding_causal)
        contexts = []
        for bucket in plan.buckets:
            index = bucket.index
            mask = bucket.causal_mask if causal else None
            context = self._attend(query[index], key[index], value[index], mask)
            contexts.append(context.reshape(-1, self.hidden_size_per_partition))
        if not contexts:
            return query.new_zeros(query.shape[0], self.hidden_size_per_partition)
        # Every packed token is a real token of exactly one bucket row: one gather puts the
        # bucket outputs back in pack order (and its backward scatters the gradient once).
        flat = contexts[0] if len(contexts) == 1 else torch.cat(contexts, dim=0)
        return flat.index_select(0, plan.inverse)

    def _forward_thd(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        mask_type: AttnMaskType,
        params: PackedSeqParams,
    ) -> Tensor:
        """Packed (THD) attention: ``[t/cp, np, hn]`` queries -> ``[t/cp, np * hn]``."""
        if attention_mask is not None:
            raise NotImplementedError(
                "ContextParallelAttention: an explicit attention mask with packed sequences "
                "(the packing defines the mask)"
            )
        if query.dim() != 3:
            raise ValueError(f"thd query must be [t, np, hn], got {tuple(query.shape)}")
        cp_size, cp_rank = self._cp_size_rank()
        bounds = self._thd_boundaries(params, cp_size)
        check_packed_split(bounds, cp_rank, cp_size)
        local_len = query.shape[0]
        if local_len * cp_size != bounds[-1]:
            raise ValueError(
                f"{local_len} packed tokens on this rank x cp {cp_size} != cu_seqlens[-1] = "
                f"{bounds[-1]} (the cu_seqlens must be the GLOBAL, padded ones)"
            )
        lengths = [end - start for start, end in itertools.pairwise(bounds)]
        # Megatron's RoPE (rope_utils._apply_rotary_pos_emb_thd) is built for
        # max(max_seqlen_q, max_seqlen_kv) positions: fewer than the longest sequence
        # breaks it, and exactly T with several sequences switches it to positions offset
        # by each sequence's start in the pack (not what the unpacked model computes).
        rope_len = max(params.max_seqlen_q or 0, params.max_seqlen_kv or 0)
        if rope_len and rope_len < max(lengths):
            raise ValueError(
                f"max_seqlen_q/kv = {rope_len} < longest packed sequence {max(lengths)}"
            )
        if rope_len == bounds[-1] and sum(1 for n in lengths if n) > 1:
            raise ValueError(
                f"max_seqlen_q/kv = {rope_len} is the whole pack; set it to the longest "
                f"(padded) sequence, {max(lengths)} (Megatron's RoPE reads max_seqlen == T as "
                "positions offset by each sequence's start)"
            )

        if cp_size > 1:
            # As in the unpacked path: one all-gather of K and V per layer, then the
            # rank-major rows back in pack order.
            k_dim = key.shape[-1]
            # torch's autograd.Function.apply is unannotated.
            kv = _AllGatherSequence.apply(torch.cat([key, value], dim=-1), self.cp_group)  # type: ignore[no-untyped-call]
            order = packed_rank_major_to_global_order(bounds, cp_size).to(kv.device)
            kv = kv.index_select(0, order)
            key, value = kv[..., :k_dim], kv[..., k_dim:]

        if cp_size == 1:
            return self._thd_bucketed(query, key, value, bounds, mask_type)
        # Block-diagonal attention, one sequence at a time, rather than one [t/cp, t]
        # score matrix with a same-sequence mask: the scores and probabilities cost
        # sum(len_i^2) / cp instead of t^2 / cp (a pack of many short sequences would
        # otherwise spend most of its memory and FLOPs on masked-out blocks), and each
        # block is exactly the unpacked computation of that sequence.
        outputs = []
        for start, length in zip(bounds[:-1], lengths, strict=True):
            if length == 0:
                continue
            local_start, local_length = start // cp_size, length // cp_size
            q_positions = cp_positions(length, cp_rank, cp_size).to(query.device)
            mask = self._mask(None, mask_type, q_positions, length)
            outputs.append(
                self._attend(
                    query[local_start : local_start + local_length].unsqueeze(1),
                    key[start : start + length].unsqueeze(1),
                    value[start : start + length].unsqueeze(1),
                    mask,
                ).squeeze(1)
            )
        if not outputs:
            return query.new_zeros(0, self.hidden_size_per_partition)
        return torch.cat(outputs, dim=0)
