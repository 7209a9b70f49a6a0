"""NeMo RL's generation-engine keys: the backend, where the engines run (colocated or on
GPUs of their own), vLLM's and Megatron inference's settings, and how trained weights reach
the engines; nemo_layout.py joins them into NEMO_LAYOUT_KEYS.

What each key does in NeMo RL was read at the commit of tests/data/foreign/nemo-rl/SOURCES.md:
examples/configs/grpo_math_1B.yaml (the base of every recipe), nemo_rl/algorithms/grpo.py
setup() (the cluster split), nemo_rl/models/generation/vllm/ (the vLLM engine) and
nemo_rl/models/generation/megatron/ (Megatron inference).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    custom,
    off,
    same,
)
from dapo_megatron.migrate.shared_keys import NEMO

GEN = "policy.generation"
VLLM = f"{GEN}.vllm_cfg"
KWARGS = f"{GEN}.vllm_kwargs"
MCORE = f"{GEN}.mcore_generation_config"
COLOCATED = f"{GEN}.colocated"
MEGATRON = "policy.megatron_cfg"
ENGINE_SPEED = "an engine speed or memory choice: the same samples"


def any_value(value: Any, ctx: Mapping[str, Any]) -> bool:
    """An `as_here` predicate for a key whose every value does what we do (speed only)."""
    return True


def speed(key: str, here: str = ENGINE_SPEED) -> ForeignKey:
    """A key that changes speed or memory only, never what is generated or learned."""
    return as_here(NEMO, key, "a speed setting", any_value, here)


def _backend(value: Any, ctx: Mapping[str, Any]) -> Translation:
    # grpo.py setup(): "vllm" builds VllmGeneration, "megatron" MegatronGeneration (the
    # policy's own Megatron model, nemo_rl/models/generation/megatron/), others TRT-LLM,
    # SGLang, Dynamo. Ours: generation.backend vllm | megatron (configs/dapo_base.yaml).
    if value == "vllm":
        return Translation((("generation.backend", "vllm"),), "same engine: vLLM")
    if value == "megatron":
        return Translation(
            (("generation.backend", "megatron"),),
            "same engine: Megatron-Core inference of the policy's weights (colocated: the "
            "policy's DP replicas generate, as NeMo RL's MegatronGeneration)",
        )
    raise Untranslatable(
        f"needs the {value} inference engine, which dapo-megatron lacks (here: vllm or megatron)"
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _generation_devices(ctx: Mapping[str, Any]) -> tuple[int, str]:
    """grpo.py setup(), non-colocated: on one node the engines get
    colocated.resources.gpus_per_node GPUs and the policy the rest of the node; on more
    nodes the engines get colocated.resources.num_nodes whole nodes (resources.gpus_per_node
    must equal cluster.gpus_per_node) and the policy the other nodes."""
    nodes = _int_or_none(ctx.get("cluster.num_nodes", 1))
    per_node = _int_or_none(ctx.get("cluster.gpus_per_node"))
    res_gpus = _int_or_none(ctx.get(f"{COLOCATED}.resources.gpus_per_node"))
    res_nodes = ctx.get(f"{COLOCATED}.resources.num_nodes")
    if nodes is None or per_node is None or res_gpus is None or res_gpus <= 0:
        raise Untranslatable(
            "non-colocated generation needs cluster.num_nodes, cluster.gpus_per_node and "
            "policy.generation.colocated.resources.gpus_per_node > 0 (NeMo RL asserts it)"
        )
    if nodes == 1:
        if res_nodes not in (None, 1):
            raise Untranslatable(f"resources.num_nodes {res_nodes} on a 1-node cluster")
        return res_gpus, (
            f"{res_gpus} of the node's {per_node} GPUs (colocated.resources.gpus_per_node); "
            f"the policy gets the other {per_node - res_gpus}"
        )
    res = _int_or_none(res_nodes)
    if res is None or res <= 0 or res_gpus != per_node:
        raise Untranslatable(
            "on more than one node NeMo RL gives generation colocated.resources.num_nodes > 0 "
            "whole nodes (resources.gpus_per_node = cluster.gpus_per_node)"
        )
    return res * per_node, (
        f"{res} whole node(s) x {per_node} GPUs (colocated.resources.num_nodes); the policy "
        f"gets the other {nodes - res} node(s)"
    )


def _colocated(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is True:
        return Translation(
            (("cluster.colocated", True), ("cluster.generation_num_devices", 0)),
            "same meaning: the engines share the policy's GPUs (asleep while it trains)",
        )
    if value is not False:
        raise Untranslatable(f"{value!r}: expected true or false")
    devices, how = _generation_devices(ctx)
    return Translation(
        (("cluster.colocated", False), ("cluster.generation_num_devices", devices)),
        f"engines on GPUs of their own: {how}; cluster.num_nodes stays the whole cluster, "
        "as NeMo RL's (grpo.py setup)",
    )


def _read_with(key: str, owner: str) -> ForeignKey:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        return Translation((), f"read with {owner}")

    return custom(NEMO, key, f"(read with {owner})", f"read with `{owner}`", convert)


def _longest(ctx: Mapping[str, Any]) -> int | None:
    """The longest prompt + response NeMo RL trains: data.max_input_seq_length - 1 (a
    longer prompt is a stub, processors.py) + policy.generation.max_new_tokens."""
    prompt = _int_or_none(ctx.get("data.max_input_seq_length"))
    response = _int_or_none(ctx.get(f"{GEN}.max_new_tokens"))
    if prompt is None or response is None:
        return None
    return prompt - 1 + response


def _context_fits(value: Any, ctx: Mapping[str, Any]) -> bool:
    """The engine's context (vLLM's max_model_len) holds the longest prompt +
    policy.generation.max_new_tokens, or at least policy.max_total_sequence_length: then
    no response ends before the trainer's own length, which nemo_keys.py checks against
    prompt + response (and refuses, naming the per-prompt cap, where they do not fit)."""
    n = _int_or_none(value)
    if n is None:
        return False
    longest, total = _longest(ctx), _int_or_none(ctx.get("policy.max_total_sequence_length"))
    return (longest is not None and n >= longest) or (total is not None and n >= total)


def _same_precision(value: Any, ctx: Mapping[str, Any]) -> bool:
    return bool(value == ctx.get("policy.precision", "bfloat16"))


def _not_fp8(value: Any, ctx: Mapping[str, Any]) -> bool:
    return value in (0, None) or ctx.get(f"{VLLM}.precision") != "fp8"


def _logprobs_mode(value: Any, ctx: Mapping[str, Any]) -> bool:
    """NeMo RL's engine returns processed_logprobs (after temperature, top-p and top-k);
    ours log_softmax(z / T) over the whole vocabulary (docs/guides/rollouts.md). The two
    agree without top-p/top-k filtering, and NeMo RL reads them only for its
    importance-sampling correction (loss_fn.use_importance_sampling_correction) and
    metrics."""
    if value != "processed_logprobs":
        return False
    if ctx.get("loss_fn.use_importance_sampling_correction") is not True:
        return True
    top_p, top_k = ctx.get(f"{GEN}.top_p", 1.0), ctx.get(f"{GEN}.top_k")
    return top_p in (1, 1.0, None) and top_k in (None, 0, -1)


def _policy_layout(policy_key: str, default: Any) -> Any:
    """An inference layout key accepted when it equals the policy's (no resharding)."""

    def accept(value: Any, ctx: Mapping[str, Any]) -> bool:
        return value is None or value == ctx.get(f"{MEGATRON}.{policy_key}", default)

    return accept


_SPEC = "speculative decoding in the engine (a draft model or MTP heads proposing tokens)"
_RESHARD = "a Megatron inference layout other than the policy's (resharding for generation)"
_KV = "an engine KV cache sized in bytes (here: by generation.engine.gpu_memory_utilization)"
_REFIT = (
    "another weight transport: the same weights reach the engines (ours: "
    "generation.refit_transport auto, CUDA IPC colocated, NCCL broadcast split)"
)

NEMO_ENGINE_KEYS: tuple[ForeignKey, ...] = (
    custom(
        NEMO,
        f"{GEN}.backend",
        "generation.backend",
        "vllm and megatron: same engines; others (TRT-LLM, SGLang) refused",
        _backend,
    ),
    custom(
        NEMO,
        f"{COLOCATED}.enabled",
        "cluster.colocated (+ cluster.generation_num_devices)",
        "true: engines share the policy's GPUs; false: resources.gpus_per_node GPUs of a "
        "1-node cluster, else resources.num_nodes whole nodes (grpo.py setup)",
        _colocated,
    ),
    _read_with(f"{COLOCATED}.resources.gpus_per_node", f"{COLOCATED}.enabled"),
    _read_with(f"{COLOCATED}.resources.num_nodes", f"{COLOCATED}.enabled"),
    same(NEMO, f"{VLLM}.tensor_parallel_size", "generation.engine.tensor_parallel_size"),
    same(NEMO, f"{VLLM}.gpu_memory_utilization", "generation.engine.gpu_memory_utilization"),
    same(NEMO, f"{VLLM}.enforce_eager", "generation.engine.enforce_eager"),
    same(NEMO, f"{KWARGS}.max_num_seqs", "generation.engine.max_num_seqs"),
    as_here(
        NEMO,
        f"{VLLM}.max_model_len",
        "a context shorter than prompt + max_new_tokens (a response cap per prompt)",
        _context_fits,
        "the engine's context holds the longest prompt + generation.max_response_length",
    ),
    as_here(NEMO, f"{VLLM}.pipeline_parallel_size", "pipeline-parallel engines", off(1), "1"),
    speed(
        f"{VLLM}.expert_parallel_size",
        "an engine layout: vLLM's EP shards experts over the engine's ranks, ours shards each "
        "engine's experts over its TP ranks; the same samples, other memory (planned here)",
    ),
    speed(f"{VLLM}.enable_expert_parallel", "an engine layout (see expert_parallel_size)"),
    speed(
        f"{VLLM}.async_engine",
        "how requests reach vLLM (AsyncLLM or LLM): the same samples; asynchronous training "
        "is grpo.async_grpo's",
    ),
    as_here(
        NEMO,
        f"{VLLM}.precision",
        "FP8 (or other low-precision) rollouts",
        _same_precision,
        "the engine runs the policy's precision",
    ),
    as_here(NEMO, f"{VLLM}.kv_cache_dtype", "an FP8 KV cache", off("auto"), "auto"),
    as_here(
        NEMO,
        f"{VLLM}.logprobs_mode",
        "engine logprobs after top-p/top-k filtering (processed_logprobs) used for "
        "importance-sampling correction",
        _logprobs_mode,
        "the engine's logprobs are log_softmax(z / T) over the vocabulary; the same without "
        "top-p/top-k, and read by no loss without importance-sampling correction",
    ),
    speed(f"{VLLM}.load_format", "how the engine's first weights load; refit overwrites them"),
    speed(f"{VLLM}.use_deep_gemm", "a kernel choice (FP8 GEMMs): the same math"),
    as_here(NEMO, f"{VLLM}.num_first_layers_in_bf16", "FP8 rollouts", _not_fp8, "no FP8"),
    as_here(NEMO, f"{VLLM}.num_last_layers_in_bf16", "FP8 rollouts", _not_fp8, "no FP8"),
    speed(f"{VLLM}.quantization_ignored_layer_kws", "read by quantised rollouts only"),
    speed(f"{VLLM}.enable_prefix_caching", "KV reuse across prompts: the same samples"),
    speed(f"{VLLM}.reset_encoder_cache_after_weight_update", "multimodal encoders only"),
    *(
        speed(f"{VLLM}.env_vars.{name}", "an engine environment variable (kernels, buffers)")
        for name in (
            "NRL_REFIT_BUFFER_MEMORY_RATIO",
            "NRL_REFIT_NUM_BUFFERS",
            "VLLM_USE_FLASHINFER_MOE_FP16",
            "VLLM_USE_FLASHINFER_MOE_FP8",
            "VLLM_USE_RAY_V2_EXECUTOR_BACKEND",
        )
    ),
    as_here(
        NEMO, KWARGS, "extra vLLM engine arguments", lambda v, ctx: v == {}, "none beyond these"
    ),
    *(
        speed(f"{KWARGS}.{name}", "a kernel or scheduling choice of vLLM: the same samples")
        for name in (
            "moe_backend",
            "attention_backend",
            "attention_config.use_trtllm_attention",
            "compilation_config.backend",
            "compilation_config.custom_ops",
            "enable_chunked_prefill",
            "max_num_batched_tokens",
            "mamba_cache_mode",
            "mamba_ssm_cache_dtype",
        )
    ),
    speed(f"{KWARGS}.kv_cache_memory_bytes", _KV),
    *(
        as_here(NEMO, f"{KWARGS}.speculative_config.{name}", _SPEC, off(None), "none")
        for name in ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size")
    ),
    as_here(
        NEMO,
        f"{MCORE}.max_model_len",
        "a context shorter than prompt + max_new_tokens (a response cap per prompt)",
        _context_fits,
        "the engine's context holds the longest prompt + generation.max_response_length",
    ),
    *(
        speed(f"{MCORE}.{name}", "a speed or memory choice of Megatron inference")
        for name in (
            "cuda_graph_impl",
            "inference_cuda_graph_scope",
            "buffer_size_gb",
            "num_cuda_graphs",
            "block_size_tokens",
            "use_cuda_graphs_for_non_decode_steps",
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "max_tokens",
            "kv_cache_management_mode",
            "materialize_only_last_token_logits",
            "refit_backend",
            "unified_memory_level",
            "inference_grouped_gemm_backend",
            "activation_checkpointing",
        )
    ),
    as_here(NEMO, f"{MCORE}.num_speculative_tokens", _SPEC, off(0), "none"),
    as_here(NEMO, f"{MCORE}.parsers", "an OpenAI-compatible server", off([]), "none"),
    as_here(NEMO, f"{MCORE}.expose_http_server", "an OpenAI-compatible server", off(False), "no"),
    as_here(
        NEMO,
        f"{MCORE}.tensor_model_parallel_size",
        _RESHARD,
        _policy_layout("tensor_model_parallel_size", 1),
        "the policy's TP",
    ),
    as_here(
        NEMO,
        f"{MCORE}.expert_model_parallel_size",
        _RESHARD,
        _policy_layout("expert_model_parallel_size", 1),
        "the policy's EP",
    ),
    as_here(
        NEMO,
        f"{MCORE}.sequence_parallel",
        _RESHARD,
        _policy_layout("sequence_parallel", False),
        "the policy's sequence parallelism",
    ),
    as_here(
        NEMO,
        f"{MCORE}.moe_router_dtype",
        "an inference router dtype other than the policy's",
        _policy_layout("moe_router_dtype", "fp64"),
        "the policy's router",
    ),
    as_here(NEMO, f"{MCORE}.transformer_impl", _RESHARD, off(None), "the policy's layers"),
    as_here(NEMO, f"{MCORE}.moe_router_num_groups", "group-limited routing", off(None), "none"),
    as_here(NEMO, f"{MCORE}.moe_router_group_topk", "group-limited routing", off(None), "none"),
    speed(f"{GEN}.refit_transport", _REFIT),
    *(
        speed(f"{GEN}.refit_cfg.{name}", _REFIT)
        for name in (
            "nixl.backend_init_params",
            "nixl.backend_name",
            "nixl.device",
            "nixl.release_after_refit",
            "nixl.shard_expert_weights",
            "nixl.update_weights_bucket_memory_ratio",
            "sparse.baseline.in_memory",
            "sparse.delta_compression.encoding",
            "sparse.verify_samples_per_payload",
        )
    ),
    speed("policy.refit_buffer_size_gb", _REFIT),
)
"""NeMo RL's generation-engine keys."""


def engine_inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Engine keys NeMo RL does not read (key -> why): each backend's own settings under
    another backend (grpo.py setup builds one engine), and the dedicated resources of
    colocated engines ("only relevant when enabled is false", grpo_math_1B.yaml)."""
    dead: dict[str, str] = {}
    backend = flat.get(f"{GEN}.backend", "vllm")
    own = {
        f"{VLLM}.": "vllm",
        f"{KWARGS}": "vllm",
        f"{MCORE}.": "megatron",
        f"{GEN}.trtllm_cfg.": "trtllm",
        f"{GEN}.trtllm_kwargs": "trtllm",
        f"{GEN}.sglang_cfg.": "sglang",
    }
    colocated = flat.get(f"{COLOCATED}.enabled") is not False
    for key in flat:
        for prefix, name in own.items():
            if key.startswith(prefix) and backend != name:
                dead[key] = f"not live: policy.generation.backend is {backend}, not {name}"
        if colocated and key.startswith(f"{COLOCATED}.resources."):
            dead[key] = "not live: policy.generation.colocated.enabled is true"
    return dead
