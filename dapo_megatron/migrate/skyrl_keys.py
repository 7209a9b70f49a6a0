"""SkyRL's keys in the table (skyrl-train: config/ppo_base_config.yaml,
examples/algorithms/dapo/*), with their converters; dialect_keys.py joins the tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    IMPACT_HARMLESS,
    IMPACT_LAYOUT,
    ForeignKey,
    Translation,
    Untranslatable,
    as_int,
    choice,
    custom,
    hub_model,
    kl_coef,
    kl_switch,
    mapped,
    policy_mini_batch,
    same,
)
from dapo_megatron.migrate.shared_keys import (
    AGG,
    CLIP_C,
    CLIP_HIGH,
    CLIP_LOW,
    DS,
    HIGH_WHY,
    LOW_WHY,
    MAX_RESPONSE,
    OB,
    SKYRL,
    UNLIMITED_WHY,
)


def _skyrl_ds_type(value: Any, ctx: Mapping[str, Any]) -> bool:
    if value == "filter":
        return True
    if value is None or value == "null":
        return False
    if value == "replace":
        raise Untranslatable(
            "SkyRL's replace (POLARIS) overwrites zero-variance groups with copies of "
            "informative ones; ours filters and generates more rounds: set "
            "dapo.dynamic_sampling.enabled=true"
        )
    raise Untranslatable(f"{value!r}: SkyRL knows filter, replace and null")


def _skyrl_overlong_length(key: str) -> ForeignKey:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        return Translation(
            ((f"{OB}.enabled", True), (f"{OB}.length", as_int(value))),
            f"same ramp over the last {value} tokens of "
            "generator.sampling_params.max_generate_length; SkyRL sets the reward of a "
            "response past the cap to 0, here the cap is the engine's",
        )

    return custom(
        SKYRL,
        key,
        f"{OB}.length (+ enabled)",
        "same ramp over the last {v} tokens of the response cap (SkyRL's DAPO example "
        "trainer); past the cap SkyRL's reward is 0, here the engine stops at the cap",
        convert,
    )


def _skyrl_dual_clip(value: Any, ctx: Mapping[str, Any]) -> Translation:
    kind = ctx.get("trainer.algorithm.policy_loss_type", "regular")
    if kind != "dual_clip":
        return Translation(((CLIP_C, None),), f"unused there (policy_loss_type {kind}): off")
    return Translation(((CLIP_C, value),), "same meaning: dual clip (policy_loss_type dual_clip)")


def _skyrl_loss_type(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value == "regular":
        return Translation(((CLIP_C, None),), "the clipped surrogate, no dual clip")
    if value == "dual_clip":
        c = ctx.get("trainer.algorithm.clip_ratio_c", 3.0)
        return Translation(((CLIP_C, c),), f"dual clip with clip_ratio_c {c}")
    raise Untranslatable(f"{value!r}: only regular and dual_clip have a counterpart here")


SKYRL_KEYS: tuple[ForeignKey, ...] = (
    same(SKYRL, "trainer.algorithm.eps_clip_low", CLIP_LOW, LOW_WHY),
    same(SKYRL, "trainer.algorithm.eps_clip_high", CLIP_HIGH, HIGH_WHY),
    mapped(
        SKYRL,
        "trainer.algorithm.dynamic_sampling.type",
        f"{DS}.enabled",
        "filter: true, null: false; SkyRL filters on the (shaped) reward, ours on the raw "
        "verifier metric",
        _skyrl_ds_type,
    ),
    same(
        SKYRL,
        "trainer.algorithm.dynamic_sampling.max_sample_batches",
        f"{DS}.max_gen_batches",
        UNLIMITED_WHY + " (SkyRL raises once `rounds >= {v}` and more are needed)",
    ),
    choice(
        SKYRL,
        "trainer.algorithm.loss_reduction",
        AGG,
        {
            "token_mean": "token-mean",
            "sequence_mean": "seq-mean-token-mean",
            "seq_mean_token_sum_norm": "seq-mean-token-sum-norm",
        },
    ),
    same(SKYRL, "generator.apply_overlong_filtering", "dapo.overlong_filtering"),
    _skyrl_overlong_length("trainer.algorithm.overlong_buffer.len"),
    _skyrl_overlong_length("trainer.algorithm.overlong_buffer_len"),
    same(
        SKYRL,
        "trainer.algorithm.overlong_buffer.penalty_factor",
        f"{OB}.penalty_factor",
        "same meaning: the penalty lies in [-{v}, 0]",
    ),
    same(
        SKYRL,
        "trainer.algorithm.overlong_buffer_penalty_factor",
        f"{OB}.penalty_factor",
        "same meaning: the penalty lies in [-{v}, 0]",
    ),
    same(SKYRL, "trainer.train_batch_size", "dapo.num_prompts_per_step"),
    same(SKYRL, "generator.n_samples_per_prompt", "dapo.num_generations_per_prompt"),
    hub_model("trainer.policy.model.path", SKYRL),
    policy_mini_batch(SKYRL, "trainer.policy_mini_batch_size", "generator.n_samples_per_prompt"),
    same(SKYRL, "generator.sampling_params.max_generate_length", MAX_RESPONSE),
    same(SKYRL, "generator.sampling_params.temperature", "generation.temperature"),
    same(SKYRL, "generator.sampling_params.top_p", "generation.top_p"),
    same(SKYRL, "trainer.max_prompt_length", "data.max_prompt_length"),
    same(SKYRL, "trainer.policy.optimizer_config.lr", "policy.optimizer.lr"),
    kl_switch(SKYRL, "trainer.algorithm.use_kl_loss"),
    kl_coef(SKYRL, "trainer.algorithm.kl_loss_coef", "trainer.algorithm.use_kl_loss"),
    same(SKYRL, "trainer.eval_interval", "validation.val_period"),
    same(SKYRL, "trainer.eval_before_train", "validation.val_at_start"),
    same(SKYRL, "trainer.ckpt_interval", "checkpointing.save_period"),
    same(SKYRL, "trainer.ckpt_path", "checkpointing.checkpoint_dir"),
    same(SKYRL, "trainer.seed", "run.seed"),
    same(SKYRL, "trainer.placement.policy_num_nodes", "cluster.num_nodes"),
    same(SKYRL, "trainer.placement.policy_num_gpus_per_node", "cluster.gpus_per_node"),
    same(
        SKYRL,
        "generator.inference_engine_tensor_parallel_size",
        "generation.engine.tensor_parallel_size",
    ),
    same(SKYRL, "generator.gpu_memory_utilization", "generation.engine.gpu_memory_utilization"),
    same(
        SKYRL,
        "generator.inference_engine.tensor_parallel_size",
        "generation.engine.tensor_parallel_size",
    ),
    same(
        SKYRL,
        "generator.inference_engine.gpu_memory_utilization",
        "generation.engine.gpu_memory_utilization",
    ),
    custom(
        SKYRL,
        "trainer.algorithm.clip_ratio_c",
        CLIP_C,
        "the dual-clip bound, applied only when policy_loss_type is dual_clip (SkyRL "
        "ppo_utils.py); otherwise null (off)",
        _skyrl_dual_clip,
    ),
    custom(
        SKYRL,
        "trainer.algorithm.policy_loss_type",
        f"{CLIP_C} (read with clip_ratio_c)",
        "regular: the clipped surrogate (dual clip off); dual_clip: with clip_ratio_c; "
        "others have no counterpart",
        _skyrl_loss_type,
    ),
    same(
        SKYRL,
        "trainer.policy.optimizer_config.num_warmup_steps",
        "policy.scheduler.lr_warmup_steps",
        "same unit: SkyRL steps its scheduler once per optimizer step",
    ),
    same(SKYRL, "trainer.policy.optimizer_config.weight_decay", "policy.optimizer.weight_decay"),
    same(SKYRL, "trainer.policy.optimizer_config.max_grad_norm", "policy.optimizer.clip_grad"),
    same(
        SKYRL,
        "trainer.policy.megatron_config.tensor_model_parallel_size",
        "policy.megatron.tensor_model_parallel_size",
    ),
    same(
        SKYRL,
        "trainer.policy.megatron_config.pipeline_model_parallel_size",
        "policy.megatron.pipeline_model_parallel_size",
    ),
    same(
        SKYRL,
        "trainer.policy.megatron_config.context_parallel_size",
        "policy.megatron.context_parallel_size",
    ),
    same(SKYRL, "generator.eval_n_samples_per_prompt", "validation.num_samples_per_prompt"),
    same(SKYRL, "generator.eval_sampling_params.temperature", "validation.temperature"),
    same(SKYRL, "generator.eval_sampling_params.top_p", "validation.top_p"),
)


SKYRL_TIERS: dict[str, str] = {
    "trainer.max_ckpts_to_keep": IMPACT_HARMLESS,
    "trainer.eval_batch_size": IMPACT_HARMLESS,  # evaluation batching
    "trainer.strategy": IMPACT_LAYOUT,  # FSDP / Megatron backend
    "generator.batched": IMPACT_LAYOUT,  # batched vs per-request generation
}
"""Skyrl keys (or subtrees ending in ".") classified by what the source does with them,
read before the patterns of dialects.impact."""


SKYRL_DEFAULTS: dict[str, Any] = {
    # skyrl/train/config/config.py (the dataclass defaults).
    "trainer.algorithm.eps_clip_low": 0.2,
    "trainer.algorithm.eps_clip_high": 0.2,
    "trainer.algorithm.policy_loss_type": "regular",
    "trainer.algorithm.loss_reduction": "token_mean",
    "trainer.algorithm.dynamic_sampling.type": None,
    "trainer.policy.optimizer_config.lr": 1.0e-6,
    "trainer.policy.optimizer_config.num_warmup_steps": 0,
    "generator.apply_overlong_filtering": False,
    "generator.sampling_params.max_generate_length": 1024,
}
"""The value the source's code or base config gives a key that a config omits, for the
keys that change a run (an omitted key takes the source's default, never ours)."""


def inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Keys of a config that are not live in SkyRL (key -> why)."""
    return {}
