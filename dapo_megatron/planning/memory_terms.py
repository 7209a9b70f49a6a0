"""Per-rank memory terms of a DAPO run: the tensor formulas of dapo-plan's memory model.

Pure arithmetic on the architecture, the parallel layout and the batch sizes (no torch).
Every term is computed for one policy rank of each pipeline stage; the worst stage counts.

Policy states (Megatron-Core, as ``megatron/optimizer.py`` configures it):
  weights      params x precision bytes (in Megatron DDP's param buffer; no second copy)
  master       params x 4 / shard: the fp32 main params of the mixed-precision optimizer
               (none for fp32, where the params are the main params)
  grads        params x 4: DDP's contiguous grad buffer is fp32 (``grad_reduce_in_fp32``)
               and is NOT sharded by the distributed optimizer (it reduce-scatters in place)
  optimizer    params x 8 (Adam exp_avg + exp_avg_sq, fp32) or x 4 (SGD momentum) / shard
  shard        1 without the distributed optimizer; with it, the data-parallel group of the
               parameter's DDP buffer (Megatron 0.16 ``DistributedDataParallel``): dense
               params shard over DP x CP (``intra_dp_cp_group``), expert params live in a
               separate buffer sharded over the expert data-parallel group of DP x CP / EP
               ranks (``intra_expt_dp_group``: expert TP = TP, so world / (TP x EP x PP))
  KL reference params x precision bytes when dapo.loss.kl_coef > 0: megatron/policy.py
               keeps a frozen GPTModel of the rank's own TP/PP shard (same build_model,
               same dtype, on the policy's GPU, no DDP/grads/optimizer), replicated over
               DP and never offloaded, so it is resident in every phase
  refit buffer the ipc transport's shared bucket buffer, kept between refits
               (refit_memory.py); resident in every phase on the exporting ranks
Per-rank params are the real Megatron split: each layer's GEMMs (and the q/k/v bias) are
1/TP shards, with q of width ``query_width`` = heads x head_dim (the hidden size except for
Qwen3, whose head_dim is explicit): linear_qkv (q + 2 kv)/TP x h, linear_proj h x q/TP;
its two RMSNorm weights, Qwen3's q/k norms (head_dim each, shared over heads) and a MoE
router (E x h) are whole on every TP rank; the embedding sits on the first stage and the
output layer on the last (a tied embedding is a second copy on the last stage when PP >
1), both with ``padded_vocab_size`` rows (a multiple of 128 x TP).
MoE (Qwen3-MoE, every layer sparse, expert TP = TP): a rank holds E/EP experts of each of
its stage's layers, each 3 x h x F/TP (gate, up, down; F = moe_ffn_hidden_size), and no
dense MLP; the router is a dense parameter (replicated over TP and EP).

Activations of one micro-batch (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", per-layer accounting redone for this architecture: RMSNorm,
SwiGLU, grouped-query attention, no dropout). With n = micro_batch x seq_len / CP tokens on
a rank, t = TP, sp = t with sequence parallelism else 1, p = precision bytes, one layer
saves, in bytes (q = query_width, kv = query groups x head_dim):
  none       n p (4h/sp + (2q + 2kv)/t + qkn) + mlp + core
               4h/sp: inputs of both norms and of the QKV and FC1 (or router) GEMMs
               (2q + 2kv)/t: q, k, v and the attention output (the out-projection's input)
               qkn: (q + kv)/t, the inputs of Qwen3's q/k norms (0 without them)
               mlp, dense: n p 3f/t: SwiGLU input [gate; up] and its output (FC2's input)
               mlp, MoE: n p k (h + 3F/t) + n 4 (E/sp + k): each token goes to its top-k
                 experts (balanced routing, no capacity factor: a hot expert takes more),
                 so a rank's experts see n k routed copies (the alltoall dispatcher
                 gathers them over the expert-TP group; allgather's share is the same):
                 the permuted tokens, FC1's input [n k, h], FC1's output [n k, 2F/t] and
                 the weighted SwiGLU's output [n k, F/t]; fp32 router scores [n/sp, E]
                 and the permuted probabilities [n k] the SwiGLU weights by
               dispatch (MoE, one layer at a time, not saved): (6 + 2/t) n k h p of
                 routed copies in flight (moe_dispatch_bytes), in the backward working
                 set and the logprob pass
               core: flash attention keeps only its fp32 log-sum-exp, n 4 a/t; unfused
               attention (CPU) keeps the softmax, n p (a/t) s  (Korthikanti's 5as/h term)
  selective  none minus core (Megatron recomputes the core attention)
  full       n p h/sp: only the layer input; the layer is recomputed during its backward
A backward pass also holds one layer's worth of "none" activations (its gradients, or the
recomputed layer under full recompute), and on a first stage with other micro-batches in
flight the embedding's dense weight gradient, V/t x h x p (added to the fp32 buffer by DDP's
hook, then freed). Under 1F1B, stage k keeps min(PP - k, M) micro-
batches in flight (M: micro-batches per mini-batch), so the first stage holds PP of them.

Logits (last stage; the trainer never materialises them, see kernels/):
  naive      n x V/t x (p + 4 + 4): the output GEMM's logits, their fp32 copy kept by
             log-softmax, and the fp32 gradient of the same shape
  fused      saved: the TP-gathered hidden states n h p + five O(n) fp32 vectors; backward:
             dH and dW in fp32 plus their casts, n h (4 + p) + V/t h (4 + p); the chunked
             CPU path adds two [chunk, V/t] fp32 buffers and an fp32 copy of its weight shard

Generation (vLLM): the engine takes gpu_memory_utilization x GPU memory (the capacity the
device reports, capacity.py) for its weights at
engine TP (vocab padded to 64, KV heads replicated when engine TP > KV heads; a MoE engine
holds every expert, each 3 h F/engine_tp: vLLM's FusedMoE shards the expert FFN over TP
and expert parallelism is not enabled), its profile activations and runtime, and the KV
cache (the rest). KV bytes per token per GPU = 2 x layers x kv_heads/engine_tp x head_dim x p.
The engine worker's CUDA context is not in that budget (vLLM creates it before measuring
the free memory at start): planning/memory.py counts it next to the budget.

Outside the allocator (``Overheads``, estimates with their sources in each field's
docstring): a CUDA context per process on the GPU (~0.5 GiB, torch 2.x with lazy module
loading on Hopper), NCCL buffers of a policy with peers (~1 GiB), the engine's runtime
inside its budget, what a sleeping engine keeps, and the training workspaces.

planning/memory.py adds these terms up into the peak of each phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.model_arch import ModelArch, padded_vocab_size
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.planning.capacity import default_margin_gib
from dapo_megatron.planning.refit_memory import RefitInputs, refit_stage

GIB = 2**30
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
VLLM_VOCAB_MULTIPLE = 64
"""vLLM pads the vocabulary of its embedding and LM head to a multiple of this."""
CHUNK_BYTES = 2**28
"""Budget of one [chunk, V/t] fp32 buffer of the chunked logprob path (kernels/chunked.py)."""
RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class Overheads:
    """Memory no tensor formula covers, in GiB per GPU: documented estimates.

    Most of it sits outside PyTorch's caching allocator (``torch.cuda.memory_reserved``
    never shows it, nvidia-smi does), so each is its own term of a phase rather than a
    share of the tensors: a CUDA context per process on the GPU, NCCL's buffers, and the
    engine's runtime. What lives where, and in which phase:

    ==================  =====================================  ==========================
    term                held by                                phases
    ==================  =====================================  ==========================
    policy CUDA context the policy process                     every phase
    policy NCCL         the policy process, world > 1          every phase
    engine CUDA context each engine worker process on the GPU  colocated: every phase;
                        (vLLM takes its start-up snapshot       split: on the engine GPU
                        after creating it: outside its budget)
    engine runtime      inside gpu_memory_utilization x GPU    with the engine's budget
    sleeping engine     a colocated engine while asleep        train, logprob, refit
    train workspace     the policy process while it trains     train, logprob
    ==================  =====================================  ==========================
    """

    cuda_context_gib: float = 0.5
    """CUDA context of one process on a GPU: driver state and the device code of the
    modules it loaded, outside the allocator. Estimate: ~0.5 GiB for torch 2.x on Hopper
    with lazy module loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 11.7 /
    torch 1.13: nvidia-smi shows ~0.5 GiB for a process that made one CUDA tensor; eager
    loading of torch's kernels took ~1-2 GiB), a little more once cuBLAS, Transformer Engine
    or vLLM's kernels have been loaded. Counted once for the policy process and once for
    each engine worker process on the GPU (colocated: one; the Ray actor that builds the
    ``vllm.LLM`` front end never initialises CUDA)."""
    nccl_gib: float = 1.0
    """NCCL communicator buffers of a policy process with peers (world > 1): per
    communicator, channels x NCCL_BUFFSIZE (4 MiB) per peer connection, for each of the TP,
    PP, CP, DP (and EP) groups and the refit's weight group, plus NVLink SHARP buffers on
    NVSwitch nodes; outside the allocator. Estimate (~0.2-0.5 GiB per communicator in use
    on H100 nodes); 0 on a single-GPU run, whose groups have no peer to connect to. An
    engine's own NCCL (engine TP > 1) is created after vLLM's start-up snapshot and counted
    in its budget (``engine_runtime_gib``)."""
    train_workspace_gib: float = 2.5
    """Training phase only: caching-allocator fragmentation, cuBLAS/TE workspaces, pipeline
    send/receive and DDP bucket buffers."""
    engine_runtime_gib: float = 1.0
    """Inside the engine's gpu_memory_utilization budget: what vLLM's profiling counts on
    top of weights and activations since its start-up snapshot: cuBLAS workspaces, NCCL
    for engine TP > 1, sampler buffers and CUDA-graph pools (0.5 less with
    enforce_eager). Its CUDA context is not in it (``cuda_context_gib``)."""
    sleeping_engine_gib: float = 0.5
    """Colocated training phase: what a sleeping engine keeps besides its CUDA context
    (CUDA-graph pools and buffers outside vLLM's sleep allocator):
    ``VllmGenerationBackend.sleep`` is vLLM's level 2, weights and KV cache discarded."""
    engine_profile_tokens: int = 16384
    """Tokens of vLLM's profiling forward (max_num_batched_tokens); its activation peak is
    reserved out of the KV cache budget."""


NO_OVERHEADS = Overheads(
    cuda_context_gib=0.0,
    nccl_gib=0.0,
    train_workspace_gib=0.0,
    engine_runtime_gib=0.0,
    sleeping_engine_gib=0.0,
    engine_profile_tokens=0,
)
"""Tensor terms only (hand-derived byte counts in tests)."""


@dataclass(frozen=True)
class EngineInputs:
    """What the generation estimate needs from generation.engine."""

    tensor_parallel_size: int
    """Engine TP."""
    gpu_memory_utilization: float
    """Fraction of the GPU the engine may use."""
    max_num_seqs: int
    """Concurrent sequences per engine (sizes the sampler's logits)."""
    enforce_eager: bool
    """No CUDA graphs (less runtime memory)."""


@dataclass(frozen=True)
class MemoryInputs:
    """Everything the memory model reads, extracted from a validated config."""

    arch: ModelArch
    """Policy architecture."""
    dims: ParallelDims
    """Policy layout."""
    precision: str
    """fp32 | bf16 | fp16."""
    optimizer: str
    """adam | sgd."""
    distributed_optimizer: bool
    """Shard master params and optimizer states over DP."""
    recompute: str
    """none | selective | full."""
    micro_batch_size: int
    """Samples per training micro-batch."""
    logprob_micro_batch_size: int
    """Samples per forward-only micro-batch."""
    seq_len: int
    """Tokens per sample (max_total_sequence_length)."""
    micro_batches: int
    """Training micro-batches per DP rank per mini-batch (bounds the 1F1B in-flight count)."""
    gpu_mem_gib: float
    """Memory of one device as the allocator reports it (planning/capacity.py), in GiB."""
    on_gpu: bool
    """GPU run: flash attention and the Triton logprob kernel; else unfused attention and
    the chunked kernel (CPU numbers are informative only)."""
    colocated: bool
    """Engines share the policy's devices."""
    engine: EngineInputs | None
    """vLLM engine settings; None when generation uses the Megatron backend."""
    fused_logits: bool = True
    """The trainer's fused/chunked logprob kernel; False models naive fp32 logits."""
    packed_tokens: int | None = None
    """policy.max_tokens_per_microbatch: a packed micro-batch (train and logprob pass) holds
    this many tokens, whatever the row counts; None = rows x seq_len."""
    overheads: Overheads = Overheads()
    """Constant overheads."""
    kl_reference: bool = False
    """dapo.loss.kl_coef > 0: every policy rank keeps a frozen copy of its weight shard."""
    refit: RefitInputs | None = None
    """Bucketed weight refit into separate engines; None when no bucket moves (colocated
    Megatron generation, or the object_store transport)."""
    margin_gib: float | None = None
    """Safety margin a phase keeps below gpu_mem_gib; None: capacity.default_margin_gib
    (max(5 % of the card, 2 GiB)) on a GPU, 0 on a CPU run (informative numbers)."""

    @property
    def margin(self) -> float:
        """The safety margin in GiB (``margin_gib`` or the default rule)."""
        if self.margin_gib is not None:
            return self.margin_gib
        return default_margin_gib(self.gpu_mem_gib) if self.on_gpu else 0.0


@dataclass(frozen=True)
class RankParams:
    """Parameter elements held by the policy rank at (pp_rank, tp_rank)."""

    layers: int
    """Transformer layers of the stage without their experts: 1/TP shards of GEMMs and q/k/v
    bias, whole norms (and router)."""
    experts: int
    """Expert MLP elements of the stage's layers on this rank (E/EP experts, 1/TP each; 0
    for a dense model): Megatron's expert-parallel DDP buffer, sharded over expert DP."""
    embedding: int
    """Input embedding shard (padded_vocab/TP rows), first stage only."""
    output: int
    """Output layer shard, last stage only (a tied embedding's copy when PP > 1)."""
    final_norm: int
    """Final RMSNorm, last stage only (whole on every TP rank)."""
    replicated: int
    """Elements of the total that every TP rank of the stage holds whole (the norms, q/k
    norms and router)."""
    vocab_padding: int
    """Elements in padded vocabulary rows of the embedding and an untied output layer."""
    tied_copy: int
    """Elements duplicating the first stage's embedding, padding rows included (tied
    embeddings, PP > 1)."""

    @property
    def total(self) -> int:
        return self.layers + self.experts + self.embedding + self.output + self.final_norm


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's policy rank, in GiB."""

    stage: int
    """Pipeline rank."""
    params: int
    """Parameter elements on the rank."""
    expert_params: int
    """Of ``params``: expert MLP elements (0 for a dense model)."""
    weights: float
    """Model weights in the training precision."""
    master: float
    """fp32 main params of the mixed-precision optimizer."""
    grads: float
    """fp32 grad buffer."""
    optimizer: float
    """Optimizer states."""
    reference: float
    """Frozen KL reference weights in the training precision (kl_coef > 0)."""
    refit_buffer: float
    """ipc transport: the shared bucket buffer kept between refits (exporting ranks)."""
    refit_staging: float
    """Refit phase, broadcast: the exporter's staging buffer."""
    refit_export: float
    """Refit phase: the export's tensors held at once (refit_memory.refit_stage)."""
    in_flight: int
    """Micro-batches whose activations the stage holds at once (1F1B)."""
    activations: float
    """Saved activations of the in-flight micro-batches plus one layer's backward set."""
    logits: float
    """Logprob head of the training step (last stage)."""
    logprob_pass: float
    """Transient memory of the forward-only logprob pass."""
    expert_states: tuple[float, float, float, float]
    """Of weights, master, grads and optimizer: the expert params' share (0 when dense)."""
    expert_activations: float
    """Of activations: the expert MLPs' share (routed copies, router scores; 0 when dense)."""

    @property
    def resident(self) -> float:
        """What stays on the GPU in every phase (nothing of the policy is offloaded)."""
        return (
            self.weights
            + self.master
            + self.grads
            + self.optimizer
            + self.reference
            + self.refit_buffer
        )


@dataclass(frozen=True)
class EngineMemory:
    """One GPU of a vLLM engine, in GiB unless stated."""

    budget: float
    """gpu_memory_utilization x GPU memory."""
    weights: float
    """Engine weights at engine TP."""
    expert_weights: float
    """Of weights: the experts (MoE; every expert, 1/engine TP each)."""
    overhead: float
    """Runtime, profile activations and sampler logits."""
    kv_cache: float
    """What is left of the budget for the KV cache."""
    kv_bytes_per_token: int
    """KV cache bytes of one token on one GPU."""
    kv_tokens: int
    """Tokens the KV cache holds."""
    full_sequences: int
    """Concurrent sequences of max_total_sequence_length that fit."""


def _div(n: int, d: int, what: str) -> int:
    # A ConfigError, so that dapo-plan prints one line instead of a traceback.
    if n % d:
        raise ConfigError(f"{what} = {n} is not divisible by the tensor parallel size {d}")
    return n // d


def _gib(n_bytes: float) -> float:
    return n_bytes / GIB


# ---------------------------------------------------------------------------------------
# Parameters


def layer_params(arch: ModelArch, tp: int) -> tuple[int, int]:
    """(elements sharded 1/TP on each rank, elements whole on every rank) of one layer,
    its experts left out (``layer_expert_params``)."""
    h, q, f = arch.hidden_size, arch.query_width, arch.ffn_hidden_size
    kv = arch.num_query_groups * arch.head_dim
    shard = _div(q + 2 * kv, tp, "q/k/v width") * (h + (1 if arch.add_qkv_bias else 0))
    shard += _div(q, tp, "query width") * h  # attention output projection
    whole = 2 * h  # the two RMSNorms
    if arch.qk_layernorm:
        whole += 2 * arch.head_dim  # q_layernorm, k_layernorm: one head's width each
    if arch.moe is None:
        shard += 3 * _div(f, tp, "ffn_hidden_size") * h  # gate, up, down
    else:
        whole += arch.moe.num_experts * h  # the router: a dense, TP-replicated linear
    return shard, whole


def layer_expert_params(arch: ModelArch, tp: int, ep: int) -> int:
    """Expert elements of one layer on one rank: E/EP experts x 3 h F/TP (expert TP = TP)."""
    if arch.moe is None:
        return 0
    local = arch.moe.num_experts // ep  # validation requires EP to divide the experts
    ffn = _div(arch.moe.moe_ffn_hidden_size, tp, "moe_ffn_hidden_size")
    return local * 3 * ffn * arch.hidden_size


def rank_params(
    arch: ModelArch, tp: int, pp: int, pp_rank: int, tp_rank: int = 0, ep: int = 1
) -> RankParams:
    """Parameter elements of one policy rank under Megatron's TP x PP (x EP) split."""
    h = arch.hidden_size
    per_stage = arch.num_layers // pp  # validation requires PP to divide the layers
    shard, whole = layer_params(arch, tp)
    vp = padded_vocab_size(arch.vocab_size, tp)
    rows = vp // tp
    pad_rows = max(0, min((tp_rank + 1) * rows, vp) - max(tp_rank * rows, arch.vocab_size))
    first, last = pp_rank == 0, pp_rank == pp - 1
    embedding = rows * h if first else 0
    has_output = last and (not arch.tie_word_embeddings or pp > 1)
    output = rows * h if has_output else 0
    tied_copy = output if arch.tie_word_embeddings else 0
    # A tied copy is counted whole (padding included) in tied_copy, not again here.
    n_vocab_tensors = int(first) + int(has_output and not arch.tie_word_embeddings)
    return RankParams(
        layers=per_stage * (shard + whole),
        experts=per_stage * layer_expert_params(arch, tp, ep),
        embedding=embedding,
        output=output,
        final_norm=h if last else 0,
        replicated=per_stage * whole + (h if last else 0),
        vocab_padding=n_vocab_tensors * pad_rows * h,
        tied_copy=tied_copy,
    )


# ---------------------------------------------------------------------------------------
# Activations and logits


def moe_activation_bytes(inputs: MemoryInputs, tokens: int) -> float:
    """Bytes a MoE layer's router and experts save for `tokens` tokens on a rank: n p k
    (h + 3F/t) + n 4 (E/sp + k) (module docstring); 0 for a dense model."""
    arch, dims = inputs.arch, inputs.dims
    if arch.moe is None:
        return 0.0
    p, k = PRECISION_BYTES[inputs.precision], arch.moe.experts_per_token
    sp = dims.tp if dims.sequence_parallel else 1
    routed = tokens * p * k * (arch.hidden_size + 3 * arch.moe.moe_ffn_hidden_size / dims.tp)
    return routed + tokens * 4 * (arch.moe.num_experts / sp + k)


def moe_dispatch_bytes(inputs: MemoryInputs, tokens: int) -> float:
    """Transient bytes of one MoE layer's token dispatch for `tokens` tokens on a rank (0
    for a dense model): the routed copies T = tokens x k of [T, h] alive at once while the
    alltoall dispatcher runs a layer, (6 + 2/t) T h p: the permuted local copies before and
    after the all-to-all (T/t each), the expert-TP all-gathered input, its expert-sorted
    copy, the experts' output and its unsorted copy (T each), and the probability-weighted
    output in fp32 (2 T at p = 2). Counted in the traced forward and backward of
    Qwen3-30B-A3B (dapo-plan --trace): none of it is saved for backward, all of it is
    live at the layer's peak."""
    arch, dims = inputs.arch, inputs.dims
    if arch.moe is None:
        return 0.0
    p = PRECISION_BYTES[inputs.precision]
    routed = tokens * arch.moe.experts_per_token
    return routed * arch.hidden_size * p * (6 + 2 / dims.tp)


def layer_activation_bytes(inputs: MemoryInputs, tokens: int, recompute: str) -> float:
    """Bytes one layer saves for backward for `tokens` tokens on a rank (module docstring)."""
    arch, dims = inputs.arch, inputs.dims
    p = PRECISION_BYTES[inputs.precision]
    h, q, t = arch.hidden_size, arch.query_width, dims.tp
    kv = arch.num_query_groups * arch.head_dim
    sp = t if dims.sequence_parallel else 1
    heads = arch.num_attention_heads / t
    if recompute == "full":
        return tokens * p * h / sp
    qk_norm = (q + kv) / t if arch.qk_layernorm else 0.0
    dense_mlp = 3 * arch.ffn_hidden_size / t if arch.moe is None else 0.0
    saved = tokens * p * (4 * h / sp + (2 * q + 2 * kv) / t + qk_norm + dense_mlp)
    saved += moe_activation_bytes(inputs, tokens)
    if recompute == "selective":
        return saved
    # Flash attention keeps an fp32 log-sum-exp per head; unfused attention the softmax
    # over all keys (CP ranks gather K/V, so every query sees seq_len keys).
    core = tokens * 4 * heads if inputs.on_gpu else tokens * p * heads * inputs.seq_len
    return saved + core


def logits_bytes(inputs: MemoryInputs, tokens: int, *, backward: bool) -> float:
    """Peak bytes of the logprob head for `tokens` tokens on a last-stage rank."""
    arch, t = inputs.arch, inputs.dims.tp
    p = PRECISION_BYTES[inputs.precision]
    h = arch.hidden_size
    v_local = padded_vocab_size(arch.vocab_size, t) // t
    if not inputs.fused_logits:
        per_elem = p + 4 + (4 if backward else 0)
        return tokens * v_local * per_elem
    saved = tokens * h * p + tokens * 5 * 4
    chunked = 0.0
    if not inputs.on_gpu:
        chunk = max(1, CHUNK_BYTES // (4 * v_local))
        weight_fp32 = v_local * h * 4 if p < 4 else 0
        chunked = weight_fp32 + (2 if backward else 1) * min(tokens, chunk) * v_local * 4
    if not backward:
        return saved + chunked
    return saved + chunked + tokens * h * (4 + p) + v_local * h * (4 + p)


def _in_flight(inputs: MemoryInputs, stage: int) -> int:
    return max(1, min(inputs.dims.pp - stage, inputs.micro_batches))


def stage_memory(inputs: MemoryInputs, stage: int) -> StageMemory:
    """Every policy term of one pipeline stage's rank."""
    dims = inputs.dims
    split = rank_params(inputs.arch, dims.tp, dims.pp, stage, ep=dims.ep)
    params, experts = split.total, split.experts
    p = PRECISION_BYTES[inputs.precision]
    # The distributed optimizer shards each DDP buffer over that buffer's data-parallel
    # group: DP x CP for the dense params, DP x CP / EP for the experts (module docstring).
    dense_shard = dims.dp * dims.cp if inputs.distributed_optimizer else 1
    expert_shard = dims.dp * dims.cp // dims.ep if inputs.distributed_optimizer else 1
    # fp32 elements of one per-param state (main param, exp_avg, ...) on the rank.
    dense_state = (params - experts) / dense_shard
    expert_state = experts / expert_shard
    master_bytes = 0 if inputs.precision == "fp32" else 4
    states = 2 if inputs.optimizer == "adam" else 1
    if inputs.packed_tokens is not None:
        # Packed: the token budget bounds every micro-batch's activations (and attention
        # still spans at most one sequence's keys, seq_len).
        tokens = lp_tokens = inputs.packed_tokens // dims.cp
    else:
        tokens = inputs.micro_batch_size * inputs.seq_len // dims.cp
        lp_tokens = inputs.logprob_micro_batch_size * inputs.seq_len // dims.cp
    layers = inputs.arch.num_layers // dims.pp
    in_flight = _in_flight(inputs, stage)
    per_layer = layer_activation_bytes(inputs, tokens, inputs.recompute)
    # One layer's backward working set; a MoE layer adds its dispatch's transient copies.
    working = layer_activation_bytes(inputs, tokens, "none") + moe_dispatch_bytes(inputs, tokens)
    activations = in_flight * layers * per_layer + working
    # The experts' share: every saved layer (unless fully recomputed) and the working set.
    moe = moe_activation_bytes(inputs, tokens)
    expert_acts = (0 if inputs.recompute == "full" else in_flight * layers * moe) + moe
    expert_acts += moe_dispatch_bytes(inputs, tokens)
    last = stage == dims.pp - 1
    if last:
        sp = dims.tp if dims.sequence_parallel else 1
        activations += tokens * p * inputs.arch.hidden_size / sp  # final norm input
    if stage == 0 and in_flight > 1:
        # The embedding's backward makes a dense weight gradient [V/TP, h] in the param
        # dtype (VocabParallelEmbedding: no fused accumulation into the fp32 buffer),
        # which DDP's hook then adds to main_grad. It is the last thing a micro-batch's
        # backward makes: at the peak only while other micro-batches are in flight
        # (the first stage under PP), as the memory tracer shows.
        v_local = padded_vocab_size(inputs.arch.vocab_size, dims.tp) // dims.tp
        activations += v_local * inputs.arch.hidden_size * p
    logits = logits_bytes(inputs, tokens, backward=True) if last else 0.0
    lp_pass = layer_activation_bytes(inputs, lp_tokens, "none") + moe_dispatch_bytes(
        inputs, lp_tokens
    )
    if last:
        lp_pass += logits_bytes(inputs, lp_tokens, backward=False)
    refit = refit_stage(inputs.refit, inputs.arch, dims, p, stage)
    return StageMemory(
        stage=stage,
        params=params,
        expert_params=experts,
        weights=_gib(params * p),
        master=_gib((dense_state + expert_state) * master_bytes),
        grads=_gib(params * 4),
        optimizer=_gib((dense_state + expert_state) * 4 * states),
        # The reference is built like the policy (build_model: this rank's shard, the
        # training dtype) but not sharded over DP: the same bytes as the weights.
        reference=_gib(params * p) if inputs.kl_reference else 0.0,
        refit_buffer=_gib(refit.buffer),
        refit_staging=_gib(refit.staging),
        refit_export=_gib(refit.export),
        in_flight=in_flight,
        activations=_gib(activations),
        logits=_gib(logits),
        logprob_pass=_gib(lp_pass),
        expert_states=(
            _gib(experts * p),
            _gib(expert_state * master_bytes),
            _gib(experts * 4),
            _gib(expert_state * 4 * states),
        ),
        expert_activations=_gib(expert_acts),
    )


# ---------------------------------------------------------------------------------------
# Generation engine


def engine_expert_params(arch: ModelArch, engine_tp: int) -> int:
    """Expert elements of one vLLM engine rank: every expert of every layer, 3 h F/TP each."""
    if arch.moe is None:
        return 0
    ffn = _div(arch.moe.moe_ffn_hidden_size, engine_tp, "moe_ffn_hidden_size")
    return arch.num_layers * arch.moe.num_experts * 3 * ffn * arch.hidden_size


def engine_params(arch: ModelArch, engine_tp: int) -> int:
    """Parameter elements of one vLLM engine rank (KV heads replicated past their count)."""
    h, d = arch.hidden_size, arch.head_dim
    kv_heads = max(1, arch.num_query_groups // engine_tp)
    q = _div(arch.query_width, engine_tp, "query width")
    layer = (q + 2 * kv_heads * d) * h + q * h
    if arch.moe is None:
        layer += 3 * _div(arch.ffn_hidden_size, engine_tp, "ffn_hidden_size") * h
    else:
        layer += arch.moe.num_experts * h  # the router (replicated); experts below
    if arch.add_qkv_bias:
        layer += q + 2 * kv_heads * d
    if arch.qk_layernorm:
        layer += 2 * d
    layer += 2 * h
    rows = -(-padded_vocab_size(arch.vocab_size, 1, divisible_by=VLLM_VOCAB_MULTIPLE) // engine_tp)
    vocab = rows * h * (1 if arch.tie_word_embeddings else 2)
    return arch.num_layers * layer + vocab + h + engine_expert_params(arch, engine_tp)


def engine_memory(inputs: MemoryInputs) -> EngineMemory | None:
    """KV cache capacity of one engine GPU; None without a vLLM engine."""
    e, arch = inputs.engine, inputs.arch
    if e is None:
        return None
    p = PRECISION_BYTES[inputs.precision]
    h, f, et = arch.hidden_size, arch.ffn_hidden_size, e.tensor_parallel_size
    kv_heads = max(1, arch.num_query_groups // et)
    budget = e.gpu_memory_utilization * inputs.gpu_mem_gib * GIB
    weights = engine_params(arch, et) * p
    ov = inputs.overheads
    runtime = ov.engine_runtime_gib - (0.5 if e.enforce_eager else 0.0)
    qkv = arch.query_width // et + 2 * kv_heads * arch.head_dim
    # The MLP's profile activations: SwiGLU, or the fused MoE's caches of the top-k routed
    # copies ([tokens, k, 2F/et], [tokens k, F/et], [tokens, k, h]).
    if arch.moe is None:
        mlp = 3 * f / et
    else:
        mlp = arch.moe.experts_per_token * (h + 3 * arch.moe.moe_ffn_hidden_size / et)
    profile = ov.engine_profile_tokens * p * (2 * h + qkv + mlp)
    sampler = e.max_num_seqs * arch.vocab_size * 4 * 2  # fp32 logits + processed logprobs
    overhead = runtime * GIB + profile + sampler
    kv_per_token = 2 * arch.num_layers * kv_heads * arch.head_dim * p
    kv_cache = max(0.0, budget - weights - overhead)
    kv_tokens = int(kv_cache // kv_per_token)
    return EngineMemory(
        budget=_gib(budget),
        weights=_gib(weights),
        expert_weights=_gib(engine_expert_params(arch, et) * p),
        overhead=_gib(overhead),
        kv_cache=_gib(kv_cache),
        kv_bytes_per_token=kv_per_token,
        kv_tokens=kv_tokens,
        full_sequences=kv_tokens // inputs.seq_len,
    )
