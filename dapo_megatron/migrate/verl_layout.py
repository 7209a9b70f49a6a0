"""verl's layout, engine and memory keys (Megatron and FSDP workers), with their converters;
verl_keys.py joins them into VERL_KEYS.

What each key does in verl was read from volcengine/verl at the commit of
tests/data/foreign/verl/SOURCES.md: the Megatron worker's engine config
(verl/workers/config/engine.py McoreEngineConfig), its actor (workers/actor/megatron_actor.py)
and the trainer's base config (verl/trainer/config/_generated_ppo_megatron_trainer.yaml).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    as_int,
    custom,
    off,
    same,
)
from dapo_megatron.migrate.shared_keys import VERL

VERL_ACTOR = "actor_rollout_ref.actor"
VERL_ROLLOUT = "actor_rollout_ref.rollout"
VERL_REF = "actor_rollout_ref.ref"
MEGATRON = f"{VERL_ACTOR}.megatron"
OTC = f"{MEGATRON}.override_transformer_config"
TP_KEY = f"{MEGATRON}.tensor_model_parallel_size"
SP_KEY = f"{MEGATRON}.sequence_parallel"
CP_KEY = f"{MEGATRON}.context_parallel_size"
DYN_KEY = f"{VERL_ACTOR}.use_dynamic_bsz"
LP_DYN_KEY = f"{VERL_ROLLOUT}.log_prob_use_dynamic_bsz"
OFFLOAD = "CPU offload (parameters, gradients or optimizer states kept in host memory)"


def _any(value: Any, ctx: Mapping[str, Any]) -> bool:
    return True


def _tp(ctx: Mapping[str, Any]) -> int:
    tp = ctx.get(TP_KEY, 1)
    return tp if isinstance(tp, int) and not isinstance(tp, bool) else 1


def _sequence_parallel(ctx: Mapping[str, Any]) -> bool:
    """verl's McoreEngineConfig defaults sequence_parallel to true and its __post_init__
    turns it off at TP 1 (workers/config/engine.py); the legacy converter sets it to TP > 1
    (models/mcore/config_converter.py)."""
    return _tp(ctx) > 1 and ctx.get(SP_KEY, True) is not False


def _sp_note(ctx: Mapping[str, Any]) -> str:
    sp = _sequence_parallel(ctx)
    return (
        f"sequence parallel {'on' if sp else 'off'}: verl's Megatron engine turns it on with "
        "TP > 1 unless actor.megatron.sequence_parallel is false (workers/config/engine.py "
        "McoreEngineConfig.__post_init__ turns it off at TP 1)"
    )


def _verl_tp(value: Any, ctx: Mapping[str, Any]) -> Translation:
    tp = as_int(value)
    return Translation(
        (
            ("policy.megatron.tensor_model_parallel_size", tp),
            ("policy.megatron.sequence_parallel", _sequence_parallel({**ctx, TP_KEY: tp})),
        ),
        "same meaning; " + _sp_note({**ctx, TP_KEY: tp}),
    )


def _verl_sp(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if not isinstance(value, bool):
        raise Untranslatable(f"{value!r}: expected true or false")
    sp = _sequence_parallel({**ctx, SP_KEY: value})
    return Translation(
        (("policy.megatron.sequence_parallel", sp),), _sp_note({**ctx, SP_KEY: value})
    )


def _verl_ulysses(value: Any, ctx: Mapping[str, Any]) -> Translation:
    size = as_int(value)
    megatron_cp = ctx.get(CP_KEY)
    if size > 1 and isinstance(megatron_cp, int) and megatron_cp > 1:
        raise Untranslatable("both Ulysses and Megatron context parallel are set")
    return Translation(
        (("policy.megatron.context_parallel_size", size),),
        f"{size}: each sequence split over {size} ranks, as our context parallel (CP); the same "
        "math (exact attention over the whole sequence), another mechanism: verl's FSDP "
        "Ulysses exchanges heads all-to-all around attention, our Megatron CP passes K/V "
        "around a ring, so the communication differs, the 1/N share of activations does not",
    )


def _verl_etp(value: Any, ctx: Mapping[str, Any]) -> bool:
    # Ours builds the experts with expert_tensor_parallel_size = TP (config/rank_groups.py);
    # verl's null means the same (Megatron's default: ETP = TP).
    return value is None or value == _tp(ctx)


def _recompute(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """Megatron's recompute_granularity as verl passes it (override_transformer_config);
    ours: selective = core attention, full = uniform, one layer per unit (megatron/model.py
    _recompute_settings)."""
    if value is None:
        return Translation((("policy.megatron.recompute_granularity", "none"),), "null: none")
    method = ctx.get(f"{OTC}.recompute_method")
    layers = ctx.get(f"{OTC}.recompute_num_layers")
    modules = ctx.get(f"{OTC}.recompute_modules", ["core_attn"])
    if value == "full" and method in (None, "uniform") and layers in (None, 1):
        return Translation(
            (("policy.megatron.recompute_granularity", "full"),),
            "same meaning: full recompute, uniform, one layer per unit",
        )
    if value == "selective" and list(modules or ["core_attn"]) == ["core_attn"]:
        return Translation(
            (("policy.megatron.recompute_granularity", "selective"),),
            "same meaning: selective recompute of core attention",
        )
    raise Untranslatable(
        f"needs recompute {value} with method {method}, {layers} layer(s), modules {modules}, "
        "which dapo-megatron lacks (here: none, selective = core attention, full = uniform "
        "over one layer)"
    )


def _fsdp(ctx: Mapping[str, Any]) -> bool:
    """An FSDP-worker config: verl's actor strategy fsdp/fsdp2 (ppo_trainer.yaml), seen by
    its fsdp_config keys or the strategy key."""
    strategy = ctx.get(f"{VERL_ACTOR}.strategy")
    if isinstance(strategy, str):
        return strategy.startswith("fsdp")
    return any(k.startswith(f"{VERL_ACTOR}.fsdp_config.") for k in ctx)


def _gradient_checkpointing(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if not _fsdp(ctx):
        return Translation((), "not read by verl's Megatron workers (recompute_granularity is)")
    if not isinstance(value, bool):
        raise Untranslatable(f"{value!r}: expected true or false")
    ours = "full" if value else "none"
    return Translation(
        (("policy.megatron.recompute_granularity", ours),),
        f"FSDP worker: {'HF gradient checkpointing recomputes every decoder layer (our full)' if value else 'no recompute'}",
    )


def _recompute_part(value: Any, ctx: Mapping[str, Any]) -> Translation:
    return Translation((), "read with recompute_granularity")


def _dynamic_on(ctx: Mapping[str, Any], key: str) -> bool:
    """Whether `key` (actor.use_dynamic_bsz or rollout.log_prob_use_dynamic_bsz) is on; the
    latter defaults to the former (_generated_ppo_megatron_trainer.yaml oc.select)."""
    if key != DYN_KEY and key not in ctx:
        key = DYN_KEY
    return ctx.get(key) is True


def _micro(ours: str, dyn_key: str) -> Any:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        if _dynamic_on(ctx, dyn_key):
            return Translation((), f"not read: {dyn_key} is true (token budgets decide)")
        return Translation(((ours, as_int(value)),), "same meaning: samples per GPU")

    return convert


def _dynamic(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """verl's dynamic batch: micro-batches of at most about ppo_max_token_len_per_gpu tokens
    per GPU (x CP in the Megatron actor: megatron_actor.py `max_token_len *
    context_parallel_size`): seqlen_balancing.py rearrange_micro_batches makes
    ceil(tokens / budget) micro-batches and balances them (a micro-batch may pass the budget
    a little); ours packs whole sequences up to the budget (policy.max_tokens_per_microbatch),
    so a micro-batch holds at most as many tokens: the same memory bound per micro-batch."""
    if value is not True:
        return Translation((), "padded micro-batches of ppo_micro_batch_size_per_gpu, as here")
    budget = ctx.get(f"{VERL_ACTOR}.ppo_max_token_len_per_gpu", 16384)
    # the sequence is split over CP ranks: megatron_actor.py multiplies the budget by
    # context_parallel_size, dp_actor.py (FSDP) by ulysses_sequence_parallel_size
    ulysses = ctx.get(f"{VERL_ACTOR}.ulysses_sequence_parallel_size", 1)
    if _fsdp(ctx) and isinstance(ulysses, int) and ulysses > 1:
        cp, actor, name = ulysses, "dp_actor.py", "Ulysses size"
    else:
        cp = ctx.get(CP_KEY, 1)
        cp = cp if isinstance(cp, int) and cp > 0 else 1
        actor, name = "megatron_actor.py", "CP"
    tokens = as_int(budget) * cp
    return Translation(
        (("policy.max_tokens_per_microbatch", tokens),),
        f"sequence packing with a token budget: ppo_max_token_len_per_gpu {budget} x {name} "
        f"{cp} ({actor}); verl balances ceil(tokens / budget) micro-batches "
        "(seqlen_balancing.py rearrange_micro_batches), ours packs up to the budget",
    )


def _same_as_actor(actor_key: str, default: Any) -> Any:
    def accept(value: Any, ctx: Mapping[str, Any]) -> bool:
        return bool(value == ctx.get(actor_key, default))

    return accept


def _engine_name(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value == "vllm":
        return Translation((("generation.backend", "vllm"),), "same engine: vLLM")
    raise Untranslatable(
        f"needs the {value} inference engine, which dapo-megatron lacks (here: vllm)"
    )


def _max_model_len(value: Any, ctx: Mapping[str, Any]) -> bool:
    total = as_int(ctx.get("data.max_prompt_length", 512)) + as_int(
        ctx.get("data.max_response_length", 512)
    )
    return value is None or (isinstance(value, int) and value >= total)


def _kernel(key: str) -> ForeignKey:
    return as_here(VERL, key, "a kernel choice", _any, "a kernel or fusion choice: the same math")


def _offload(key: str) -> ForeignKey:
    return as_here(VERL, key, OFFLOAD, off(False), "parameters, gradients and optimizer on GPU")


def _ref_same(key: str, actor_key: str, default: Any) -> ForeignKey:
    return as_here(
        VERL,
        key,
        "a reference model with a layout of its own",
        _same_as_actor(actor_key, default),
        "the reference model has the policy's layout",
    )


_KERNELS = (
    "apply_rope_fusion",
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "masked_softmax_fusion",
    "gradient_accumulation_fusion",
    "persist_layer_norm",
    "deallocate_pipeline_outputs",
    "attention_backend",
    "use_flash_attn",
    "moe_permute_fusion",
    "moe_grouped_gemm",
    "moe_enable_deepep",
    "moe_token_dispatcher_type",
    "moe_shared_expert_overlap",
)

VERL_LAYOUT_KEYS: tuple[ForeignKey, ...] = (
    custom(
        VERL,
        TP_KEY,
        "policy.megatron.tensor_model_parallel_size (+ sequence_parallel)",
        "same meaning; sequence parallel on with TP > 1, as verl's Megatron engine",
        _verl_tp,
    ),
    custom(
        VERL,
        SP_KEY,
        "policy.megatron.sequence_parallel",
        "same meaning with TP > 1 (verl turns it off at TP 1)",
        _verl_sp,
    ),
    same(
        VERL,
        f"{MEGATRON}.pipeline_model_parallel_size",
        "policy.megatron.pipeline_model_parallel_size",
    ),
    same(VERL, CP_KEY, "policy.megatron.context_parallel_size"),
    same(
        VERL, f"{MEGATRON}.expert_model_parallel_size", "policy.megatron.expert_model_parallel_size"
    ),
    as_here(
        VERL,
        f"{MEGATRON}.expert_tensor_parallel_size",
        "an expert tensor-parallel size other than the tensor-parallel size",
        _verl_etp,
        "experts split over the policy's TP ranks (null there: the same)",
    ),
    as_here(
        VERL,
        f"{MEGATRON}.virtual_pipeline_model_parallel_size",
        "virtual pipeline stages (interleaved 1F1B)",
        off(None),
        "one model chunk per pipeline stage",
    ),
    as_here(
        VERL,
        f"{MEGATRON}.use_distributed_optimizer",
        "a replicated optimizer",
        off(True),
        "optimizer states sharded over DP ranks",
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.ulysses_sequence_parallel_size",
        "policy.megatron.context_parallel_size",
        "Ulysses (all-to-all over heads) vs our ring CP: the same math, other communication",
        _verl_ulysses,
    ),
    _offload(f"{MEGATRON}.param_offload"),
    _offload(f"{MEGATRON}.grad_offload"),
    _offload(f"{MEGATRON}.optimizer_offload"),
    _offload(f"{VERL_ACTOR}.fsdp_config.param_offload"),
    _offload(f"{VERL_ACTOR}.fsdp_config.optimizer_offload"),
    _offload(f"{VERL_ACTOR}.optim.override_optimizer_config.optimizer_cpu_offload"),
    as_here(
        VERL,
        f"{VERL_ACTOR}.optim.override_optimizer_config.use_precision_aware_optimizer",
        "a precision-aware optimizer (low-precision optimizer states)",
        off(False),
        "fp32 optimizer states",
    ),
    as_here(
        VERL,
        f"{VERL_ACTOR}.fsdp_config.fsdp_size",
        "FSDP sharding groups",
        off(-1),
        "the optimizer is sharded over all DP ranks",
    ),
    custom(
        VERL,
        f"{OTC}.recompute_granularity",
        "policy.megatron.recompute_granularity",
        "full (uniform, 1 layer) and selective (core attention): same; other shapes refused",
        _recompute,
    ),
    custom(
        VERL, f"{OTC}.recompute_method", "(read with recompute_granularity)", "", _recompute_part
    ),
    custom(
        VERL,
        f"{OTC}.recompute_num_layers",
        "(read with recompute_granularity)",
        "",
        _recompute_part,
    ),
    custom(
        VERL, f"{OTC}.recompute_modules", "(read with recompute_granularity)", "", _recompute_part
    ),
    custom(
        VERL,
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "policy.megatron.recompute_granularity (FSDP workers)",
        "FSDP: true is HF gradient checkpointing, every decoder layer recomputed (our full); "
        "Megatron workers do not read it",
        _gradient_checkpointing,
    ),
    *(_kernel(f"{OTC}.{k}") for k in _KERNELS),
    as_here(
        VERL,
        f"{OTC}.moe_router_dtype",
        "a router dtype other than fp32",
        off("fp32"),
        "fp32 router logits",
    ),
    as_here(
        VERL,
        f"{OTC}.num_layers_in_first_pipeline_stage",
        "an uneven pipeline split",
        off(None),
        "layers split evenly over pipeline stages",
    ),
    as_here(
        VERL,
        f"{OTC}.num_layers_in_last_pipeline_stage",
        "an uneven pipeline split",
        off(None),
        "layers split evenly over pipeline stages",
    ),
    as_here(
        VERL,
        f"{OTC}.account_for_embedding_in_pipeline_split",
        "an uneven pipeline split",
        off(False),
        "layers split evenly over pipeline stages",
    ),
    as_here(
        VERL,
        f"{OTC}.account_for_loss_in_pipeline_split",
        "an uneven pipeline split",
        off(False),
        "layers split evenly over pipeline stages",
    ),
    as_here(
        VERL,
        f"{OTC}.context_parallel_size",
        "an override of CP",
        _same_as_actor(CP_KEY, 1),
        "CP as set",
    ),
    _kernel("actor_rollout_ref.model.use_fused_kernels"),
    _kernel("actor_rollout_ref.model.use_remove_padding"),
    _kernel(f"{MEGATRON}.use_remove_padding"),
    as_here(
        VERL, f"{MEGATRON}.use_mbridge", "a weight converter", _any, "HF weights read directly"
    ),
    as_here(
        VERL, f"{MEGATRON}.vanilla_mbridge", "a weight converter", _any, "HF weights read directly"
    ),
    as_here(
        VERL,
        f"{MEGATRON}.use_dist_checkpointing",
        "a weight converter",
        _any,
        "weights read from the HF checkpoint (verl's dist checkpoint holds the same weights)",
    ),
    as_here(VERL, f"{MEGATRON}.dist_checkpointing_path", "a weight converter", _any, "as above"),
    custom(
        VERL,
        f"{VERL_ACTOR}.ppo_micro_batch_size_per_gpu",
        "policy.train_micro_batch_size",
        "same meaning (samples per GPU) without use_dynamic_bsz",
        _micro("policy.train_micro_batch_size", DYN_KEY),
    ),
    custom(
        VERL,
        f"{VERL_ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        "policy.logprob_micro_batch_size",
        "same meaning (samples per GPU) without log_prob_use_dynamic_bsz",
        _micro("policy.logprob_micro_batch_size", f"{VERL_ROLLOUT}.log_prob_use_dynamic_bsz"),
    ),
    custom(
        VERL,
        DYN_KEY,
        "policy.max_tokens_per_microbatch",
        "true: a token budget per micro-batch, ppo_max_token_len_per_gpu x CP",
        _dynamic,
    ),
    as_here(
        VERL,
        f"{VERL_ACTOR}.ppo_max_token_len_per_gpu",
        "a token budget",
        _any,
        "read with use_dynamic_bsz",
    ),
    as_here(
        VERL,
        f"{VERL_ROLLOUT}.log_prob_use_dynamic_bsz",
        "logprob micro-batches shaped unlike training ones",
        _same_as_actor(DYN_KEY, False),
        "logprob passes use the training micro-batch shape (packed or padded)",
    ),
    as_here(
        VERL,
        f"{VERL_ROLLOUT}.log_prob_max_token_len_per_gpu",
        "a logprob token budget other than the training one",
        lambda v, ctx: (
            ctx.get(f"{VERL_ROLLOUT}.log_prob_use_dynamic_bsz") is not True
            or v == ctx.get(f"{VERL_ACTOR}.ppo_max_token_len_per_gpu", 16384)
        ),
        "logprob passes pack to policy.max_tokens_per_microbatch",
    ),
    # the reference model's layout (live only with a KL term: `inactive`)
    _ref_same(f"{VERL_REF}.megatron.tensor_model_parallel_size", TP_KEY, 1),
    _ref_same(
        f"{VERL_REF}.megatron.pipeline_model_parallel_size",
        f"{MEGATRON}.pipeline_model_parallel_size",
        1,
    ),
    _ref_same(f"{VERL_REF}.megatron.context_parallel_size", CP_KEY, 1),
    _ref_same(
        f"{VERL_REF}.megatron.expert_model_parallel_size",
        f"{MEGATRON}.expert_model_parallel_size",
        1,
    ),
    _ref_same(
        f"{VERL_REF}.megatron.expert_tensor_parallel_size",
        f"{MEGATRON}.expert_tensor_parallel_size",
        None,
    ),
    _ref_same(
        f"{VERL_REF}.megatron.virtual_pipeline_model_parallel_size",
        f"{MEGATRON}.virtual_pipeline_model_parallel_size",
        None,
    ),
    _ref_same(
        f"{VERL_REF}.ulysses_sequence_parallel_size",
        f"{VERL_ACTOR}.ulysses_sequence_parallel_size",
        1,
    ),
    _ref_same(
        f"{VERL_REF}.megatron.use_dist_checkpointing", f"{MEGATRON}.use_dist_checkpointing", False
    ),
    _ref_same(
        f"{VERL_REF}.megatron.dist_checkpointing_path", f"{MEGATRON}.dist_checkpointing_path", None
    ),
    _offload(f"{VERL_REF}.megatron.param_offload"),
    _offload(f"{VERL_REF}.fsdp_config.param_offload"),
    _ref_same(
        f"{VERL_REF}.log_prob_micro_batch_size_per_gpu",
        f"{VERL_ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        None,
    ),
    _ref_same(
        f"{VERL_REF}.log_prob_use_dynamic_bsz", f"{VERL_ROLLOUT}.log_prob_use_dynamic_bsz", False
    ),
    _ref_same(
        f"{VERL_REF}.log_prob_max_token_len_per_gpu",
        f"{VERL_ROLLOUT}.log_prob_max_token_len_per_gpu",
        16384,
    ),
    # the inference engine
    custom(
        VERL,
        f"{VERL_ROLLOUT}.name",
        "generation.backend",
        "vllm: same; others refused",
        _engine_name,
    ),
    as_here(
        VERL,
        f"{VERL_ROLLOUT}.mode",
        "a rollout mode",
        off("async", "sync"),
        "synchronous training on the policy's own rollouts (verl's async mode is its "
        "server-based rollout, still on-policy)",
    ),
    same(VERL, f"{VERL_ROLLOUT}.enforce_eager", "generation.engine.enforce_eager"),
    same(VERL, f"{VERL_ROLLOUT}.max_num_seqs", "generation.engine.max_num_seqs"),
    as_here(
        VERL,
        f"{VERL_ROLLOUT}.dtype",
        "an engine precision other than the policy's",
        lambda v, ctx: v == ctx.get(f"{MEGATRON}.dtype", "bfloat16"),
        "the engine runs in the policy's precision (workers/generation_worker.py)",
    ),
    as_here(
        VERL,
        f"{VERL_ROLLOUT}.max_model_len",
        "a context shorter than prompt + response",
        _max_model_len,
        "prompt + response fit",
    ),
    *(
        as_here(
            VERL,
            f"{VERL_ROLLOUT}.{k}",
            "an engine setting",
            _any,
            "vLLM's own scheduling (no effect on samples)",
        )
        for k in (
            "enable_chunked_prefill",
            "max_num_batched_tokens",
            "enable_prefix_caching",
            "free_cache_engine",
            "load_format",
            "calculate_log_probs",
            "checkpoint_engine.update_weights_bucket_megabytes",
        )
    ),
    as_here(VERL, "actor_rollout_ref.nccl_timeout", "a timeout", _any, "run.collective_timeout_s"),
)
"""verl's layout, memory and engine keys."""


def layout_inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Layout keys not live in verl: the reference model's (built only with a KL term:
    trainer/ppo/utils.py need_reference_policy), dynamic-batch budgets while it is off."""
    out: dict[str, str] = {}
    kl = (
        flat.get(f"{VERL_ACTOR}.use_kl_loss") is True
        or flat.get("algorithm.use_kl_in_reward") is True
    )
    for key in flat:
        if key.startswith(f"{VERL_REF}.") and not kl:
            out[key] = "not live: no reference model without use_kl_loss or use_kl_in_reward"
    if flat.get(DYN_KEY) is not True:
        out[f"{VERL_ACTOR}.ppo_max_token_len_per_gpu"] = "not live: use_dynamic_bsz is false"
    if not _dynamic_on(flat, LP_DYN_KEY):
        out[f"{VERL_ROLLOUT}.log_prob_max_token_len_per_gpu"] = (
            "not live: log_prob_use_dynamic_bsz is false"
        )
    return {k: v for k, v in out.items() if k in flat}
