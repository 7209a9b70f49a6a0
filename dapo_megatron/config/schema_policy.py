"""The model's sections: the trained policy (Megatron layout, MoE, optimizer, scheduler,
batch sizes) and the engines that generate from it (generation).

Part of the run's schema (config/schema.py joins the sections into DapoMegatronConfig);
as there, fields carry no defaults (configs/dapo_base.yaml holds them) and each field's
docstring is the reference documentation of its key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class MegatronConfig:
    """Megatron-Core parallel layout and memory settings of the policy."""

    tensor_model_parallel_size: int
    """Tensor parallel size (TP): heads and MLP columns split across ranks.

    Tensor parallel size (TP): attention heads and MLP columns split across ranks."""
    pipeline_model_parallel_size: int
    """Pipeline parallel size (PP): transformer layers split into stages."""
    context_parallel_size: int
    """Context parallel size (CP): each sequence split across ranks.

    Context parallel size (CP): each sequence split across ranks (load-balanced chunks)."""
    sequence_parallel: bool
    """Sequence parallelism (SP) for layer norms and dropout; requires TP > 1."""
    data_parallel_size: int | None
    """Data parallel size (DP); null: world size / (TP * PP * CP).

    Data parallel size (DP); null derives it as policy world size / (TP * PP * CP)."""
    expert_model_parallel_size: int
    """Expert parallel size (EP, MoE only); EP must divide DP * CP.

    Expert parallel size (EP, MoE models only): each rank holds num_experts / EP experts of
    every layer; EP ranks are carved out of DP x CP (Megatron's expert grid), so EP must
    divide DP * CP. 1 for dense models."""
    use_distributed_optimizer: bool
    """Shard optimizer states over DP ranks (DistributedOptimizer).

    Shard optimizer states across DP ranks (Megatron's DistributedOptimizer)."""
    recompute_granularity: Literal["none", "selective", "full"]
    """Activation recomputation: none, selective (attention core) or full."""


@dataclass
class MoeConfig:
    """How the policy trains a mixture-of-experts model (ignored for dense models)."""

    aux_loss_coef: float
    """Load-balancing loss coefficient; 0 = off, the RL default (verl, slime).

    Coefficient of Megatron's load-balancing loss (``moe_aux_loss_coeff``; 0 turns the loss
    off: ``moe_router_load_balancing_type`` none). 0 for RL by default, as verl (mbridge)
    and slime do: the term is not part of the policy objective, and a non-zero value changes
    the gradient of every router away from the DAPO loss's. With it on, the term is
    Megatron's per micro-batch mean, summed over micro-batches and data-parallel ranks (its
    scaling under a per-token policy loss), not averaged."""
    token_dispatcher: Literal["alltoall", "allgather"]
    """How tokens reach other EP ranks' experts: alltoall | allgather.

    How tokens reach the experts of other expert-parallel ranks: alltoall (each token goes
    to the ranks of its experts only; Megatron's choice for EP > 1) or allgather (every rank
    sees every token; simpler, more traffic)."""
    routing_replay: bool
    """Rollout routing replay (R3): train with the experts the engine routed to.

    Rollout routing replay (R3): the rollout engine records the experts each MoE layer
    routed every token to, and the policy's logprob and train passes route the same tokens
    to the same experts (Megatron's RouterReplay), so a router's top-k flips between
    decoding and the trainer's forward cannot widen the train/rollout mismatch. Needs a MoE
    model and generation.backend=megatron (vLLM 0.32 returns routing only with its Model
    Runner V2); not with PP > 1 and full recompute."""
    freeze_router: bool
    """Train every weight but the MoE routers' (NeMo RL's freeze_moe_router).

    The routers keep their checkpoint weights: their parameters take no gradient and no
    optimizer state (megatron/model.py sets requires_grad False before DDP wraps the model),
    as NeMo RL's freeze_moe_router does to steady MoE RL training (nemo_rl/models/megatron/
    setup.py). The experts and attention train as usual."""


@dataclass
class OptimizerConfig:
    """Megatron optimizer settings."""

    name: Literal["adam", "sgd"]
    """Optimizer: adam (Megatron's AdamW, decoupled weight decay) or sgd."""
    lr: float
    """Peak learning rate."""
    min_lr: float
    """Learning rate at the end of a decaying schedule."""
    weight_decay: float
    """Decoupled weight decay."""
    adam_beta1: float
    """Adam beta1."""
    adam_beta2: float
    """Adam beta2."""
    adam_eps: float
    """Adam epsilon."""
    clip_grad: float
    """Maximum global gradient norm; 0 disables clipping."""


@dataclass
class SchedulerConfig:
    """Learning-rate schedule, counted in optimizer steps or in trainer steps (unit)."""

    lr_warmup_steps: int
    """Linear warm-up length in schedule steps (policy.scheduler.unit)."""
    lr_warmup_init: float
    """Learning rate at the start of warm-up."""
    lr_decay_style: Literal["constant", "linear", "cosine"]
    """Shape of the schedule after warm-up."""
    lr_decay_steps: int | None
    """Schedule steps over which lr decays to min_lr; null: the run's total steps."""
    unit: Literal["optimizer_step", "train_step"] = "optimizer_step"
    """What one schedule step is.

    What the warm-up and decay lengths count: `optimizer_step` advances the lr at every
    optimizer step; `train_step` holds one lr over all of a trainer step's optimizer steps
    and advances it once per trainer step, as verl and NeMo RL step their schedulers (the
    importer writes it for their configs). Same as long as a trainer step is one optimizer
    step."""


@dataclass
class PolicyConfig:
    """The trained model and how Megatron runs it."""

    model_name_or_path: str
    """Local HF checkpoint directory (config.json + safetensors).

    Local Hugging Face checkpoint directory (config.json + safetensors) to train. Its
    config.json is the architecture; for planning, a hub id (``Org/Name``) is also read from
    the Hugging Face cache (HF_HUB_CACHE / HF_HOME), or its config.json alone from the hub
    when online; without a config.json the name names the preset (``Qwen3-8B-Base``,
    ``Qwen/Qwen3-30B-A3B-Instruct``: less -Base/-Instruct/-Chat, a preset name;
    config/model_source.py)."""
    tokenizer_name_or_path: str | None
    """Tokenizer directory; null uses model_name_or_path."""
    model_arch: str | None
    """Architecture preset while there is no config.json; null: the name's.

    Architecture preset (config/model_arch.py PRESETS) of model_name_or_path, used when it
    has no config.json yet (planning before the download, or the model init_model_if_missing
    creates); null: the model's config.json, else the preset its name names. A preset that
    disagrees with the config.json's shapes or with the name's preset is an error. One set
    in a parent recipe (`defaults:`) that a later layer gave another model_name_or_path does
    not apply to that model: set both together."""
    init_model_if_missing: bool
    """Create a random checkpoint of model_arch if the path is absent.

    Create a randomly initialised checkpoint of model_arch at model_name_or_path when it
    does not exist (the tiny CPU recipe); never wanted for real runs."""
    precision: Literal["bf16", "fp16", "fp32"]
    """Policy parameter/compute precision (fp32 master weights for bf16/fp16)."""
    allow_local_spec: bool
    """No Transformer Engine on CUDA: false = error, true = local unfused layers.

    On CUDA, build Megatron's local (pure torch) layers when Transformer Engine does not
    import, instead of stopping with the import error. The local spec attends unfused
    (slower, and more activation memory than dapo-plan counts); for debugging a machine
    without the gpu extra only. No effect on CPU, where the local spec is the only one."""
    megatron: MegatronConfig
    """Parallel layout and memory settings."""
    moe: MoeConfig
    """Mixture-of-experts training settings (MoE models only)."""
    optimizer: OptimizerConfig
    """Optimizer."""
    scheduler: SchedulerConfig
    """Learning-rate schedule."""
    train_global_batch_size: int
    """Samples per optimizer step (the mini-batch), over all DP ranks."""
    train_micro_batch_size: int
    """Samples per forward/backward micro-batch on one data-parallel rank."""
    logprob_micro_batch_size: int
    """Samples per forward-only micro-batch when computing old/reference logprobs."""
    max_tokens_per_microbatch: int | None
    """Sequence packing: tokens per packed micro-batch; null = padded ones.

    Sequence packing: each train/logprob micro-batch concatenates whole sequences (no
    padding between them, attention kept within each) up to this many tokens; rows are then
    dealt to data-parallel ranks by tokens. Replaces train_micro_batch_size and
    logprob_micro_batch_size; null keeps padded micro-batches of those sizes. Must hold the
    longest sequence, data.max_prompt_length + generation.max_response_length (at most
    max_total_sequence_length with generation.response_cap: context)."""
    old_logprob_pass: Literal["auto", "always"]
    """always, or auto: no old-logprob pass when a batch is one optimizer step.

    auto: skip the forward-only old-logprob pass when a rollout batch is trained in ONE
    optimizer step (batch <= train_global_batch_size): the training forward's detached
    logprobs are then exactly the old ones (peers skip it too). always: run it every step."""
    max_total_sequence_length: int
    """Longest prompt + response the trainer accepts, in tokens."""


@dataclass
class EngineConfig:
    """Size and memory of each generation engine."""

    tensor_parallel_size: int
    """Tensor parallel size of one generation engine."""
    num_engines: int | None
    """Number of engines; null: generation devices / tensor_parallel_size."""
    gpu_memory_utilization: float
    """Device memory fraction of an engine (vLLM): weights + KV cache.

    Fraction of device memory an engine may use (vLLM); its KV cache takes the rest of it."""
    max_num_seqs: int
    """Maximum sequences decoded concurrently by one engine."""
    enforce_eager: bool
    """Disable the engine's CUDA graphs (vLLM; Megatron decode step).

    Slower, less memory, quicker start."""


@dataclass
class GenerationConfig:
    """Rollout generation."""

    backend: Literal["vllm", "megatron"]
    """Engine: vllm (GPU default; CPU build in CI) or megatron (Megatron-Core)."""
    temperature: float
    """Sampling temperature of training rollouts."""
    top_p: float
    """Nucleus sampling threshold of training rollouts (1.0 = off)."""
    top_k: int
    """Top-k sampling of training rollouts (-1 = off)."""
    max_response_length: int
    """Response cap given to the engine, in tokens (DAPO: 16384 + 4096).

    Response generation cap given to the engine, in tokens: Lmax of the overlong shaping."""
    response_cap: Literal["fixed", "context"]
    """Per-prompt response cap: fixed | context (NeMo RL's).

    fixed: every response stops at max_response_length, and policy.max_total_sequence_length
    must hold data.max_prompt_length + max_response_length. context: as NeMo RL, whose vLLM
    engine (max_model_len = policy.max_total_sequence_length) ends each response at
    min(max_new_tokens, max_model_len - prompt length): a prompt of P tokens gets
    min(max_response_length, policy.max_total_sequence_length - P), so only
    data.max_prompt_length < policy.max_total_sequence_length is needed (and
    max_response_length <= policy.max_total_sequence_length - 1). A response stopped by its
    own cap finishes with "length" (truncated: overlong filtering drops it). The overlong
    shaping keeps Lmax = max_response_length for every prompt (a constant, as NeMo RL's
    reward_shaping.max_response_length): its penalty reads the response length only. A
    continued partial rollout gets what its prompt's own cap has left."""
    stop_token_ids: list[int] | None
    """Extra token ids that end a response; null: the tokenizer's EOS."""
    refit_transport: Literal["auto", "broadcast", "ipc", "object_store"]
    """How trained weights reach engines: auto | broadcast | ipc | object_store.

    How trained weights reach separate engines: broadcast (bucketed NCCL on GPU, gloo on
    CPU, over a weight-update group of the exporting policy rank and every engine worker),
    ipc (buckets shared through CUDA IPC handles on GPU, shared memory on CPU; engines on
    the policy's nodes), object_store (fallback: the whole model through Ray's object
    store). auto: ipc for colocated engines on GPU, broadcast otherwise."""
    refit_bucket_mb: float
    """Refit bucket size in MiB; the exporter holds at most two buckets.

    Refit bucket size in MiB: tensors travel in flat buffers of this size (a larger tensor
    travels alone); the exporter holds at most two buckets at once."""
    sampling_seeds: Literal["auto", "per_request", "engine"]
    """vLLM request seeding: auto | per_request | engine.

    vLLM request seeding: per_request (reproducible per prompt, forces vLLM's slow
    per-request sampler on GPU), engine (only the engine's seed; batched sampler). auto:
    per_request on CPU, engine on GPU."""
    engine: EngineConfig
    """Engine sizes."""
