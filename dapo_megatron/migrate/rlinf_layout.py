"""RLinf's layout, model, optimizer, engine, data and bookkeeping keys in the table;
rlinf_keys.py joins them to RLinf's algorithm keys.

Read at RLinf/RLinf a3816b596478dcd8a5c69a6ec1468c9519f77b5b: rlinf/config.py
(validate_reasoning_cfg, the Megatron and lr-scheduler defaults), rlinf/workers/
megatron_worker.py and workers/actor/megatron_actor_worker.py (micro-batches, the loss),
rlinf/algorithms/advantages.py and rewards/math/__init__.py, and the shipped
examples/reasoning/config/math/*.yaml.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    as_int,
    choice,
    custom,
    hub_model,
    off,
    same,
)
from dapo_megatron.migrate.shared_keys import RLINF

M = "actor.model"
MEGA = "actor.megatron"


def noop(key: str, here: str) -> ForeignKey:
    """A key whose every value leaves what is learned and our layout knobs alone: carried
    with nothing to set, `here` saying why."""
    return as_here(RLINF, key, "nothing", lambda v, ctx: True, here)


def only(
    key: str, feature: str, accept: Callable[[Any, Mapping[str, Any]], bool], here: str
) -> ForeignKey:
    """as_here for RLinf: accepted values need nothing, any other needs `feature`."""
    return as_here(RLINF, key, feature, accept, here)


def _model(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """A `/path/to/...` path is the shipped configs' placeholder, not a checkpoint."""
    if isinstance(value, str) and value.startswith("/path/to/"):
        raise Untranslatable(f"{value} is a placeholder path; set policy.model_name_or_path")
    return hub_model("rollout.model.model_path", RLINF).convert(value, ctx)


def _tokenizer(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if not isinstance(value, str) or value.startswith("/path/to/"):
        raise Untranslatable(f"{value} is a placeholder path; set policy.tokenizer_name_or_path")
    return Translation((("policy.tokenizer_name_or_path", value),), "same meaning")


def _etp(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """Ours always splits experts over the TP ranks (megatron/model.py)."""
    tp = ctx.get(f"{M}.tensor_model_parallel_size", 1)
    if value is None or value == tp:
        return Translation((), "experts split over the TP ranks, as here")
    raise Untranslatable(
        f"needs an expert tensor-parallel size ({value}) apart from TP ({tp}), which "
        "dapo-megatron lacks (here: experts use the TP size)"
    )


def _recompute(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """Megatron's recompute settings, passed through by RLinf; ours: full is uniform over
    1-layer chunks of every layer (megatron/model.py), selective the attention core."""
    method = ctx.get(f"{M}.recompute_method")
    layers = ctx.get(f"{M}.recompute_num_layers")
    if value is None:
        return Translation((("policy.megatron.recompute_granularity", "none"),), "none")
    if value == "selective":
        return Translation((("policy.megatron.recompute_granularity", "selective"),), "as here")
    if value == "full" and method == "uniform" and layers == 1:
        return Translation((("policy.megatron.recompute_granularity", "full"),), "as here")
    raise Untranslatable(
        f"needs recompute {value}/{method}/{layers} layers, which dapo-megatron lacks (here: "
        "none, selective, or full uniform over 1-layer chunks)"
    )


def _seq_length(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """runner.seq_length is prompt + response (validate_reasoning_cfg asserts it exceeds
    data.max_prompt_length); the shipped configs' max_new_tokens is
    `${subtract:${runner.seq_length}, ${data.max_prompt_length}}`."""
    total = as_int(value)
    settings: list[tuple[str, Any]] = [("policy.max_total_sequence_length", total)]
    new = ctx.get("algorithm.sampling_params.max_new_tokens")
    note = "same meaning: prompt + response"
    if isinstance(new, str) and new.replace(" ", "").startswith("${subtract:${runner.seq_length},"):
        prompt = as_int(ctx.get("data.max_prompt_length"))
        settings.append(("generation.max_response_length", total - prompt))
        note += f"; max_new_tokens = seq_length - max_prompt_length = {total - prompt}"
    return Translation(tuple(settings), note)


def _n_minibatches(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """validate_reasoning_cfg: actor.global_batch_size = rollout_batch_size x group_size //
    n_minibatches samples, one optimizer step each."""
    n = as_int(value)
    prompts, group = ctx.get("data.rollout_batch_size"), ctx.get("algorithm.group_size")
    if not isinstance(prompts, int) or not isinstance(group, int):
        raise Untranslatable("needs data.rollout_batch_size and algorithm.group_size")
    return Translation(
        (("policy.train_global_batch_size", prompts * group // n),),
        f"converted: {prompts} prompts x {group} samples / {n} mini-batches",
    )


def _dyn_batch(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is not True:
        return Translation((), "micro-batches of a fixed sample count, as here")
    tokens = as_int(ctx.get("runner.max_tokens_per_mbs"))
    return Translation(
        (("policy.max_tokens_per_microbatch", tokens),),
        f"micro-batches packed up to {tokens} tokens (runner.max_tokens_per_mbs)",
    )


def _max_steps(value: Any, ctx: Mapping[str, Any]) -> Translation:
    n = as_int(value)
    if n <= 0:
        return Translation((), "no step cap: runner.max_epochs decides")
    return Translation((("dapo.max_num_steps", n),), "same meaning")


def _epochs(value: Any, ctx: Mapping[str, Any]) -> Translation:
    raise Untranslatable(
        f"{value} pass(es) over the data: a step count that depends on the dataset's size; "
        "set dapo.max_num_steps"
    )


def _backend(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value == "vllm":
        return Translation((("generation.backend", "vllm"),), "same engine: vLLM")
    raise Untranslatable(f"needs the {value} engine, which dapo-megatron lacks (here: vLLM)")


def _data(ours: str) -> Callable[[Any, Mapping[str, Any]], Translation]:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        files = value if isinstance(value, list) else [value]
        names = ", ".join(str(f) for f in files)
        raise Untranslatable(
            f"{names} is a dataset file we cannot identify; set {ours} (and data.format) by hand"
        )

    return convert


def _reward(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """rewards/math/__init__.py MathReward: reward_max_val (1) x reward_scale when
    math_verify_call finds the response equal to one of the references, else reward_min_val
    (-1) x reward_scale."""
    if value != "math":
        raise Untranslatable(f"needs RLinf's {value} reward, which dapo-megatron lacks")
    scale = ctx.get("reward.reward_scale", 1.0)
    return Translation(
        (
            ("reward.verifier", "math"),
            ("dapo.reward_scaling.enabled", True),
            ("dapo.reward_scaling.target_min", -1.0 * scale),
            ("dapo.reward_scaling.target_max", 1.0 * scale),
        ),
        f"the math reward, +{scale} correct / -{scale} otherwise; RLinf accepts any of "
        "several references, ours compares with the one ground truth",
    )


def top_k(value: Any, ctx: Mapping[str, Any]) -> int:
    k = as_int(value)
    return -1 if k <= 0 or k >= 100_000 else k


_FUSIONS = (
    "apply_rope_fusion",
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "gradient_accumulation_fusion",
    "persist_layer_norm",
    "batch_p2p_comm",
    "use_cpu_initialization",
    "variable_seq_lengths",
    "moe_grouped_gemm",
    "attention_softmax_in_fp32",
    "init_method_std",
)
_MEGATRON_IO = (
    "ckpt_format",
    "use_dist_ckpt",
    "use_hf_ckpt",
    "distributed_backend",
    "distributed_timeout_minutes",
    "tp_comm_bootstrap_backend",
    "tp_comm_overlap_cfg",
    "ddp_bucket_size",
    "mbridge",
    "accumulate_allreduce_grads_in_fp32",
    "use_profiler",
)
_CONVERTOR = (
    "model",
    "hf_model_path",
    "save_path",
    "use_gpu_num",
    "use_gpu_index",
    "process_num",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "grouped_gemm",
    "te_ln_add_extra_state",
    "te_ln_linear_mlp_fc1",
    "te_ln_linear_qkv",
)
_ENGINE = (
    "cuda_graph_max_bs",
    "detokenize",
    "distributed_executor_backend",
    "disable_log_stats",
    "weight_reload",
    "validate_weight",
    "validate_save_dir",
    "print_outputs",
    "sglang.attention_backend",
    "sglang.decode_log_interval",
    "sglang.use_torch_compile",
    "sglang.torch_compile_max_bs",
    "sglang.enable_ep_moe",
    "vllm.attention_backend",
    "vllm.enable_chunked_prefill",
    "vllm.enable_prefix_caching",
    "vllm.enable_flash_infer_sampler",
    "vllm.max_num_batched_tokens",
    "vllm.torch_profiler_dir",
    "model.precision",
)

RLINF_LAYOUT_KEYS: tuple[ForeignKey, ...] = (
    same(RLINF, f"{M}.tensor_model_parallel_size", "policy.megatron.tensor_model_parallel_size"),
    same(
        RLINF, f"{M}.pipeline_model_parallel_size", "policy.megatron.pipeline_model_parallel_size"
    ),
    same(RLINF, f"{M}.context_parallel_size", "policy.megatron.context_parallel_size"),
    same(RLINF, f"{M}.sequence_parallel", "policy.megatron.sequence_parallel"),
    same(RLINF, f"{M}.expert_model_parallel_size", "policy.megatron.expert_model_parallel_size"),
    custom(
        RLINF,
        f"{M}.expert_tensor_parallel_size",
        "(none: experts use the TP size here)",
        "null or the TP size: as here; another size refused",
        _etp,
    ),
    custom(
        RLINF,
        f"{M}.recompute_granularity",
        "policy.megatron.recompute_granularity",
        "full (uniform, 1 layer) or selective: as here; other splits refused",
        _recompute,
    ),
    noop(f"{M}.recompute_method", f"read with {M}.recompute_granularity"),
    noop(f"{M}.recompute_num_layers", f"read with {M}.recompute_granularity"),
    choice(
        RLINF,
        f"{M}.precision",
        "policy.precision",
        {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"},
    ),
    noop("actor.optim.bf16", f"read with {M}.precision"),
    noop("actor.optim.fp16", f"read with {M}.precision"),
    only(
        "actor.optim.loss_scale",
        "a static fp16 loss scale",
        lambda v, ctx: v is None or ctx.get(f"{M}.precision") != "fp16",
        "dynamic fp16 loss scaling (none in bf16, where Megatron reads no scale)",
    ),
    noop("actor.optim.loss_scale_window", "dynamic loss scaling's window"),
    *(
        noop(f"{M}.{k}", "a kernel, fusion or initialisation choice: the same model")
        for k in _FUSIONS
    ),
    only(
        f"{M}.activation",
        "an activation other than the checkpoint's SwiGLU",
        off("swiglu"),
        "SwiGLU",
    ),
    only(f"{M}.normalization", "a norm other than RMSNorm", off("rmsnorm"), "RMSNorm"),
    only(
        f"{M}.position_embedding_type", "position embeddings other than RoPE", off("rope"), "RoPE"
    ),
    only(f"{M}.add_bias_linear", "biases on every linear layer", off(False), "the checkpoint's"),
    only(f"{M}.multi_latent_attention", "multi-head latent attention", off(False), "none"),
    only(f"{M}.model_type", "the DeepSeek-V3 architecture", off(None), "the checkpoint's"),
    noop(f"{M}.moe_router_topk", "the checkpoint's experts per token"),
    noop(f"{M}.moe_router_pre_softmax", "the checkpoint's router"),
    only(f"{M}.moe_router_bias_update_rate", "router bias updates", off(0, 0.0), "none"),
    same(RLINF, f"{M}.moe_aux_loss_coeff", "policy.moe.aux_loss_coef"),
    noop(f"{M}.moe_router_load_balancing_type", f"read with {M}.moe_aux_loss_coeff"),
    choice(
        RLINF,
        f"{M}.moe_token_dispatcher_type",
        "policy.moe.token_dispatcher",
        {"alltoall": "alltoall", "allgather": "allgather"},
    ),
    only(
        f"{M}.megatron_checkpoint",
        "a Megatron checkpoint to start from",
        off(None),
        "the HF checkpoint",
    ),
    noop(f"{M}.seq_length", "read with runner.seq_length"),
    noop(f"{M}.encoder_seq_length", "read with runner.seq_length"),
    custom(
        RLINF,
        "runner.seq_length",
        "policy.max_total_sequence_length (+ generation.max_response_length)",
        "same meaning: prompt + response",
        _seq_length,
    ),
    *(noop(f"{MEGA}.{k}", "checkpoint format, transport or timeout") for k in _MEGATRON_IO),
    *(noop(f"{MEGA}.ckpt_convertor.{k}", "RLinf's HF-to-Megatron conversion") for k in _CONVERTOR),
    only("actor.training_backend", "FSDP training", off("megatron"), "Megatron-Core"),
    noop("actor.mcore_gpt", "Megatron-Core's GPT model, as here"),
    noop("actor.spec_name", "Megatron-Core's GPT layer spec, as here"),
    noop("actor.offload_grad", "where gradients live between phases"),
    noop("actor.offload_optimizer", "where optimizer states live between phases"),
    noop("actor.offload_weight", "where weights live between phases"),
    noop("actor.enable_dp_load_balance", "which DP rank trains which sample"),
    noop("actor.seed", "seeding"),
    # Optimizer and schedule
    only(
        "actor.optim.optimizer", "that optimizer", off("adam"), "Adam with decoupled weight decay"
    ),
    same(RLINF, "actor.optim.adam_beta1", "policy.optimizer.adam_beta1"),
    same(RLINF, "actor.optim.adam_beta2", "policy.optimizer.adam_beta2"),
    same(RLINF, "actor.optim.adam_eps", "policy.optimizer.adam_eps"),
    same(
        RLINF, "actor.optim.use_distributed_optimizer", "policy.megatron.use_distributed_optimizer"
    ),
    same(RLINF, "actor.lr_sched.max_lr", "policy.optimizer.lr"),
    same(RLINF, "actor.lr_sched.min_lr", "policy.optimizer.min_lr"),
    noop("actor.optim.min_lr", "read with actor.lr_sched.min_lr (the scheduler's)"),
    choice(
        RLINF,
        "actor.lr_sched.lr_decay_style",
        "policy.scheduler.lr_decay_style",
        {"constant": "constant"},
    ),
    same(RLINF, "actor.lr_sched.lr_warmup_init", "policy.scheduler.lr_warmup_init"),
    *(
        noop(f"actor.optim.{k}", "overlap or memory placement of the optimizer")
        for k in (
            "overlap_grad_reduce",
            "overlap_param_gather",
            "overlap_param_gather_with_optimizer_step",
            "optimizer_enable_pin",
            "optimizer_cpu_offload",
        )
    ),
    only(
        "actor.optim.use_precision_aware_optimizer",
        "a precision-aware optimizer (reduced-precision optimizer states)",
        off(False),
        "fp32 master weights and optimizer states",
    ),
    noop("actor.tokenizer.use_fast", "the same tokens"),
    noop("actor.tokenizer.trust_remote_code", "loading permission"),
    noop("actor.tokenizer.padding_side", "padding of the trainer's batches"),
    *(
        noop(f"reward.tokenizer.{k}", "the reward worker's copy of the actor's tokenizer")
        for k in ("tokenizer_model", "use_fast", "trust_remote_code", "padding_side")
    ),
    # Micro-batches and placement
    same(RLINF, "algorithm.training_batch_size_per_gpu", "policy.train_micro_batch_size"),
    same(RLINF, "algorithm.logprob_forward_micro_batch_size", "policy.logprob_micro_batch_size"),
    custom(
        RLINF,
        "algorithm.n_minibatches",
        "policy.train_global_batch_size",
        "rollout_batch_size x group_size / n_minibatches samples per optimizer step",
        _n_minibatches,
    ),
    custom(
        RLINF,
        "runner.enable_dynamic_batch_size",
        "policy.max_tokens_per_microbatch",
        "true: micro-batches packed up to runner.max_tokens_per_mbs tokens",
        _dyn_batch,
    ),
    noop("runner.max_tokens_per_mbs", "read with runner.enable_dynamic_batch_size"),
    noop("algorithm.rollout_batch_size_per_gpu", "how requests are split over engines"),
    noop("algorithm.val_rollout_batch_size_per_gpu", "how requests are split over engines"),
    noop("data.val_rollout_batch_size", "validation batching"),
    only(
        "cluster.auto_scheduler",
        "RLinf's auto-scheduler (moving GPUs between components)",
        off(False),
        "a fixed placement",
    ),
    noop("cluster.use_pre_process_policy", "read with cluster.auto_scheduler"),
    noop("cluster.use_wait_before_last_iter_policy", "read with cluster.auto_scheduler"),
    noop("cluster.recreate_nccl_groups", "communicator housekeeping"),
    *(
        only(
            f"cluster.component_placement.{k}",
            "a placement per component (disaggregated)",
            lambda v, ctx: False,
            "every component on the same GPUs",
        )
        for k in ("actor", "rollout", "inference", "reward", "actor,rollout")
    ),
    noop("inference.load_from_actor", "read with cluster.component_placement"),
    noop("inference.model_type", "read with cluster.component_placement"),
    *(
        noop(f"inference.model.{k}", "read with cluster.component_placement")
        for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel")
    ),
    # Engine
    custom(
        RLINF,
        "rollout.rollout_backend",
        "generation.backend",
        "vllm: same; sglang refused",
        _backend,
    ),
    same(RLINF, "rollout.gpu_memory_utilization", "generation.engine.gpu_memory_utilization"),
    same(RLINF, "rollout.enforce_eager", "generation.engine.enforce_eager"),
    same(RLINF, "rollout.max_running_requests", "generation.engine.max_num_seqs"),
    only("rollout.pipeline_parallel_size", "engine pipeline parallelism", off(1), "1"),
    custom(
        RLINF,
        "rollout.model.model_path",
        "policy.model_name_or_path",
        "a hub id or a path; the shipped /path/to/ placeholders refused",
        _model,
    ),
    noop("rollout.model.model_type", "the checkpoint's architecture (read from its config)"),
    custom(
        RLINF,
        "actor.tokenizer.tokenizer_model",
        "policy.tokenizer_name_or_path",
        "same meaning; the shipped /path/to/ placeholders refused",
        _tokenizer,
    ),
    only("rollout.eos", "an EOS apart from the tokenizer's", off(None), "the tokenizer's EOS"),
    only(
        "rollout.padding", "a padding id apart from the tokenizer's", off(None), "the tokenizer's"
    ),
    noop("rollout.return_logprobs", "read with algorithm.recompute_logprobs"),
    *(noop(f"rollout.{k}", "an engine kernel, transport or logging choice") for k in _ENGINE),
    # Data, reward, run length
    custom(
        RLINF,
        "data.train_data_paths",
        "data.train_path",
        "files named by their hub name only",
        _data("data.train_path"),
    ),
    custom(
        RLINF,
        "data.val_data_paths",
        "data.val_path",
        "files named by their hub name only",
        _data("data.val_path"),
    ),
    noop("data.dataset_name", "read with data.train_data_paths"),
    only("data.type", "RLinf's non-math datasets", off("math"), "math prompts"),
    same(RLINF, "data.max_prompt_length", "data.max_prompt_length"),
    same(RLINF, "data.prompt_key", "data.prompt_key"),
    same(RLINF, "data.answer_key", "data.answer_key"),
    same(RLINF, "data.apply_chat_template", "data.apply_chat_template"),
    same(RLINF, "data.shuffle", "data.shuffle"),
    noop("data.validation_shuffle", "the order of validation prompts"),
    noop("data.seed", "seeding"),
    only(
        "data.filter_prompt_by_length",
        "training on prompts over data.max_prompt_length",
        off(True),
        "longer prompts are skipped",
    ),
    custom(
        RLINF,
        "reward.reward_type",
        "reward.verifier (+ dapo.reward_scaling)",
        "math: the math verifier, +/- reward_scale",
        _reward,
    ),
    noop("reward.reward_scale", "read with reward.reward_type"),
    only("reward.use_reward_model", "a reward model", off(False), "a rule verifier"),
    only("critic.use_critic_model", "a critic", off(False), "no critic (GRPO)"),
    only("runner.task_type", "RLinf's non-reasoning tasks", off("reasoning"), "reasoning"),
    custom(
        RLINF,
        "runner.max_steps",
        "dapo.max_num_steps",
        "> 0: same; -1: max_epochs decides",
        _max_steps,
    ),
    custom(
        RLINF, "runner.max_epochs", "(none: dapo.max_num_steps)", "passes over the data", _epochs
    ),
)
"""RLinf's layout, model, optimizer, engine and data keys."""
