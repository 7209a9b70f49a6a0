"""Estimated time of one training step and one logprob pass of a recipe, with its MFU.

Pure arithmetic (no torch). An estimate, not a measurement; its basis:

* Compute is a roofline on the card's datasheet figures (roofline.py): every op costs
  max(flops / peak, bytes / HBM bandwidth), summed over ops. Kernels at peak is
  optimistic: cuBLAS reached ~70 % of it on the lent H200 (``MEASURED_GEMM_SHARE``);
  ``Assumptions.peak_share`` prices a lower rate, and dapo-plan prints both.
* Communication is priced on named bus bandwidths (roofline.Link: NVLink inside a node,
  InfiniBand between nodes) and adds to compute: no overlap, as the trainer runs
  (megatron/optimizer.py sets ``overlap_grad_reduce=False``, no TP comm overlap; TE's
  context-parallel ring does hide its K/V exchange under attention, which is not
  credited). ``Assumptions.overlap`` states another share.
* Sequence lengths are not known before a run: every sequence is taken at the mean length
  ``prompt_fill`` x data.max_prompt_length + ``response_fill`` x max_response_length.

Compute per micro-batch comes either from an analytic count of the transformer's ops
(``_layer_forward`` and friends) or, when the tracer ran (planning/trace/op_cost.py), from
the ops it recorded on each rank role (``TracedRank``), scaled per token to the plan.

Analytic ops of one layer on one rank, n = tokens of the micro-batch on the rank (the
packed micro-batch / CP), t = TP, sp = t with sequence parallelism else 1, p = bytes per
element, q = query width, kv = query groups x head dim, f = FFN width:
  GEMMs          QKV [n, h] x [h, (q + 2kv)/t], out-projection [n, q/t] x [q/t, h], FC1
                 [n, h] x [h, 2f/t], FC2 [n, f/t] x [f/t, h]; each 2 m n k FLOPs and
                 (m k + k n + m n) p bytes forward; backward is two GEMMs of the same size
                 (data and weight gradients)
  attention      causal, packed (THD): a sequence of length s costs, per head of size d,
                 QK^T s^2 d + PV s^2 d FLOPs (half of 2 s^2 d each: flash skips the masked
                 upper triangle), so 2 s^2 q / t for the rank's heads, i.e. 2 s q / t per
                 token. Packing does not mix sequences (cu_seqlens), so a packed
                 micro-batch of n tokens costs 2 n s q / t where s is the token-weighted
                 mean sequence length sum(s_i^2) / sum(s_i), not the pack's length; CP
                 gives each rank 1/CP of every sequence's queries against all its keys:
                 2 (n / CP) s q / t. Backward: 2.5x the forward (flash recomputes QK^T:
                 five products against two)
  elementwise    norms, RoPE, residual adds, SwiGLU (fused): bytes read + written only
MoE (every layer sparse, balanced routing): the router [n/sp, h] x [h, E] and E/EP expert
GEMMs per rank, each on n k EP / E routed tokens (a rank's experts see n k copies).
Last stage: the fused logprob head [n, h] x [h, V/t] (logits never written to HBM). Full
recompute adds one forward of the layers, selective one of the attention core.

Communication per micro-batch (S: the bytes of one full [n, h] activation):
  TP   sequence parallel: 2 all-gathers + 2 reduce-scatters of S per layer forward, the
       same in backward, (t - 1)/t S each; without SP 2 all-reduces, twice that; plus the
       embedding's and the head's; MoE: the routed tokens' (k S) TP gather and scatter
  CP   ring K/V exchange: (CP - 1) chunks of n 2kv/t p per layer forward, twice backward
  EP   all-to-all dispatch and combine of n k / sp tokens, (EP - 1)/EP of them leave
  PP   one activation [n/sp, h] received per micro-batch forward and one gradient
       backward; 1F1B: (m + PP - 1) micro-batch slots for m micro-batches, a bubble of
       (PP - 1)/(m + PP - 1)
Per optimizer step: DP reduce-scatter of the fp32 grad buffer and all-gather of the bf16
params (distributed optimizer; all-reduce without it), dense over DP x CP, experts over
DP x CP / EP; the optimizer's own memory traffic. A group whose ranks fit one node (ranks
ordered tp-cp-ep-dp-pp, placed by node) runs on NVLink, else on InfiniBand.
Refit: every engine GPU receives the whole model at its engine TP in bf16.

MFU: model FLOPs = 6 x N x tokens + attention 3 x 2 s q x layers x tokens (forward +
backward, causal; N: the parameters that multiply, i.e. without the input embedding, and
a MoE's active ones) over step time x peak x policy GPUs. Recompute is not model FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dapo_megatron.config.model_arch import ModelArch, padded_vocab_size
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.planning.memory_terms import rank_params
from dapo_megatron.planning.roofline import Card, Link, OpCosts


@dataclass(frozen=True)
class Assumptions:
    """What the estimate cannot know before a run, stated."""

    response_fill: float = 0.5
    """Mean response length as a share of generation.max_response_length. DAPO's responses
    grow over training and are truncated at the cap; half of it is a mid-run guess."""
    prompt_fill: float = 0.5
    """Mean prompt length as a share of data.max_prompt_length (the prompts' cap)."""
    overlap: float = 0.0
    """Share of the communication hidden under compute (0: none, as the trainer runs)."""
    peak_share: float = 1.0
    """Share of the datasheet FLOP/s the kernels reach (1: at peak, optimistic). MFU
    stays on the datasheet peak."""


MEASURED_GEMM_SHARE = 0.70
"""The one GEMM rate measured on a lent GPU: cuBLAS at ~690 of the H200's 989 TFLOP/s on
the logprob head's [16384, 4096] x [4096, 151936] bf16 GEMM (bench/results/README.md,
gpu_check_h200.json). dapo-plan prints the estimate at this share next to the at-peak one."""


DEFAULT_ASSUMPTIONS = Assumptions()
"""What dapo-plan prints with."""


@dataclass(frozen=True)
class StepInputs:
    """What the step-time model reads, resolved once from a run plan (step_time_summary.py)."""

    arch: ModelArch
    """Policy architecture."""
    dims: ParallelDims
    """Policy layout."""
    precision_bytes: int
    """Bytes of a weight/activation element (2 for bf16)."""
    recompute: str
    """none | selective | full."""
    distributed_optimizer: bool
    """Grads reduce-scattered and params all-gathered over DP; else grads all-reduced."""
    gpus_per_node: int
    """GPUs per node (which groups stay on NVLink)."""
    num_nodes: int
    """Nodes of the cluster."""
    mean_seq_len: float
    """Mean tokens per sample, prompt + response (``Assumptions``)."""
    train_rows: int
    """Samples per optimizer step (policy.train_global_batch_size)."""
    optimizer_steps: int
    """Optimizer steps per DAPO step (summary.step_plan)."""
    step_rows: int
    """Samples per DAPO step (the logprob pass runs over all of them)."""
    packed_tokens: int | None
    """policy.max_tokens_per_microbatch (train and logprob micro-batches); None: padded."""
    micro_batch_size: int
    """Samples per unpacked training micro-batch."""
    logprob_micro_batch_size: int
    """Samples per unpacked logprob micro-batch."""
    logprob_passes: int
    """Forward-only passes over the step's samples: old logprobs (several mini-batches, or
    policy.old_logprob_pass always) plus a KL reference's (dapo.loss.kl_coef > 0)."""
    engine_tp: int
    """Tensor parallel size of a generation engine (the refit's shard)."""
    colocated: bool
    """Engines share the policy's GPUs."""
    adam: bool = True
    """Adam (two fp32 states) rather than SGD (one)."""


@dataclass(frozen=True)
class TracedRank:
    """Ops the tracer recorded on one rank role (trace/op_cost.py ``OpCostMode``), at the
    plan's shapes. Communication ops are not in them (modelled here)."""

    stage: int
    """Pipeline stage of the rank."""
    forward_backward: OpCosts
    """The pipeline schedule's forward-backward over the traced micro-batches (recompute
    included), scaled per token to the plan's micro-batches: the traced packs' sequence
    lengths set the attention share (a pack of one full-length row costs more attention
    per token than the plan's mean-length rows)."""
    train_tokens: int
    """Packed tokens of those micro-batches, summed, before the CP split."""
    optimizer: OpCosts | None
    """One optimizer step (grad norm, clip, update, param copies), once per optimizer
    step; None when ``forward_backward`` holds it (a whole ``train_step`` traced as one:
    it is then scaled per token with the rest, a small over-count)."""
    logprob: OpCosts
    """The forward-only logprob pass over the traced micro-batches."""
    logprob_tokens: int
    """Packed tokens of those micro-batches, summed, before the CP split."""

    def to_json(self) -> dict[str, Any]:
        """A JSON object (the trace process hands its result back as JSON)."""
        return {
            "stage": self.stage,
            "forward_backward": self.forward_backward.to_rows(),
            "train_tokens": self.train_tokens,
            "optimizer": None if self.optimizer is None else self.optimizer.to_rows(),
            "logprob": self.logprob.to_rows(),
            "logprob_tokens": self.logprob_tokens,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TracedRank:
        """The inverse of ``to_json``."""
        opt = d["optimizer"]
        return cls(
            stage=int(d["stage"]),
            forward_backward=OpCosts.from_rows(d["forward_backward"]),
            train_tokens=int(d["train_tokens"]),
            optimizer=None if opt is None else OpCosts.from_rows(opt),
            logprob=OpCosts.from_rows(d["logprob"]),
            logprob_tokens=int(d["logprob_tokens"]),
        )


@dataclass(frozen=True)
class StepTime:
    """The estimate of one recipe on one card."""

    card: Card
    """The card priced."""
    basis: str
    """"analytic" (op counts from the architecture) or "traced" (ops from the tracer)."""
    micro_batches: int
    """Training micro-batches per DP rank per optimizer step."""
    micro_batch_tokens: float
    """Mean tokens of one training micro-batch, before the CP split."""
    compute_s: float
    """Forward + backward compute of one optimizer step on the slowest stage, bubble
    included (s)."""
    comm_s: dict[str, float]
    """Communication per optimizer step by kind (tp, cp, ep, pp, dp), bubble included on
    the per-micro-batch kinds, before the overlap share (s)."""
    bubble: float
    """1F1B pipeline bubble share (PP - 1)/(m + PP - 1)."""
    optimizer_s: float
    """The optimizer step's own compute (s)."""
    train_step_s: float
    """One optimizer step, i.e. one mini-batch (s)."""
    train_s: float
    """The DAPO step's training: optimizer steps x train_step_s (s)."""
    logprob_s: float
    """One forward-only pass over the step's samples (s)."""
    logprob_passes: int
    """How many such passes a step runs."""
    refit_s: float
    """Weights to the engines once per step (s)."""
    tokens_per_s_per_gpu: float
    """Trained tokens per second per policy GPU (training only)."""
    model_flops: float
    """Model FLOPs of one optimizer step (MFU's numerator)."""
    mfu: float
    """model_flops / (train_step_s x peak x policy GPUs)."""
    extras: dict[str, float] = field(default_factory=dict)
    """Other figures for the printout (mean sequence length, ...)."""


# ---------------------------------------------------------------------------------------
# Analytic ops


def _gemm(ops: OpCosts, name: str, m: float, k: float, n: float, p: int, count: int = 1) -> None:
    """One [m, k] x [k, n] GEMM: 2 m k n FLOPs, its two inputs and its output in bytes."""
    ops.add(name, round(2 * m * k * n), round((m * k + k * n + m * n) * p), count)


def _eltwise(ops: OpCosts, name: str, read: float, write: float, p: int, count: int = 1) -> None:
    """A memory-bound op: elements read and written (its FLOPs never bind on a GPU)."""
    ops.add(name, 0, round((read + write) * p), count)


@dataclass(frozen=True)
class MicroBatch:
    """The per-rank sizes of a micro-batch."""

    n: float
    """Tokens on the rank (after CP)."""
    s: float
    """Token-weighted mean sequence length (attention span)."""


def _layer_forward(inp: StepInputs, sh: MicroBatch, ops: OpCosts, backward: bool) -> None:
    """The ops of one transformer layer forward (or backward: two GEMMs per GEMM, 2.5x the
    attention FLOPs, twice the elementwise bytes) on one rank."""
    arch, dims, p = inp.arch, inp.dims, inp.precision_bytes
    t, cp = dims.tp, dims.cp
    sp = t if dims.sequence_parallel else 1
    h, q = arch.hidden_size, arch.query_width
    kv = arch.num_query_groups * arch.head_dim
    n = sh.n
    g = 2 if backward else 1  # GEMMs per GEMM
    e = 2 if backward else 1  # elementwise traffic factor
    tag = " bwd" if backward else ""
    _eltwise(ops, "norm" + tag, e * n * h / sp, e * n * h / sp, p, 2)
    _gemm(ops, "qkv" + tag, n, h, (q + 2 * kv) / t, p, g)
    rope = n * (q + kv) / t
    # Fused RoPE over q and k; Qwen3's q/k norms are a second pass over the same elements.
    _eltwise(ops, "rope" + tag, e * rope, e * rope, p, 2 if arch.qk_layernorm else 1)
    # Flash: reads q, every K/V chunk of the sequence (CP ranks see all of them), writes o.
    attn_flops = 2 * n * sh.s * q / t * (2.5 if backward else 1.0)
    attn_bytes = (2 * n * q + 2 * n * kv * cp) / t * p * e
    ops.add("attention" + tag, round(attn_flops), round(attn_bytes))
    _gemm(ops, "out_proj" + tag, n, q / t, h, p, g)
    _eltwise(ops, "residual" + tag, e * 2 * n * h / sp, e * n * h / sp, p, 2)
    moe = arch.moe
    if moe is None:
        f = arch.ffn_hidden_size
        _gemm(ops, "fc1" + tag, n, h, 2 * f / t, p, g)
        _eltwise(ops, "swiglu" + tag, e * n * 2 * f / t, e * n * f / t, p)
        _gemm(ops, "fc2" + tag, n, f / t, h, p, g)
        return
    k, big_f, local = moe.experts_per_token, moe.moe_ffn_hidden_size, moe.num_experts // dims.ep
    _gemm(ops, "router" + tag, n / sp, h, moe.num_experts, p, g)
    routed = n * k
    per_expert = routed / local  # balanced routing
    _eltwise(ops, "permute" + tag, e * 2 * routed * h, e * 2 * routed * h, p)
    _gemm(ops, "expert_fc1" + tag, per_expert, h, 2 * big_f / t, p, g * local)
    _eltwise(ops, "swiglu" + tag, e * routed * 2 * big_f / t, e * routed * big_f / t, p)
    _gemm(ops, "expert_fc2" + tag, per_expert, big_f / t, h, p, g * local)


def _ends(inp: StepInputs, sh: MicroBatch, stage: int, ops: OpCosts, backward: bool) -> None:
    """The embedding (first stage) and the fused logprob head (last stage)."""
    arch, dims, p = inp.arch, inp.dims, inp.precision_bytes
    h, n, t = arch.hidden_size, sh.n, dims.tp
    tag = " bwd" if backward else ""
    if stage == 0:
        _eltwise(ops, "embedding" + tag, n * h, n * h, p)
    if stage == dims.pp - 1:
        v = padded_vocab_size(arch.vocab_size, t) / t
        # The fused head never writes the [n, V/t] logits: inputs and weight only.
        ops.add(
            "logprob_head" + tag,
            round(2 * n * h * v * (2 if backward else 1)),
            round((n * h + v * h) * p * (2 if backward else 1)),
        )


def stage_ops(inp: StepInputs, sh: MicroBatch, stage: int, *, train: bool) -> OpCosts:
    """Compute ops of one micro-batch on one rank of `stage`: forward (+ recompute +
    backward when `train`)."""
    layers = inp.arch.num_layers // inp.dims.pp
    layer, ops = OpCosts(), OpCosts()
    _layer_forward(inp, sh, layer, backward=False)
    if train:
        if inp.recompute == "full":
            _layer_forward(inp, sh, layer, backward=False)
        elif inp.recompute == "selective":
            layer.extend(OpCosts({k: c for k, c in layer.counts.items() if k[0] == "attention"}))
        _layer_forward(inp, sh, layer, backward=True)
    ops.extend(layer, layers)
    _ends(inp, sh, stage, ops, backward=False)
    if train:
        _ends(inp, sh, stage, ops, backward=True)
    return ops


def optimizer_ops(inp: StepInputs, stage: int) -> OpCosts:
    """The optimizer step's memory traffic on one rank of `stage`: Adam reads grad, master,
    exp_avg, exp_avg_sq (fp32) and writes the last three and the bf16 param, over its
    distributed-optimizer shard; the grad norm reads the shard's grads; the grad buffer
    (not sharded) is zeroed."""
    dims = inp.dims
    split = rank_params(inp.arch, dims.tp, dims.pp, stage, ep=dims.ep)
    dense, experts = split.total - split.experts, split.experts
    shard = (
        dense / (dims.dp * dims.cp) + experts / (dims.dp * dims.cp // dims.ep)
        if inp.distributed_optimizer
        else float(split.total)
    )
    states = 2 if inp.adam else 1
    ops = OpCosts()
    ops.add("optimizer update", 0, round(shard * ((2 + states) * 4 + (1 + states) * 4 + 2)))
    ops.add("grad norm", 0, round(shard * 4))
    ops.add("zero grad buffer", 0, round(split.total * 4))
    return ops


# ---------------------------------------------------------------------------------------
# Communication


def _link(card: Card, inp: StepInputs, span: int) -> Link:
    """NVLink when a group's consecutive ranks fit one node, else InfiniBand."""
    return card.intra_node if span <= inp.gpus_per_node else card.inter_node


def _ring(size: float, group: int, link: Link) -> float:
    """A ring all-gather or reduce-scatter of `size` bytes (the whole tensor) over `group`."""
    return size * (group - 1) / group / link.bus_bytes_per_s if group > 1 else 0.0


def micro_batch_comm(
    inp: StepInputs, sh: MicroBatch, card: Card, *, train: bool
) -> dict[str, float]:
    """Seconds of TP, CP, EP and PP communication of one micro-batch on one rank."""
    arch, dims, p = inp.arch, inp.dims, inp.precision_bytes
    t, cp, ep = dims.tp, dims.cp, dims.ep
    sp = t if dims.sequence_parallel else 1
    layers = arch.num_layers // dims.pp
    n, h = sh.n, arch.hidden_size
    kv = arch.num_query_groups * arch.head_dim
    # Forward passes the layers run: 1, a full recompute's second one, and backward's
    # collectives (the transposes of the forward ones, same sizes).
    fwd = 1 + (1 if train and inp.recompute == "full" else 0)
    passes = fwd + (1 if train else 0)
    # One ring all-gather or reduce-scatter of an [n, h] activation. With SP a layer runs
    # two of each per pass; without SP two all-reduces (twice the bytes each), the same.
    unit = _ring(n * h * p, t, _link(card, inp, t))
    k = arch.moe.experts_per_token if arch.moe is not None else 0
    per_layer_tp = 2 * unit + (2 * k * unit if k else 2 * unit)
    # The embedding's reduce-scatter (first stage) and the head's all-gather (last), and
    # their transposes backward; a single stage has both ends.
    ends = 2 if dims.pp == 1 else 1
    tp = passes * layers * per_layer_tp + ends * (2 if train else 1) * unit
    kv_chunk = n * 2 * kv / t * p
    cp_link = _link(card, inp, t * cp)
    cp_s = (cp - 1) * kv_chunk / cp_link.bus_bytes_per_s * layers * (fwd + (2 if train else 0))
    ep_s = 0.0
    if k and ep > 1:
        routed = n * k / sp * h * p
        a2a = 2 * routed * (ep - 1) / ep / _link(card, inp, t * ep).bus_bytes_per_s
        ep_s = a2a * layers * passes
    pp_s = 0.0
    if dims.pp > 1:
        pp_link = _link(card, inp, dims.world_size)
        pp_s = (2 if train else 1) * (n / sp * h * p) / pp_link.bus_bytes_per_s
    return {"tp": tp, "cp": cp_s, "ep": ep_s, "pp": pp_s}


def dp_comm_s(inp: StepInputs, stage: int, card: Card) -> float:
    """Seconds of the DP gradient reduction and parameter gather of one optimizer step."""
    dims = inp.dims
    split = rank_params(inp.arch, dims.tp, dims.pp, stage, ep=dims.ep)
    link = _link(card, inp, dims.world_size // dims.pp)
    total = 0.0
    for elems, group in (
        (split.total - split.experts, dims.dp * dims.cp),
        (split.experts, dims.dp * dims.cp // dims.ep),
    ):
        if inp.distributed_optimizer:
            # fp32 grads reduce-scattered (grad_reduce_in_fp32), bf16 params all-gathered.
            total += _ring(elems * 4, group, link) + _ring(elems * inp.precision_bytes, group, link)
        else:
            total += 2 * _ring(elems * 4, group, link)
    return total


def refit_s(inp: StepInputs, card: Card) -> float:
    """Seconds to hand the whole model (bf16) to the engines: each engine GPU receives its
    engine-TP share (a MoE engine holds every expert). NVLink on one node, or colocated
    with the policy's model-parallel group inside a node; else InfiniBand; a copy in HBM
    when policy and engine each hold the whole model on one shared GPU."""
    d = inp.dims
    nbytes = inp.arch.num_parameters() * 2 / inp.engine_tp
    if inp.colocated and d.model_parallel_size == 1 and inp.engine_tp == 1:
        # The whole model on each GPU, its engine beside it: a copy in HBM (read + write).
        return 2 * nbytes / card.hbm_bytes_per_s
    within = inp.num_nodes == 1 or (inp.colocated and d.model_parallel_size <= inp.gpus_per_node)
    link = card.intra_node if within else card.inter_node
    return nbytes / link.bus_bytes_per_s


# ---------------------------------------------------------------------------------------
# Model FLOPs and the step


def model_flops_per_token(arch: ModelArch, mean_seq_len: float) -> float:
    """Forward + backward model FLOPs per trained token: 6 N plus causal attention
    3 x 2 s q per layer (module docstring); N without the input embedding (a lookup), with
    a MoE's active experts only."""
    h = arch.hidden_size
    n = arch.num_parameters()
    if not arch.tie_word_embeddings:
        n -= arch.vocab_size * h  # the input embedding; a tied one is the head's weight
    moe = arch.moe
    if moe is not None:
        inactive = moe.num_experts - moe.experts_per_token
        n -= arch.num_layers * inactive * 3 * h * moe.moe_ffn_hidden_size
    attention = 6 * mean_seq_len * arch.query_width * arch.num_layers
    return 6 * n + attention


def _micro_batches(inp: StepInputs, rows: int, mbs: int) -> tuple[int, float]:
    """(micro-batches per DP rank, mean tokens of one before the CP split) for `rows`
    samples; packed micro-batches are assumed full to the mean (perfect packing)."""
    per_rank = rows / inp.dims.dp
    tokens = per_rank * inp.mean_seq_len
    if inp.packed_tokens is not None:
        m = max(1, math.ceil(tokens / inp.packed_tokens))
        return m, tokens / m
    m = max(1, math.ceil(per_rank / mbs))
    return m, tokens / m


def _per_token(costs: OpCosts, tokens: int, card: Card) -> float:
    return costs.roofline_s(card) / max(1, tokens)


def estimate(
    inp: StepInputs,
    card: Card,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    traced: Sequence[TracedRank] = (),
) -> StepTime:
    """The step-time estimate of a run on `card` (module docstring); compute from `traced`
    ranks when given (one per rank role; the slowest stage counts), else analytic."""
    dims = inp.dims
    datasheet = card
    card = replace(card, peak_flops=card.peak_flops * assumptions.peak_share)
    m, mb_tokens = _micro_batches(inp, inp.train_rows, inp.micro_batch_size)
    lm, lp_tokens = _micro_batches(inp, inp.step_rows, inp.logprob_micro_batch_size)
    s = inp.mean_seq_len
    train_sh, lp_sh = MicroBatch(mb_tokens / dims.cp, s), MicroBatch(lp_tokens / dims.cp, s)
    stages = range(dims.pp)
    if traced:
        mb_compute = max(_per_token(r.forward_backward, r.train_tokens, card) for r in traced)
        mb_compute *= mb_tokens
        lp_compute = max(_per_token(r.logprob, r.logprob_tokens, card) for r in traced)
        lp_compute *= lp_tokens
        opt = max(r.optimizer.roofline_s(card) if r.optimizer else 0.0 for r in traced)
    else:
        mb_compute = max(stage_ops(inp, train_sh, k, train=True).roofline_s(card) for k in stages)
        lp_compute = max(stage_ops(inp, lp_sh, k, train=False).roofline_s(card) for k in stages)
        opt = max(optimizer_ops(inp, k).roofline_s(card) for k in stages)
    slots, lp_slots = m + dims.pp - 1, lm + dims.pp - 1
    hidden = 1.0 - assumptions.overlap
    comm = {
        kind: v * slots for kind, v in micro_batch_comm(inp, train_sh, card, train=True).items()
    }
    comm["dp"] = max(dp_comm_s(inp, k, card) for k in stages)
    compute = mb_compute * slots
    step = compute + opt + hidden * sum(comm.values())
    lp_comm = sum(micro_batch_comm(inp, lp_sh, card, train=False).values()) * lp_slots
    logprob = lp_compute * lp_slots + hidden * lp_comm
    tokens = inp.train_rows * inp.mean_seq_len
    flops = model_flops_per_token(inp.arch, s) * tokens
    world = dims.world_size
    return StepTime(
        card=datasheet,
        basis="traced" if traced else "analytic",
        micro_batches=m,
        micro_batch_tokens=mb_tokens,
        compute_s=compute,
        comm_s=comm,
        bubble=(dims.pp - 1) / slots,
        optimizer_s=opt,
        train_step_s=step,
        train_s=step * inp.optimizer_steps,
        logprob_s=logprob,
        logprob_passes=inp.logprob_passes,
        refit_s=refit_s(inp, card),
        tokens_per_s_per_gpu=tokens / step / world,
        model_flops=flops,
        mfu=flops / (step * datasheet.peak_flops * world),
        extras={"mean_seq_len": s},
    )
