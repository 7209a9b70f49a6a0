"""NeMo RL's policy.megatron_cfg layout, kernel, memory and MoE keys, with their converters;
nemo_layout.py joins them into NEMO_LAYOUT_KEYS.

What each key does in NeMo RL was read at the commit of tests/data/foreign/nemo-rl/SOURCES.md:
nemo_rl/models/megatron/setup.py (how megatron_cfg becomes Megatron-Core's TransformerConfig,
DDP and optimizer configs: _apply_parallelism_config, _apply_moe_config,
_apply_performance_config, _create_megatron_config) and examples/configs/grpo_math_1B.yaml.
Ours: megatron/model.py (transformer_config, _recompute_settings, _moe_settings),
megatron/optimizer.py (wrap_ddp), config/rank_groups.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from dapo_megatron.config.model_arch import PRESETS, preset_for_model
from dapo_megatron.migrate.dialects import (
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    choice,
    custom,
    mapped,
    off,
    same,
)
from dapo_megatron.migrate.nemo_engine import any_value
from dapo_megatron.migrate.shared_keys import NEMO

M = "policy.megatron_cfg"
DDP = f"{M}.distributed_data_parallel_config"
KERNEL = "a kernel or fusion choice: the same math"
RECOMPUTE = "policy.megatron.recompute_granularity"
LORA = "LoRA (parameter-efficient fine-tuning)"
OFFLOAD = "CPU offload (parameters, gradients, optimizer states or activations in host memory)"
Accept = Callable[[Any, Mapping[str, Any]], bool]

# ---------------------------------------------------------------------------------------
# Mixture-of-experts: the router settings matter only for a MoE model.

_MOE_NAME = re.compile(r"\d+(\.\d+)?b-?a\d+(\.\d+)?b|moe|mixtral|moonlight|deepseek-v|gpt-oss")


def is_moe(ctx: Mapping[str, Any]) -> bool:
    """Whether policy.model_name is a mixture-of-experts model: the architecture preset its
    name names (config/model_arch.py), else a MoE-looking name (30B-A3B, MoE, ...)."""
    name = ctx.get("policy.model_name")
    if not isinstance(name, str):
        return True  # unknown: the router keys are then checked as for a MoE model
    base = name.rstrip("/").rsplit("/", 1)[-1]
    preset = preset_for_model(base)
    if preset is not None:
        return PRESETS[preset].moe is not None
    return _MOE_NAME.search(base.lower()) is not None


def _dense_or(accept: Accept) -> Accept:
    """For a dense model a router key is not read; for a MoE model `accept` decides."""

    def check(value: Any, ctx: Mapping[str, Any]) -> bool:
        return not is_moe(ctx) or accept(value, ctx)

    return check


def _etp(value: Any, ctx: Mapping[str, Any]) -> bool:
    """Ours builds the experts with expert_tensor_parallel_size = TP (config/rank_groups.py,
    megatron/model.py); NeMo RL passes its own value (setup.py _apply_moe_config)."""
    tp = ctx.get(f"{M}.tensor_model_parallel_size", 1)
    return value is None or value == tp or not is_moe(ctx)


def _bias_update(value: Any, ctx: Mapping[str, Any]) -> bool:
    return value in (0, 0.0) or ctx.get(f"{M}.moe_router_enable_expert_bias") is not True


# ---------------------------------------------------------------------------------------
# Activation recompute: setup.py _apply_performance_config reads recompute_granularity
# only with activation_checkpointing true: "full" -> uniform, one layer per unit;
# "selective" -> recompute_modules (null: Megatron's ["core_attn"]). Ours
# (megatron/model.py _recompute_settings): none, selective = core attention, full = uniform
# over one layer.


def _recompute(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is False:
        return Translation(((RECOMPUTE, "none"),), "false: no activation recompute")
    if value is not True:
        raise Untranslatable(f"{value!r}: expected true or false")
    granularity = ctx.get(f"{M}.recompute_granularity", "full")
    modules = ctx.get(f"{M}.recompute_modules")
    if granularity == "full":
        return Translation(
            ((RECOMPUTE, "full"),), "same meaning: full recompute, uniform, one layer per unit"
        )
    if granularity == "selective" and modules in (None, ["core_attn"]):
        return Translation(
            ((RECOMPUTE, "selective"),), "same meaning: selective recompute of core attention"
        )
    raise Untranslatable(
        f"needs {granularity} recompute of {modules}, which dapo-megatron lacks (here: "
        "none, selective = core attention, full = every layer)"
    )


def _read_with(key: str, owner: str) -> ForeignKey:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        return Translation((), f"read with {owner}")

    return custom(NEMO, key, f"(read with {owner})", f"read with `{owner}`", convert)


_MTP = "multi-token prediction (MTP) layers"
_FP8 = "FP8 training"


def _mtp_off(value: Any, ctx: Mapping[str, Any]) -> bool:
    return ctx.get(f"{M}.mtp_num_layers") in (0, None)


def _kernel(key: str, here: str = KERNEL) -> ForeignKey:
    return as_here(NEMO, key, "a kernel choice", any_value, here)


def _same_dtype(value: Any, ctx: Mapping[str, Any]) -> bool:
    return bool(value == ctx.get("policy.precision", "bfloat16"))


def feature_part(key: str, feature: str) -> ForeignKey:
    """A setting of a feature we lack, read by NeMo RL only while the feature is on
    (nemo_layout.layout_inactive lists it as not live otherwise): refused naming it."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        raise Untranslatable(f"needs {feature}, which dapo-megatron lacks")

    return custom(NEMO, key, f"(none: {feature})", f"a setting of {feature}", convert)


NEMO_MEGATRON_KEYS: tuple[ForeignKey, ...] = (
    as_here(
        NEMO,
        f"{M}.enabled",
        "a policy backend other than Megatron-Core",
        off(True),
        "Megatron-Core",
    ),
    same(NEMO, f"{M}.tensor_model_parallel_size", "policy.megatron.tensor_model_parallel_size"),
    same(NEMO, f"{M}.pipeline_model_parallel_size", "policy.megatron.pipeline_model_parallel_size"),
    same(NEMO, f"{M}.context_parallel_size", "policy.megatron.context_parallel_size"),
    same(
        NEMO,
        f"{M}.sequence_parallel",
        "policy.megatron.sequence_parallel",
        "same meaning: setup.py passes it to Megatron-Core as given (base: false)",
    ),
    same(NEMO, f"{M}.expert_model_parallel_size", "policy.megatron.expert_model_parallel_size"),
    as_here(
        NEMO,
        f"{M}.expert_tensor_parallel_size",
        "an expert tensor-parallel size other than TP",
        _etp,
        "experts split over the TP ranks (expert TP = TP; not read for a dense model)",
    ),
    *(
        as_here(NEMO, f"{M}.{k}", "uneven pipeline stages", off(None), "even stages")
        for k in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")
    ),
    custom(
        NEMO,
        f"{M}.activation_checkpointing",
        RECOMPUTE,
        "false: none; true: recompute_granularity full (uniform, one layer) -> full, "
        "selective of core attention -> selective; other modules refused",
        _recompute,
    ),
    _read_with(f"{M}.recompute_granularity", f"{M}.activation_checkpointing"),
    _read_with(f"{M}.recompute_modules", f"{M}.activation_checkpointing"),
    as_here(
        NEMO,
        f"{M}.empty_unused_memory_level",
        "allocator housekeeping",
        any_value,
        "cached memory is released at phase changes",
    ),
    *(
        _kernel(f"{M}.{k}")
        for k in (
            "apply_rope_fusion",
            "bias_activation_fusion",
            "gradient_accumulation_fusion",
            "moe_permute_fusion",
            "moe_grouped_gemm",
            "moe_enable_deepep",
            "moe_shared_expert_overlap",
            "attention_backend",
            "use_fused_weighted_squared_relu",
            "fused_linear_logprobs_chunk_size",
            "cuda_graph_impl",
            "cuda_graph_modules",
            "cuda_graph_warmup_steps",
        )
    ),
    _kernel(
        f"{M}.use_fused_linear_logprobs",
        "log-probs from the hidden states in chunks (no full logits tensor): the same "
        "log-probs, less memory there (ours is planned with the full logits)",
    ),
    _kernel(
        f"{M}.defer_fp32_logits",
        "when the logits are cast to fp32 (train.py fp32_output): the same values",
    ),
    as_here(NEMO, f"{M}.fine_grained_activation_offloading", OFFLOAD, off(False), "on GPU"),
    as_here(
        NEMO,
        f"{M}.offload_modules",
        OFFLOAD,
        lambda v, ctx: v is None or ctx.get(f"{M}.fine_grained_activation_offloading") is False,
        "on GPU",
    ),
    mapped(
        NEMO,
        f"{M}.freeze_moe_router",
        "policy.moe.freeze_router",
        "same meaning: setup.py's pre-wrap hook sets the routers' requires_grad False "
        "(a dense model has none)",
        lambda v, ctx: bool(v),
    ),
    as_here(
        NEMO,
        f"{M}.moe_router_dtype",
        "fp64 MoE router logits",
        _dense_or(off("fp32")),
        "router logits in fp32 (megatron/model.py; not read for a dense model)",
    ),
    as_here(
        NEMO,
        f"{M}.moe_router_load_balancing_type",
        "a MoE load-balancing loss of NeMo RL's",
        _dense_or(off("none")),
        "no load-balancing loss (policy.moe.aux_loss_coef 0)",
    ),
    as_here(
        NEMO,
        f"{M}.moe_router_enable_expert_bias",
        "a router expert bias (aux-loss-free balancing)",
        _dense_or(off(False, None)),
        "no expert bias (the checkpoint's router)",
    ),
    as_here(
        NEMO,
        f"{M}.moe_router_bias_update_rate",
        "a router expert bias (aux-loss-free balancing)",
        _dense_or(_bias_update),
        "no expert-bias updates",
    ),
    choice(
        NEMO,
        f"{M}.moe_token_dispatcher_type",
        "policy.moe.token_dispatcher",
        {"alltoall": "alltoall", "allgather": "allgather", "flex": "alltoall"},
        "the same dispatch (flex is DeepEP's all-to-all kernel)",
    ),
    as_here(NEMO, f"{M}.use_gloo_process_groups", "a process-group choice", any_value, "NCCL"),
    as_here(NEMO, f"{M}.mtp_num_layers", _MTP, off(0), "no MTP layers"),
    *(
        as_here(NEMO, f"{M}.{k}", _MTP, _mtp_off, "no MTP layers")
        for k in ("mtp_loss_scaling_factor", "mtp_use_repeated_layer", "mtp_detach_heads")
    ),
    as_here(NEMO, f"{M}.peft.enabled", LORA, off(False), "full fine-tuning"),
    *(
        feature_part(f"{M}.peft.{k}", LORA)
        for k in (
            "target_modules",
            "exclude_modules",
            "dim",
            "alpha",
            "dropout",
            "dropout_position",
            "lora_A_init_method",
            "lora_B_init_method",
            "a2a_experimental",
            "lora_dtype",
        )
    ),
    as_here(NEMO, f"{M}.fp8_cfg.enabled", _FP8, off(False), "no FP8"),
    *(feature_part(f"{M}.fp8_cfg.{k}", _FP8) for k in ("fp8", "fp8_recipe", "fp8_param")),
    as_here(NEMO, f"{M}.env_vars", "worker environment variables", off(None), "none"),
    as_here(NEMO, f"{M}.env_vars.PYTORCH_CUDA_ALLOC_CONF", "allocator", any_value, "allocator"),
    *(
        as_here(NEMO, f"{M}.env_vars.{k}", "a worker setting", any_value, why)
        for k, why in (
            ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "read by FP8 kernels only"),
            ("NRL_REFIT_BUFFER_MEMORY_RATIO", "the weight-transfer buffer"),
            ("NRL_REFIT_NUM_BUFFERS", "the weight-transfer buffers"),
        )
    ),
    as_here(
        NEMO,
        f"{M}.pipeline_dtype",
        "a pipeline dtype other than the policy's",
        _same_dtype,
        "the policy's precision",
    ),
    as_here(NEMO, f"{M}.force_reconvert_from_hf", "a cache choice", any_value, "a fresh read"),
    as_here(NEMO, f"{M}.model_overrides", "Megatron model overrides", lambda v, c: v == {}, "none"),
    as_here(
        NEMO, f"{M}.converter_type", "a checkpoint converter", any_value, "config.json's class"
    ),
    as_here(
        NEMO, f"{M}.freeze_config.freeze_language_model", "a frozen model", off(False), "trained"
    ),
    *(
        as_here(NEMO, f"{M}.freeze_config.{k}", "a vision model", any_value, "no vision model")
        for k in ("freeze_vision_model", "freeze_vision_projection")
    ),
    as_here(
        NEMO,
        f"{DDP}.grad_reduce_in_fp32",
        "a gradient reduction dtype",
        any_value,
        "gradients reduced in fp32 (megatron/optimizer.py; NeMo RL's false reduces in bf16): "
        "the same gradient up to rounding",
    ),
    *(
        as_here(NEMO, f"{DDP}.{k}", "a communication overlap", any_value, "no overlap")
        for k in ("overlap_grad_reduce", "overlap_param_gather")
    ),
    as_here(NEMO, f"{DDP}.use_custom_fsdp", "Megatron FSDP", off(False), "DDP"),
    as_here(
        NEMO,
        f"{DDP}.data_parallel_sharding_strategy",
        "Megatron FSDP",
        lambda v, ctx: ctx.get(f"{DDP}.use_custom_fsdp") is not True,
        "not read without use_custom_fsdp",
    ),
)
"""NeMo RL's policy.megatron_cfg keys (optimizer and scheduler: nemo_schedule.py)."""
