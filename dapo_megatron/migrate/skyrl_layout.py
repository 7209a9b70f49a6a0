"""SkyRL's layout, placement, engine, data and bookkeeping keys in the table; skyrl_keys.py
joins them to SkyRL's algorithm keys.

Read at NovaSky-AI/SkyRL a9564572eb8e91076be43c1bd5e4615e3de17265: skyrl/train/config/
config.py (the dataclasses and their defaults), skyrl/backends/skyrl_train/workers/megatron/
megatron_worker.py (how the Megatron provider is built), examples/train/algorithms/dapo/
prepare_dapo_data.sh and data_preprocess_dapo_aime.py (the DAPO data files),
examples/train/gsm8k/gsm8k_dataset.py and skyrl-gym/skyrl_gym/envs/{aime,gsm8k}/ (the
rewards).
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
    off,
    same,
)
from dapo_megatron.migrate.shared_keys import GSM8K_TEMPLATE, SKYRL

MEG = "trainer.policy.megatron_config"
ENGINE = "generator.inference_engine"
TCK = f"{MEG}.transformer_config_kwargs"


def _megatron(ctx: Mapping[str, Any]) -> bool:
    """SkyRL's trainer.strategy (config.py TrainerConfig: "fsdp" by default)."""
    return bool(ctx.get("trainer.strategy", "fsdp") == "megatron")


def noop(key: str, here: str) -> ForeignKey:
    """A key whose every value leaves what is learned and our layout knobs alone (a kernel,
    a transport, bookkeeping, or a key read together with another entry): carried with
    nothing to set, `here` saying why."""
    return as_here(SKYRL, key, "nothing", lambda v, ctx: True, here)


def only(
    key: str, feature: str, accept: Callable[[Any, Mapping[str, Any]], bool], here: str
) -> ForeignKey:
    """as_here for SkyRL: accepted values need nothing, any other needs `feature`."""
    return as_here(SKYRL, key, feature, accept, here)


# ---------------------------------------------------------------------------------------
# Megatron layout


def _tp(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """megatron_worker.py: `provider.sequence_parallel = tensor_model_parallel_size > 1`, so
    SkyRL's Megatron policy always runs sequence parallel when TP > 1."""
    tp = as_int(value)
    sp = tp > 1 and _megatron(ctx)
    return Translation(
        (
            ("policy.megatron.tensor_model_parallel_size", tp),
            ("policy.megatron.sequence_parallel", sp),
        ),
        f"same meaning; sequence parallel {'on' if sp else 'off'}: SkyRL's Megatron worker "
        "turns it on whenever TP > 1 (megatron_worker.py)",
    )


def _etp(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """Null lets Megatron use the TP size for experts (config.py MegatronConfig); ours always
    does (megatron/model.py passes expert_tensor_parallel_size = TP)."""
    tp = ctx.get(f"{MEG}.tensor_model_parallel_size", 1)
    if value is None or value == tp:
        return Translation((), "experts split over the TP ranks, as here")
    raise Untranslatable(
        f"needs an expert tensor-parallel size ({value}) apart from TP ({tp}), which "
        "dapo-megatron lacks (here: experts use the TP size)"
    )


def _recompute(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """trainer.gradient_checkpointing (default true) keeps transformer_config_kwargs'
    recompute settings, whose defaults are full / uniform / 1 layer (config.py
    DEFAULT_TRANSFORMER_CONFIG_KWARGS); false clears them (megatron_worker.py). Ours: full
    is uniform over 1-layer chunks (megatron/model.py), selective the attention core."""
    if not _megatron(ctx):
        return Translation((), "FSDP's activation checkpointing (read with trainer.strategy)")
    if value is False:
        return Translation((("policy.megatron.recompute_granularity", "none"),), "no recompute")
    gran = ctx.get(f"{TCK}.recompute_granularity", "full")
    method = ctx.get(f"{TCK}.recompute_method", "uniform")
    layers = ctx.get(f"{TCK}.recompute_num_layers", 1)
    if gran is None:
        return Translation((("policy.megatron.recompute_granularity", "none"),), "no recompute")
    if gran == "selective":
        return Translation(
            (("policy.megatron.recompute_granularity", "selective"),),
            "selective recompute of the attention core, as here",
        )
    if gran == "full" and method == "uniform" and layers == 1:
        return Translation(
            (("policy.megatron.recompute_granularity", "full"),),
            "full recompute, uniform over 1-layer chunks (SkyRL's default kwargs), as ours",
        )
    raise Untranslatable(
        f"needs recompute {gran}/{method}/{layers} layers, which dapo-megatron lacks (here: "
        "none, selective, or full uniform over 1-layer chunks)"
    )


# ---------------------------------------------------------------------------------------
# Placement: SkyRL places the policy on policy_num_nodes x policy_num_gpus_per_node GPUs;
# colocate_all puts the engines on the same GPUs, otherwise the engines take
# num_engines x their TP x PP x DP GPUs of their own (config.py PlacementConfig).


def _placement(value: Any, ctx: Mapping[str, Any]) -> Translation:
    nodes = as_int(ctx.get("trainer.placement.policy_num_nodes", 1))
    gpus = as_int(ctx.get("trainer.placement.policy_num_gpus_per_node", 1))
    if value is not False:
        return Translation(
            (
                ("cluster.num_nodes", nodes),
                ("cluster.gpus_per_node", gpus),
                ("cluster.colocated", True),
            ),
            f"colocated: the policy and the engines share {nodes} node(s) x {gpus} GPU(s)",
        )
    engine_gpus = 1
    for key in (
        "num_engines",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
    ):
        engine_gpus *= as_int(ctx.get(f"{ENGINE}.{key}", 1))
    if nodes != 1:
        raise Untranslatable(
            f"needs engines on GPUs of their own beside {nodes} policy nodes, which "
            "dapo-megatron lacks (here: a split cluster gives generation some devices of the "
            "same nodes, cluster.generation_num_devices)"
        )
    return Translation(
        (
            ("cluster.num_nodes", 1),
            ("cluster.gpus_per_node", gpus + engine_gpus),
            ("cluster.colocated", False),
            ("cluster.generation_num_devices", engine_gpus),
        ),
        f"split: {gpus} policy GPU(s) and {engine_gpus} engine GPU(s) on one node",
    )


# ---------------------------------------------------------------------------------------
# Data: SkyRL's DAPO scripts read the files prepare_dapo_data.sh downloads from the hub
# (dapo-math-17k.parquet, aime-2024.parquet) or their "-cleaned" copies from
# data_preprocess_dapo_aime.py (rows deduplicated, and prompts whose rows disagree on the
# answer dropped; ours keeps the first row of each prompt, data/hub_datasets.py).

_DAPO_FILES = {
    "dapo-math-17k.parquet": "hf://BytedTsinghua-SIA/DAPO-Math-17k",
    "dapo-math-17k-cleaned.parquet": "hf://BytedTsinghua-SIA/DAPO-Math-17k",
    "aime-2024.parquet": "hf://BytedTsinghua-SIA/AIME-2024",
    "aime-2024-cleaned.parquet": "hf://BytedTsinghua-SIA/AIME-2024",
}


_GSM8K_FILES = {"train.parquet": "train", "validation.parquet": "test"}
"""examples/train/gsm8k/gsm8k_dataset.py writes openai/gsm8k's train and test splits."""


def _data(ours: str) -> Callable[[Any, Mapping[str, Any]], Translation]:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        files = value if isinstance(value, list) else [value]
        if len(files) != 1 or not isinstance(files[0], str):
            raise Untranslatable(
                f"needs {len(files)} data files in one set, which dapo-megatron lacks (here: one)"
            )
        path = files[0]
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if name in _DAPO_FILES:
            hub = _DAPO_FILES[name]
            return Translation(
                ((ours, hub), ("data.format", "dapo_math")),
                f"{name} is the file SkyRL's prepare_dapo_data.sh downloads from {hub[5:]} "
                "(recognised by its name); the -cleaned copy also drops prompts whose "
                "repeats disagree on the answer, ours keeps each prompt's first row",
            )
        split = _GSM8K_FILES.get(name)
        if "/gsm8k/" in path and split is not None:
            return Translation(
                (
                    (ours, f"hf://openai/gsm8k:{split}"),
                    ("data.format", "gsm8k"),
                    ("data.prompt_template", GSM8K_TEMPLATE),
                ),
                f"{name} is openai/gsm8k (main) split {split}, written by SkyRL's "
                "examples/train/gsm8k/gsm8k_dataset.py (recognised by its name), each question "
                "+ ' ' + its instruction (data.prompt_template)",
            )
        raise Untranslatable(
            f"{path} is a dataset file we cannot identify; set {ours} (and data.format) by hand"
        )

    return convert


def _env(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """skyrl_gym/envs/aime/utils.py compute_score: 1.0 when DAPO's `Answer:` check passes,
    else -1.0 (the last 300 characters read); ours: the math verifier's 1/0 score mapped to
    [-1, 1] by dapo.reward_scaling (configs/dapo_base.yaml)."""
    if value == "aime":
        return Translation(
            (
                ("reward.verifier", "math"),
                ("dapo.reward_scaling.enabled", True),
                ("dapo.reward_scaling.target_min", -1.0),
                ("dapo.reward_scaling.target_max", 1.0),
            ),
            "the DAPO math reward, +1 correct / -1 otherwise; ours also accepts a final "
            "\\boxed{} and math-verify equivalents of the `Answer:` line",
        )
    if value == "gsm8k":
        return Translation(
            (("reward.verifier", "gsm8k_skyrl"),),
            "the same reward: envs/gsm8k/utils.py compute_score, the first `#### N` of the "
            "response against the ground truth as text, else 0 (rewards/gsm8k_strict.py)",
        )
    raise Untranslatable(f"needs SkyRL's {value!r} environment, which dapo-megatron lacks")


def _backend(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value == "vllm":
        return Translation((("generation.backend", "vllm"),), "same engine: vLLM")
    raise Untranslatable(f"needs the {value} engine, which dapo-megatron lacks (here: vLLM)")


def _max_tokens(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """config.py TrainerConfig.max_tokens_per_microbatch: -1 off; > 0 bin-packs samples into
    micro-batches of about that many tokens, a longer sample alone."""
    tokens = as_int(value)
    if tokens <= 0:
        return Translation((), "off: micro-batches of a fixed sample count, as here")
    return Translation(
        (("policy.max_tokens_per_microbatch", tokens),),
        "same meaning: micro-batches packed up to that many tokens",
    )


def _model_len(value: Any, ctx: Mapping[str, Any]) -> Translation:
    need = ctx.get("trainer.max_prompt_length", 512) + ctx.get(
        "generator.sampling_params.max_generate_length", 1024
    )
    if as_int(value) >= need:
        return Translation((), f"{value} >= prompt + response ({need}): no cap of its own")
    raise Untranslatable(
        f"needs an engine context ({value}) shorter than prompt + response ({need}), which "
        "dapo-megatron lacks (here: the engine holds prompt + response)"
    )


def _one(*names: str) -> Callable[[Any, Mapping[str, Any]], bool]:
    return off(*names)


SKYRL_LAYOUT_KEYS: tuple[ForeignKey, ...] = (
    custom(
        SKYRL,
        f"{MEG}.tensor_model_parallel_size",
        "policy.megatron.tensor_model_parallel_size (+ sequence_parallel)",
        "same meaning; sequence parallel on when TP > 1, as SkyRL's Megatron worker does",
        _tp,
    ),
    same(
        SKYRL, f"{MEG}.pipeline_model_parallel_size", "policy.megatron.pipeline_model_parallel_size"
    ),
    same(SKYRL, f"{MEG}.context_parallel_size", "policy.megatron.context_parallel_size"),
    same(SKYRL, f"{MEG}.expert_model_parallel_size", "policy.megatron.expert_model_parallel_size"),
    custom(
        SKYRL,
        f"{MEG}.expert_tensor_parallel_size",
        "(none: experts use the TP size here)",
        "null or the TP size: as here; another size is refused",
        _etp,
    ),
    custom(
        SKYRL,
        "trainer.gradient_checkpointing",
        "policy.megatron.recompute_granularity",
        "full (uniform, 1-layer chunks, SkyRL's default kwargs) or selective, as here; false: none",
        _recompute,
    ),
    noop(f"{TCK}.recompute_granularity", "read with trainer.gradient_checkpointing"),
    noop(f"{TCK}.recompute_method", "read with trainer.gradient_checkpointing"),
    noop(f"{TCK}.recompute_num_layers", "read with trainer.gradient_checkpointing"),
    only(
        f"{TCK}.num_layers_in_last_pipeline_stage",
        "an uneven pipeline split",
        off(None),
        "layers split evenly over the pipeline stages",
    ),
    choice(
        SKYRL,
        f"{MEG}.moe_token_dispatcher_type",
        "policy.moe.token_dispatcher",
        {"alltoall": "alltoall", "allgather": "allgather"},
    ),
    same(SKYRL, f"{MEG}.moe_aux_loss_coeff", "policy.moe.aux_loss_coef"),
    same(SKYRL, f"{MEG}.moe_enable_routing_replay", "policy.moe.routing_replay"),
    only(
        f"{MEG}.moe_router_load_balancing_type",
        "a load-balancing loss",
        off("none"),
        "no load-balancing loss (policy.moe.aux_loss_coef 0)",
    ),
    only(
        f"{MEG}.moe_router_score_function",
        "a router override",
        off(None),
        "the checkpoint's router",
    ),
    only(
        f"{MEG}.moe_router_enable_expert_bias",
        "a router override",
        off(None),
        "the checkpoint's router",
    ),
    noop(f"{MEG}.moe_grouped_gemm", "a kernel choice: the same experts"),
    noop(f"{MEG}.empty_cuda_cache", "allocator housekeeping"),
    noop(
        f"{MEG}.optimizer_config_kwargs.optimizer_cpu_offload",
        "where optimizer states live, not their values",
    ),
    noop(
        f"{MEG}.optimizer_config_kwargs.optimizer_offload_fraction", "where optimizer states live"
    ),
    noop(f"{MEG}.optimizer_config_kwargs.overlap_cpu_optimizer_d2h_h2d", "copy overlap"),
    only(
        f"{MEG}.optimizer_config_kwargs.use_precision_aware_optimizer",
        "a precision-aware optimizer (reduced-precision optimizer states)",
        off(False),
        "fp32 master weights and optimizer states",
    ),
    noop(f"{MEG}.mtp_loss_topk", "read with trainer.mtp.enabled"),
    noop(f"{MEG}.lora_config.merge_lora", "read with trainer.policy.model.lora.rank"),
    *(
        noop(
            f"trainer.ref.megatron_config.{k}",
            "the reference policy shares the policy's layout here",
        )
        for k in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "expert_model_parallel_size",
            "expert_tensor_parallel_size",
            "transformer_config_kwargs.num_layers_in_last_pipeline_stage",
        )
    ),
    *(
        noop(f"trainer.placement.{k}", "the reference policy shares the policy's GPUs here")
        for k in (
            "ref_num_nodes",
            "ref_num_gpus_per_node",
            "critic_num_nodes",
            "critic_num_gpus_per_node",
        )
    ),
    custom(
        SKYRL,
        "trainer.placement.colocate_all",
        "cluster.num_nodes (+ gpus_per_node, colocated, generation_num_devices)",
        "the policy's nodes x GPUs; colocated as there; split: the engines' GPUs beside the "
        "policy's on one node",
        _placement,
    ),
    noop("trainer.placement.policy_num_nodes", "read with trainer.placement.colocate_all"),
    noop("trainer.placement.policy_num_gpus_per_node", "read with trainer.placement.colocate_all"),
    noop(
        "trainer.placement.colocate_policy_ref",
        "the reference policy shares the policy's GPUs here",
    ),
    # Engines
    custom(
        SKYRL, f"{ENGINE}.backend", "generation.backend", "vllm: same; others refused", _backend
    ),
    same(SKYRL, f"{ENGINE}.tensor_parallel_size", "generation.engine.tensor_parallel_size"),
    same(
        SKYRL,
        "generator.inference_engine_tensor_parallel_size",
        "generation.engine.tensor_parallel_size",
    ),
    same(SKYRL, f"{ENGINE}.num_engines", "generation.engine.num_engines"),
    same(SKYRL, "generator.num_inference_engines", "generation.engine.num_engines"),
    same(SKYRL, f"{ENGINE}.gpu_memory_utilization", "generation.engine.gpu_memory_utilization"),
    same(SKYRL, "generator.gpu_memory_utilization", "generation.engine.gpu_memory_utilization"),
    same(SKYRL, f"{ENGINE}.enforce_eager", "generation.engine.enforce_eager"),
    same(SKYRL, f"{ENGINE}.max_num_seqs", "generation.engine.max_num_seqs"),
    *(
        only(f"{ENGINE}.{k}", f"an engine {k.replace('_', ' ')} above 1", off(1), "1")
        for k in ("pipeline_parallel_size", "expert_parallel_size", "data_parallel_size")
    ),
    only(f"{ENGINE}.run_engines_locally", "remote engines", off(True), "engines run in the job"),
    only(
        f"{ENGINE}.model_dtype", "an engine dtype apart from bf16", off("bfloat16", "bf16"), "bf16"
    ),
    *(
        noop(f"{ENGINE}.{k}", "an engine transport, kernel or scheduling choice: the same samples")
        for k in (
            "weight_sync_backend",
            "async_engine",
            "distributed_executor_backend",
            "enable_prefix_caching",
            "enable_chunked_prefill",
            "max_num_batched_tokens",
            "vllm_v1_disable_multiproc",
            "engine_init_kwargs.compilation_config.cudagraph_mode",
            "engine_init_kwargs.disable_custom_all_reduce",
            "engine_init_kwargs.gdn_prefill_backend",
        )
    ),
    custom(
        SKYRL,
        f"{ENGINE}.engine_init_kwargs.max_model_len",
        "(none: the engine holds prompt + response here)",
        "at least prompt + response: as here; shorter is refused",
        _model_len,
    ),
    *(
        only(k, "a vision-language checkpoint trained as text only", off(False), "a text model")
        for k in (
            f"{ENGINE}.language_model_only",
            "trainer.policy.language_model_only",
            "trainer.ref.language_model_only",
        )
    ),
    noop("generator.batched", "one request per prompt or a batch: the same single-turn samples"),
    # Micro-batches
    same(SKYRL, "trainer.micro_train_batch_size_per_gpu", "policy.train_micro_batch_size"),
    same(SKYRL, "trainer.micro_forward_batch_size_per_gpu", "policy.logprob_micro_batch_size"),
    custom(
        SKYRL,
        "trainer.max_tokens_per_microbatch",
        "policy.max_tokens_per_microbatch",
        "-1: off, as here; > 0: micro-batches packed up to that many tokens",
        _max_tokens,
    ),
    noop(
        "trainer.remove_microbatch_padding",
        "padding-free packing inside a micro-batch: the same loss (ours pads, so dapo-plan's "
        "activation estimate is the larger)",
    ),
    noop("trainer.flash_attn", "an attention kernel: the same logits"),
    noop("trainer.fused_lm_head_logprob", "a fused log-prob kernel: the same log-probs"),
    noop("trainer.logprobs_chunk_size", "a chunked log-prob kernel: the same log-probs"),
    noop("trainer.use_expandable_segments", "allocator setting"),
    # Data and reward
    custom(
        SKYRL,
        "data.train_data",
        "data.train_path (+ data.format)",
        "SkyRL's DAPO files by name",
        _data("data.train_path"),
    ),
    custom(
        SKYRL,
        "data.val_data",
        "data.val_path (+ data.format)",
        "SkyRL's AIME files by name",
        _data("data.val_path"),
    ),
    custom(
        SKYRL,
        "environment.env_class",
        "reward.verifier (+ dapo.reward_scaling)",
        "aime: the math verifier, +1 / -1; gsm8k and others refused",
        _env,
    ),
    # Bookkeeping
    *(
        noop(k, "logging, export or checkpoint bookkeeping")
        for k in (
            "trainer.export_path",
            "trainer.hf_save_interval",
            "trainer.logger",
            "trainer.project_name",
            "trainer.run_name",
            "trainer.resume_mode",
            "trainer.max_ckpts_to_keep",
            "trainer.eval_batch_size",
            "trainer.dump_data_batch",
            "trainer.dump_eval_results",
            "trainer.print_example_interval",
            "trainer.enable_ray_gpu_monitor",
            "trainer.policy.megatron_config.hf_export_config.distributed_save",
        )
    ),
)
"""SkyRL's layout, placement, engine, data and bookkeeping keys."""
