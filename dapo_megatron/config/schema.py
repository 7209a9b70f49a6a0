"""Typed schema of a dapo-megatron run: one dataclass per YAML section.

Fields carry no defaults on purpose: every default lives once, in configs/dapo_base.yaml,
and recipes inherit it with `defaults:`. The loader (loader.py) turns the merged YAML into
these dataclasses, checking types; cross-field constraints live in validate.py.
Each field's docstring is the reference documentation of its key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The loss's keys and value sets are declared once, beside LossSpec (torch-free), so that a
# YAML value and a loss argument cannot disagree. LossAggMode is re-exported (tests read it
# from here).
from dapo_megatron.algorithms.loss_spec import LossAggMode as LossAggMode
from dapo_megatron.algorithms.loss_spec import LossParams


@dataclass
class RunConfig:
    """Identity and location of a run."""

    name: str
    """Run name, used for the run directory and by loggers."""
    output_dir: str
    """Run directory: checkpoints, metrics.jsonl, plots (relative to the cwd)."""
    seed: int
    """Global seed: data order, sampling, initialisation of a fresh model."""
    max_restarts: int
    """Restarts from the last checkpoint after a worker dies.

    How many times the controller restarts from the last checkpoint after a worker dies."""
    preemption_grace_s: float
    """After SIGTERM: save at the next step end within this, exit 143.

    After a SIGTERM to dapo-train (a Slurm preemption or time limit, ``kill``): how long the
    run may take to reach its next safe point (the end of a step), save a checkpoint there
    and exit with status 143 and a resume line. Past it, the run stops at once without
    saving (the last checkpoint stays the resume point), so keep it below the time between
    the signal and the SIGKILL that follows (slurm/ray.sub asks Slurm for SIGTERM 300 s
    before the time limit)."""
    collective_timeout_s: float
    """A policy collective waiting longer on a peer fails (rank named; restart).

    How long a collective of the policy ranks may wait for a peer (a stuck or stopped rank)
    before it fails; the run then names the rank that did not answer and restarts from the
    last checkpoint. Generous: a collective also waits out the slowest rank's compute before
    it, and a checkpoint save."""
    call_timeout_s: float
    """A worker call answering later than this fails (worker named; restart).

    How long the controller waits for any one call to its workers (a generation round, a
    train step, a refit, a save) before it names the worker that did not answer and restarts
    from the last checkpoint: the backstop for a hang outside a collective. Far above the
    longest call of a real run."""


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
    """Learning-rate schedule, counted in optimizer steps."""

    lr_warmup_steps: int
    """Linear warm-up length in optimizer steps (DAPO: 20 rollout steps' worth)."""
    lr_warmup_init: float
    """Learning rate at the start of warm-up."""
    lr_decay_style: Literal["constant", "linear", "cosine"]
    """Shape of the schedule after warm-up."""
    lr_decay_steps: int | None
    """Steps over which lr decays to min_lr; null: the run's total steps."""


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
    longest sequence, data.max_prompt_length + generation.max_response_length."""
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
    """Disable CUDA graphs in vLLM (slower, less memory, quicker start)."""


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


@dataclass(frozen=True)
class LossConfig(LossParams):
    """The clipped policy-gradient loss (clip-higher, token-level aggregation). Its keys are
    declared once, in algorithms/loss_spec.py ``LossParams`` (the run's ``LossSpec`` extends
    the same class); only loss_scale_length, resolved before the loss reads it, is its own."""

    loss_scale_length: int | None
    """seq-mean-token-sum-norm length; null: generation.max_response_length."""


@dataclass
class AdvantageConfig:
    """Group-relative advantage estimation."""

    norm_by_std: bool
    """Divide by the group's reward std; false gives r - mean (Dr. GRPO)."""
    leave_one_out: bool
    """Baseline each sample with the mean of its group's others (RLOO)."""
    eps: float
    """Added to the std before dividing."""


@dataclass
class SkipPredictedConfig:
    """Pre-rollout skipping (algorithms/prompt_skipping.py): a prompt whose recent groups
    were all correct or all wrong is skipped before generation with a probability that
    grows with that streak, is never skipped with certainty (min_generate_prob), and the
    strength of the rule tunes itself towards target_zero_var_share. Skipped prompts are
    not trained on this visit; kept groups are exactly what dynamic sampling keeps."""

    enabled: bool
    """Skip prompts predicted to give a zero-variance group before generating.

    Skip prompts predicted to give a zero-variance group (needs dynamic sampling)."""
    target_zero_var_share: float
    """Zero-variance share of generated groups the rule aims for.

    Share of zero-variance groups among those generated that the rule aims for: above it the
    rule skips more, below it less. In [0, 1)."""
    min_generate_prob: float
    """Exploration floor: each prompt is generated with at least this probability.

    Exploration floor: every prompt is generated with at least this probability, so a prompt
    the policy forgets is found again. In (0, 1]."""
    audit_fraction: float
    """Share of would-be-skipped prompts generated anyway to check the prediction.

    Share of would-be-skipped prompts generated anyway: their outcomes measure the
    prediction (dynamic_sampling/predicted_zero_var_precision). In [0, 1]."""
    history_len: int
    """Outcomes remembered per prompt (the longest streak that counts)."""
    initial_strength: float
    """Initial strength s; skip prob. at streak r: (1 - floor)(1 - (1 - s)^r).

    The rule's strength s before any step tuned it (skip probability of a prompt with a
    streak r: (1 - min_generate_prob) * (1 - (1 - s)^r)). In [0, 1]."""
    adapt_rate: float
    """Per step, s moves by adapt_rate x (observed - target) zero-variance share."""


@dataclass
class DynamicSamplingConfig:
    """DAPO dynamic sampling: train only on prompt groups whose outcomes differ."""

    enabled: bool
    """Filter out groups whose raw metric has zero variance and refill the batch."""
    metric: Literal["acc", "score"]
    """Raw metric filtered on: acc (verifier accuracy) or the unshaped score.

    Raw per-sample metric to filter on: verifier accuracy or the unshaped score (never the
    shaped reward, which would give wrong short answers a positive advantage)."""
    batch_multiplier: float | Literal["auto"]
    """Prompts per round = ceil(multiplier * groups needed), or auto.

    Prompts generated per round = ceil(multiplier * groups still needed); "auto" sets it
    each step from the observed keep rate, bounded by max_batch_multiplier."""
    max_batch_multiplier: float
    """Upper bound of the automatic batch multiplier."""
    max_gen_batches: int
    """At most this many full rounds' worth of prompts per step; <= 0 = unlimited.

    A step generates at most max_gen_batches * ceil(batch_multiplier * num_prompts_per_step)
    prompts (that many full generation rounds), then stops with an error that reports the
    keep rate; <= 0 means unlimited. One meaning in both loops: a synchronous round that
    needs fewer groups draws fewer prompts, and an overlapped request is smaller than a
    round, so both count prompts."""
    surplus: Literal["carry", "discard"]
    """Valid groups beyond num_prompts_per_step: carry (to next step) | discard.

    What to do with valid groups beyond num_prompts_per_step: carry them to the next step
    (no wasted generation) or discard them (the peers' behaviour)."""
    max_carry_age: int | None
    """Carried groups older than this many versions are dropped; null: 1, or K.

    A carried group generated by policy version w is dropped once the step's version
    exceeds w + max_carry_age. With rollout.max_staleness = K >= 1 one bound, K, applies to
    carried and fresh groups: null takes it, and any other value is refused (naming both
    keys). Null with K = 0 is 1."""
    skip_predicted: SkipPredictedConfig
    """Skip prompts predicted to be uninformative before generating them."""


@dataclass
class OverlongBufferConfig:
    """Soft overlong punishment (DAPO Eq. 13)."""

    enabled: bool
    """Add the length penalty to the scaled reward."""
    length: int
    """Lcache: the penalty ramps over the last `length` tokens below the cap.

    Lcache: the penalty ramps from 0 at max_response_length - length to -penalty_factor at
    max_response_length (the response cap)."""
    penalty_factor: float
    """Largest penalty; the penalty always lies in [-penalty_factor, 0]."""


@dataclass
class RewardScalingConfig:
    """Linear reward scaling applied to the verifier score before shaping."""

    enabled: bool
    """Clamp the score to the source range, map it to [target_min, target_max].

    Clamp the score to [source_min, source_max] and map it to [target_min, target_max]."""
    source_min: float
    """Lower end of the verifier score range."""
    source_max: float
    """Upper end of the verifier score range."""
    target_min: float
    """Reward given for source_min."""
    target_max: float
    """Reward given for source_max."""


@dataclass
class DapoConfig:
    """The DAPO algorithm: batch sizes and every technique's knobs."""

    num_prompts_per_step: int
    """Prompt groups trained on per step (DAPO: 512)."""
    num_generations_per_prompt: int
    """Responses sampled per prompt, the group size (DAPO: 16)."""
    max_num_steps: int
    """Training steps (rollout + update) of the run."""
    loss: LossConfig
    """Policy loss."""
    advantage: AdvantageConfig
    """Advantage estimation."""
    dynamic_sampling: DynamicSamplingConfig
    """Dynamic sampling."""
    overlong_filtering: bool
    """Zero the loss mask of responses that hit the length cap (no stop token)."""
    overlong_buffer: OverlongBufferConfig
    """Soft overlong punishment."""
    reward_scaling: RewardScalingConfig
    """Reward scaling."""


@dataclass
class RolloutConfig:
    """Overlap of rollout generation with training (engines on devices of their own)."""

    max_staleness: int
    """K: groups train at most K policy versions old; 0 = synchronous.

    K: a group is trained only if the policy version that generated it is at most K versions
    behind the version being trained. 0 = the synchronous loop (generate, then train, then
    refit); K >= 1 keeps the engines generating for the next steps while the policy trains
    (split mode only: cluster.colocated=false)."""
    stale_groups: Literal["drop", "regenerate"]
    """K >= 1: a group older than K versions: drop it, or regenerate its prompt.

    K >= 1: what happens to a group that arrives more than K versions behind: drop it
    (counted), or drop it and generate its prompt again with the current weights."""
    prompts_per_request: int | None
    """K >= 1: cap on prompts per engine request; null = no cap.

    K >= 1: the most prompts one generation request may hold (spread over the engines). A
    request asks for what the generate-ahead budget lacks (about a step's prompts at the
    running keep rate, plus a little headroom); the new weights are queued behind the
    requests in flight, so a cap lets the transfer start sooner and the controller score a
    step's groups as they come, while larger requests batch better. null = no cap."""
    abort_tail: bool
    """K = 0: abort a round's slowest prompts once it has the groups it needs.

    Synchronous loop: a generation round stops once it has the finished groups it needs (at
    the running keep rate, with headroom; abort_tail_oversample); the prompts whose samples
    are still running are aborted on the engines instead of waiting for the slowest samples.
    Aborted groups are not trained (their prompts count as drawn), so prompts with long
    answers are trained a little less often: see README, rollout efficiency."""
    abort_tail_oversample: float
    """With abort_tail: prompts drawn per round = this x finished groups awaited.

    With abort_tail: a round draws this many times the finished groups it waits for (those
    that give the groups it needs at the running keep rate, with 2 standard deviations of
    headroom); the slowest prompts beyond them are the tail that is cut. >= 1; 1 cuts
    nothing."""
    partial_rollouts: bool
    """With abort_tail: continue aborted samples next round, not dropping them.

    With abort_tail: keep the aborted samples and continue them in the next round (the
    prompt followed by their tokens so far), as slime does, instead of dropping them. A
    sample continued after a refit holds tokens of two policy versions, each with the
    logprob of the weights that generated it (dapo.loss.rollout_correction=tis corrects
    them, as overlapped samples); the group's version is its oldest token's."""


@dataclass
class SftWarmupConfig:
    """Supervised warm-up before DAPO (next-token NLL on reference answers)."""

    num_steps: int
    """Optimizer steps of warm-up on a fresh run; 0 disables it."""
    batch_size: int
    """Samples per warm-up step, over all data-parallel ranks."""
    lr: float
    """Constant learning rate of the warm-up (the DAPO schedule starts after it)."""


@dataclass
class ValidationConfig:
    """Periodic validation (avg@k accuracy on the validation set)."""

    val_period: int
    """Validate every this many steps; 0 disables."""
    val_at_start: bool
    """Validate once before the first step."""
    num_samples_per_prompt: int
    """k of avg@k: samples per validation prompt (DAPO reports avg@32)."""
    temperature: float
    """Sampling temperature of validation."""
    top_p: float
    """Nucleus sampling threshold of validation (DAPO: 0.7)."""
    max_prompts: int | None
    """Validate on at most this many prompts; null uses the whole validation set."""
    greedy: bool
    """Greedy accuracy (top_k=1, 1 sample per prompt) instead of avg@k.

    Greedy decoding (top_k=1, one sample per prompt) instead of avg@k sampling; the
    temperature, top_p and num_samples_per_prompt keys are then unused."""


@dataclass
class ArithmeticTaskConfig:
    """The synthetic arithmetic task of the tiny CPU recipe."""

    num_train: int
    """Training problems generated."""
    num_val: int
    """Validation problems generated."""
    difficulty: int
    """Number of operands per problem (2 = "a+b")."""


@dataclass
class RemainderTaskConfig:
    """The long-response synthetic task (data/remainder.py): ``"n-d="`` answered by
    subtracting d repeatedly (every intermediate number written), then n mod d on its own
    line; n and d uniform in their ranges. A solution has n // d steps of ~3-4 tokens, so
    ones longer than generation.max_response_length are truncated: the long-response
    recipe's cap leaves the longest problems unsolvable on purpose."""

    num_train: int
    """Training problems generated (those outside validation, repeated).

    Training problems generated (the problems outside validation, repeated evenly)."""
    num_val: int
    """Validation problems (distinct, held out of training; at most half)."""
    min_dividend: int
    """Smallest dividend n (> max_divisor)."""
    max_dividend: int
    """Largest dividend n."""
    min_divisor: int
    """Smallest divisor d (>= 2)."""
    max_divisor: int
    """Largest divisor d (< min_dividend)."""


@dataclass
class DataConfig:
    """Training and validation prompts."""

    format: Literal["dapo_math", "aime", "gsm8k", "arithmetic", "remainder"]
    """Dataset layout: dapo_math | aime | gsm8k | arithmetic | remainder.

    Dataset layout: DAPO-Math-17k, AIME24, GSM8K (jsonl/parquet) or a synthetic task
    (arithmetic: short answers; remainder: worked solutions of 4-130 tokens)."""
    train_path: str | None
    """Training file (jsonl or parquet); null only for arithmetic."""
    val_path: str | None
    """Validation file; null: no file validation (arithmetic makes its own)."""
    prompt_key: str | None
    """Field holding the prompt; null uses the format's standard field."""
    answer_key: str | None
    """Field holding the ground truth; null uses the format's standard field."""
    max_prompt_length: int
    """Longer prompts are skipped and counted; a corrupt row is an error.

    Prompts longer than this many tokens are skipped (and counted, ``[setup] skipped N``). A
    row far longer than any such prompt (over 64 bytes per token + 64 KiB: a corrupt file or
    the wrong field) is an error naming the file and the line, found before tokenising."""
    apply_chat_template: bool
    """Wrap prompts with the tokenizer's chat template."""
    shuffle: bool
    """Shuffle training prompts every epoch (seeded by run.seed)."""
    arithmetic: ArithmeticTaskConfig
    """Settings of the synthetic arithmetic task."""
    remainder: RemainderTaskConfig
    """Settings of the synthetic remainder (long-response) task."""


@dataclass
class RewardConfig:
    """Verification of responses."""

    verifier: Literal["math", "gsm8k", "arithmetic", "remainder"]
    """Verifier: math | gsm8k | arithmetic | remainder.

    Verifier: math (math-verify, "Answer: X" or \boxed{X}), gsm8k final number, arithmetic,
    remainder (the answer line of a worked solution)."""
    timeout_s: float
    """Per-sample verification time limit; a timeout scores 0 and is counted."""
    num_workers: int
    """Processes of the verification pool."""


@dataclass
class ClusterConfig:
    """Where the run executes."""

    num_nodes: int
    """Nodes in the Ray cluster."""
    gpus_per_node: int
    """Devices per node; on CPU, the number of worker processes per node."""
    device: Literal["auto", "cuda", "cpu"]
    """auto picks cuda when available, else cpu (gloo)."""
    colocated: bool
    """Policy and engines share all devices (engine asleep while training)."""
    generation_num_devices: int
    """Split mode only: devices given to generation; the policy gets the rest."""
    ray_address: str | None
    """Ray cluster to join; null: RAY_ADDRESS if set, else a local one.

    Ray cluster to join; null uses RAY_ADDRESS when set (slurm/ray.sub), else starts a local
    cluster bound to loopback."""


@dataclass
class CheckpointingConfig:
    """Checkpoints of the full run state (model, optimizer, scheduler, data, sampler, RNG)."""

    enabled: bool
    """Write checkpoints."""
    checkpoint_dir: str | None
    """Checkpoint directory; null uses <run.output_dir>/checkpoints."""
    save_period: int
    """Save every this many steps (and at the end)."""
    keep_last: int
    """Keep only the newest this many complete checkpoints."""
    resume: Literal["auto", "never"]
    """auto: resume from the newest complete checkpoint; never: start anew.

    The checkpoints are looked for in checkpoint_dir."""
    export_hf: bool
    """Write the final policy as an HF checkpoint (<run.output_dir>/hf/step_<N>).

    At the end of the run, write the final policy as a Hugging Face checkpoint to
    <run.output_dir>/hf/step_<N> (config.json, safetensors, tokenizer); other steps'
    checkpoints export with ``dapo-export``."""
    allow_data_change: bool = False
    """Resume although data.train_path's content changed since the checkpoint.

    Resume even though data.train_path's content differs from the data the checkpoint was
    trained on (its SHA-256 is recorded in every checkpoint; a change is refused before
    anything starts unless this is true). With a different number of prompts the sampler
    starts a new epoch over the new data."""


@dataclass
class LoggerConfig:
    """Metrics sinks; metrics.jsonl in the run directory is always written."""

    log_dir: str | None
    """Log directory; null uses <run.output_dir>/logs."""
    tensorboard_enabled: bool
    """Write TensorBoard event files."""
    wandb_enabled: bool
    """Log to Weights & Biases (needs wandb installed and configured)."""
    wandb_project: str
    """W&B project name."""
    mlflow_enabled: bool
    """Log to MLflow (needs mlflow installed)."""
    mlflow_tracking_uri: str | None
    """MLflow tracking URI; null uses MLflow's own default."""
    progress_bar: bool
    """Show a progress bar over steps with the headline metrics."""
    plots: bool
    """Write PNG plots of the main curves to the run directory on exit."""


@dataclass
class DapoMegatronConfig:
    """A whole run."""

    run: RunConfig
    """Run identity and directory."""
    policy: PolicyConfig
    """Policy model, Megatron layout, optimizer and batch sizes."""
    generation: GenerationConfig
    """Rollout generation."""
    dapo: DapoConfig
    """The DAPO algorithm."""
    rollout: RolloutConfig
    """Overlapped (asynchronous) rollouts with bounded staleness."""
    sft_warmup: SftWarmupConfig
    """Optional supervised warm-up."""
    validation: ValidationConfig
    """Validation."""
    data: DataConfig
    """Datasets."""
    reward: RewardConfig
    """Verifiers."""
    cluster: ClusterConfig
    """Cluster and placement."""
    checkpointing: CheckpointingConfig
    """Checkpointing and resume."""
    logger: LoggerConfig
    """Metrics and progress reporting."""
