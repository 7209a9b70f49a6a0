"""Refit terms of the memory plan: the bucket buffers of one weight refit, per GPU.

Pure arithmetic (no torch), used by ``planning/memory.py``. What the code allocates (refit/):

The bucket layout (``buckets.plan_buckets`` builds it) packs the FULL HF tensors (TP shards
gathered) in the engine's dtype, the training precision, into buckets of
``generation.refit_bucket_mb``; a larger tensor travels alone in a bucket of its own size.
Every bucket buffer is sized to the layout's largest bucket, so one buffer holds
B = max(bucket bytes, largest HF tensor bytes), both rounded up to ``ALIGN_BYTES``.

Sending side (policy ranks, on their GPU):
  broadcast  rank 0 (pipeline stage 0) allocates ONE staging buffer for the refit
             (``stream.send_buckets``) and collects the exported tensors of a bucket
             before packing them: 2 B during the refit. The other ranks only take part in
             the export's gathers and drop each full tensor.
  ipc        ranks below min(policy ranks, engine workers) allocate a shareable buffer
             (``PolicyWorker.share_buffer``) when the weight group forms and keep it until
             shutdown: B in EVERY phase, train included. During the refit every rank
             also collects a bucket's exported tensors (``handles.send_shared``): B more.
  export     on every rank, the exporter (``megatron/hf_weights.export_hf_weights``)
             gathers one Megatron parameter whole (TP shards concatenated) and splits a
             fused one into its HF tensors: q/k/v out of linear_qkv and gate/up out of
             linear_fc1 are copies when the split is strided (several query groups, TP >
             1), and a row-parallel gather holds the shards and their concatenation. So
             the export holds up to 2 F at once, F the largest gathered parameter (the
             padded vocabulary rows, fc1's 2 ffn x h or qkv's (heads + 2 groups) x
             head_dim x h; MoE: one expert's fc1, 2 F_moe x h, or the router, E x h).
             A MoE's experts stream after the other tensors, one local expert slot of one
             layer at a time (``megatron/hf_experts.export_experts``): every rank gathers
             its expert over TP and the slot's EP experts over EP, so it holds
             X = (EP + 2) x 3 F_moe h at once (EP experts' fc1 and fc2, its own expert
             gathered, and the fc2 shards and gate/up copies of one expert); no rank
             holds all experts, and X replaces F where it is larger.
             A rank that collects a bucket holds B (the bucket's HF tensors, counting the
             split copies) plus F (the gathered parameter they were cut from); the others
             hold 2 F.
Receiving side (each engine worker: every TP rank receives the full buckets):
  broadcast  the bucket being loaded plus the next one already posted
             (``stream.receive_buckets``): 2 B.
  ipc        its own copy of the bucket out of the mapped buffer (``handles.
             receive_shared``): B; the mapped buffer is the exporter's memory.
vLLM's layerwise reload may keep a bucket's views until their layer is complete; that is
bounded by vLLM, not by this code, and is not counted. object_store moves the model
through host memory (no bucket) and colocated Megatron generation shares the policy's
weights (no refit): both have no refit terms.
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo_megatron.config.model_arch import ModelArch, padded_vocab_size
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.refit_transport import RefitTransport

MIB = 2**20
ALIGN_BYTES = 64
"""refit/buckets.py's ALIGN_BYTES (that module imports torch): slots and buckets end
on multiples of it."""


@dataclass(frozen=True)
class RefitInputs:
    """What the refit terms need from generation.* and the run plan."""

    transport: RefitTransport
    """generation.refit_transport, auto resolved: a collective one (object_store has no
    buckets); its traits decide the terms below."""
    bucket_bytes: int
    """generation.refit_bucket_mb in bytes, as the controller computes it."""
    exporters: int
    """Policy ranks 0..exporters-1 own a bucket buffer: 1 for broadcast, min(policy ranks,
    engine workers) for ipc."""
    engine_asleep: bool
    """The engine's KV cache is released while it receives: the synchronous loop sleeps
    it (level 2) after generating and wakes only its weights for the refit. False when it
    keeps generating (rollout.max_staleness >= 1) or is a Megatron engine. A CPU plan models
    the same schedule (vLLM has no sleep mode there, but its numbers are informative only,
    as for the colocated "sleeping engine" term)."""


def _align(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


def _mlp_rows(arch: ModelArch) -> tuple[int, int]:
    """(rows of one gate/up/down tensor, rows of the router) of a layer's MLP: the dense
    SwiGLU's ffn and no router, or one expert's F_moe and the router's E."""
    if arch.moe is None:
        return arch.ffn_hidden_size, 0
    return arch.moe.moe_ffn_hidden_size, arch.moe.num_experts


def largest_hf_tensor(arch: ModelArch) -> int:
    """Elements of the largest exported HF tensor: embedding / lm_head (vocab x h, padding
    removed), gate / up / down (ffn x h; MoE: one expert's F_moe x h), the router (E x h)
    or q / o (query_width x h)."""
    ffn, router = _mlp_rows(arch)
    return arch.hidden_size * max(arch.vocab_size, ffn, router, arch.query_width)


def largest_gathered_parameter(arch: ModelArch, tp: int) -> int:
    """Elements of the largest Megatron parameter the export gathers whole (F): the
    embedding or output layer (the vocabulary padded for ``tp``), fc1 (gate and up,
    2 ffn x h; MoE: one expert's 2 F_moe x h), the router (E x h) or qkv ((heads + 2
    query groups) x head_dim x h)."""
    ffn, router = _mlp_rows(arch)
    qkv = (arch.num_attention_heads + 2 * arch.num_query_groups) * arch.head_dim
    return arch.hidden_size * max(padded_vocab_size(arch.vocab_size, tp), 2 * ffn, router, qkv)


def bucket_buffer_bytes(refit: RefitInputs, arch: ModelArch, precision_bytes: int) -> int:
    """B: the size of every bucket buffer (the layout's largest bucket, an upper bound)."""
    return max(_align(refit.bucket_bytes), _align(largest_hf_tensor(arch) * precision_bytes))


def has_exporter(refit: RefitInputs, dims: ParallelDims, stage: int) -> bool:
    """Whether a rank of pipeline ``stage`` owns a bucket buffer: Megatron orders ranks
    tp-cp-dp-pp, so stage k holds ranks [k w/pp, (k + 1) w/pp)."""
    return stage * (dims.world_size // dims.pp) < refit.exporters


@dataclass(frozen=True)
class RefitStage:
    """Refit bytes of the worst policy rank of one pipeline stage."""

    buffer: int
    """ipc: the shared bucket buffer kept between refits (every phase)."""
    staging: int
    """broadcast: the exporter's staging buffer (refit phase)."""
    export: int
    """Export memory held at once (refit phase): a bucket's HF tensors plus the gathered
    parameter being split on a rank that collects buckets, else twice that parameter."""


def expert_export_elements(arch: ModelArch, ep: int) -> int:
    """X: elements an expert slot's export holds at once on a rank, (EP + 2) x 3 F_moe h
    (module docstring); 0 for a dense model."""
    if arch.moe is None:
        return 0
    return (ep + 2) * 3 * arch.moe.moe_ffn_hidden_size * arch.hidden_size


def export_only_bytes(arch: ModelArch, dims: ParallelDims, precision_bytes: int) -> int:
    """What the export holds at once on a rank that collects no bucket (module docstring):
    a vocabulary tensor gathered whole, F_vocab (its padding rows are cut off by a view),
    twice a fused parameter (qkv, fc1: the gathered tensor and its split copies), or X.
    The memory tracer (dapo-plan --trace, phase "export") measured the first: 2 F_vocab
    over-counted Qwen3-0.6B TP2's export by 0.29 GiB."""
    ffn, router = _mlp_rows(arch)
    qkv = (arch.num_attention_heads + 2 * arch.num_query_groups) * arch.head_dim
    vocab = padded_vocab_size(arch.vocab_size, dims.tp) * arch.hidden_size
    fused = max(2 * ffn, router, qkv) * arch.hidden_size
    experts = expert_export_elements(arch, dims.ep)
    return max(vocab, 2 * fused, experts) * precision_bytes


def refit_stage(
    refit: RefitInputs | None,
    arch: ModelArch,
    dims: ParallelDims,
    precision_bytes: int,
    stage: int,
) -> RefitStage:
    """The sending side's bytes on pipeline ``stage`` (module docstring); zero without refit."""
    if refit is None:
        return RefitStage(0, 0, 0)
    b = bucket_buffer_bytes(refit, arch, precision_bytes)
    exporter = has_exporter(refit, dims, stage)
    gathered = largest_gathered_parameter(arch, dims.tp) * precision_bytes
    experts = expert_export_elements(arch, dims.ep) * precision_bytes
    if refit.transport.shared_buffer:
        # Every rank collects each bucket's tensors, with or without a buffer to pack into.
        return RefitStage(buffer=b if exporter else 0, staging=0, export=b + max(gathered, experts))
    return RefitStage(
        buffer=0,
        staging=b if exporter else 0,
        export=b + max(gathered, experts)
        if exporter
        else export_only_bytes(arch, dims, precision_bytes),
    )


def refit_receive_bytes(refit: RefitInputs, arch: ModelArch, precision_bytes: int) -> int:
    """Receive buffers alive at once on one engine GPU during a refit (module docstring)."""
    return refit.transport.receive_buffers * bucket_buffer_bytes(refit, arch, precision_bytes)
