"""NeMo RL's keys in the table (examples/configs/grpo_math_1B.yaml, recipes/llm/*dapo*.yaml,
docs/guides/dapo.md), with their converters; dialect_keys.py joins the tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    ForeignKey,
    Untranslatable,
    as_int,
    choice,
    hub_model,
    mapped,
    same,
    sampling_top_k,
)
from dapo_megatron.migrate.shared_keys import (
    AGG,
    CLIP_C,
    CLIP_HIGH,
    CLIP_LOW,
    DS,
    DUAL_WHY,
    HIGH_WHY,
    LOW_WHY,
    MAX_RESPONSE,
    NEMO,
    OB,
    RS,
)


def _rounds_plus_one(value: Any, ctx: Mapping[str, Any]) -> int:
    """NeMo RL's grpo.py increments the round counter before generating and keeps going
    while `rounds <= dynamic_sampling_max_gen_batches`: N allows N + 1 rounds."""
    n = as_int(value)
    if n <= 0:
        raise Untranslatable(
            f"NeMo RL refuses {n} (it asserts > 0); here dapo.dynamic_sampling.max_gen_batches "
            f"<= 0 means unlimited rounds: set it to 0 for that, or to N for at most N rounds"
        )
    return n + 1


def _batch_multiplier(value: Any, ctx: Mapping[str, Any]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        raise Untranslatable(f"{value!r}: expected a number >= 1")
    return float(value)


def _nemo_token_level(value: Any, ctx: Mapping[str, Any]) -> str:
    if value is True:
        return "token-mean"
    if value is False:
        return "seq-mean-token-mean"
    raise Untranslatable(f"{value!r}: expected true or false")


NEMO_KEYS: tuple[ForeignKey, ...] = (
    same(NEMO, "grpo.num_prompts_per_step", "dapo.num_prompts_per_step"),
    same(NEMO, "grpo.num_generations_per_prompt", "dapo.num_generations_per_prompt"),
    same(
        NEMO,
        "grpo.use_dynamic_sampling",
        f"{DS}.enabled",
        "same meaning: keep only groups whose unshaped reward varies",
    ),
    mapped(
        NEMO,
        "grpo.batch_multiplier",
        f"{DS}.batch_multiplier",
        "round 1 draws {v} x num_prompts_per_step prompts in both; NeMo RL's later rounds "
        "draw as many again, ours {v} x the groups still missing",
        _batch_multiplier,
    ),
    mapped(
        NEMO,
        "grpo.dynamic_sampling_max_gen_batches",
        f"{DS}.max_gen_batches",
        "converted: NeMo RL counts a round before checking `rounds <= {v}`, so it runs up "
        "to {v} + 1 rounds; ours generates at most {out} full rounds' worth of prompts",
        _rounds_plus_one,
    ),
    same(NEMO, "grpo.reward_scaling.enabled", f"{RS}.enabled", "same meaning: clamp, then map"),
    same(NEMO, "grpo.reward_scaling.source_min", f"{RS}.source_min"),
    same(NEMO, "grpo.reward_scaling.source_max", f"{RS}.source_max"),
    same(NEMO, "grpo.reward_scaling.target_min", f"{RS}.target_min"),
    same(NEMO, "grpo.reward_scaling.target_max", f"{RS}.target_max"),
    same(
        NEMO,
        "grpo.reward_shaping.enabled",
        f"{OB}.enabled",
        "same meaning: the DAPO soft overlong penalty",
    ),
    same(NEMO, "grpo.reward_shaping.overlong_buffer_length", f"{OB}.length"),
    same(
        NEMO,
        "grpo.reward_shaping.overlong_buffer_penalty",
        f"{OB}.penalty_factor",
        "same ramp; NeMo RL's penalty is not clamped and keeps growing past "
        "reward_shaping.max_response_length, ours stays in [-{v}, 0]",
    ),
    same(
        NEMO,
        "grpo.reward_shaping.max_response_length",
        MAX_RESPONSE,
        "Lmax of the penalty: here it is also the engine's response cap (one key), "
        "NeMo RL's engine cap is policy.generation.max_new_tokens",
    ),
    same(NEMO, "loss_fn.ratio_clip_min", CLIP_LOW, LOW_WHY),
    same(NEMO, "loss_fn.ratio_clip_max", CLIP_HIGH, HIGH_WHY),
    same(NEMO, "grpo.ratio_clip_min", CLIP_LOW, LOW_WHY),
    same(NEMO, "grpo.ratio_clip_max", CLIP_HIGH, HIGH_WHY),
    same(NEMO, "loss_fn.ratio_clip_c", CLIP_C, DUAL_WHY),
    mapped(
        NEMO,
        "loss_fn.token_level_loss",
        AGG,
        "true: token-mean (DAPO's token-level loss); false: seq-mean-token-mean",
        _nemo_token_level,
    ),
    same(NEMO, "cluster.num_nodes", "cluster.num_nodes"),
    same(NEMO, "cluster.gpus_per_node", "cluster.gpus_per_node"),
    hub_model("policy.model_name", NEMO),
    same(
        NEMO,
        "checkpointing.checkpoint_dir",
        "checkpointing.checkpoint_dir",
        "same meaning (null here: `<run.output_dir>/checkpoints`)",
    ),
    same(NEMO, "checkpointing.enabled", "checkpointing.enabled"),
    same(NEMO, "checkpointing.save_period", "checkpointing.save_period"),
    same(NEMO, "grpo.max_num_steps", "dapo.max_num_steps"),
    same(NEMO, "grpo.val_period", "validation.val_period"),
    same(NEMO, "grpo.val_at_start", "validation.val_at_start"),
    same(NEMO, "grpo.seed", "run.seed"),
    same(NEMO, "grpo.normalize_rewards", "dapo.advantage.norm_by_std"),
    same(NEMO, "grpo.use_leave_one_out_baseline", "dapo.advantage.leave_one_out"),
    same(NEMO, "loss_fn.reference_policy_kl_penalty", "dapo.loss.kl_coef"),
    same(NEMO, "policy.train_global_batch_size", "policy.train_global_batch_size"),
    same(NEMO, "policy.train_micro_batch_size", "policy.train_micro_batch_size"),
    same(NEMO, "policy.logprob_batch_size", "policy.logprob_micro_batch_size"),
    same(NEMO, "policy.max_total_sequence_length", "policy.max_total_sequence_length"),
    choice(
        NEMO,
        "policy.precision",
        "policy.precision",
        {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"},
    ),
    same(NEMO, "policy.generation.max_new_tokens", MAX_RESPONSE),
    same(NEMO, "policy.generation.temperature", "generation.temperature"),
    same(NEMO, "policy.generation.top_p", "generation.top_p"),
    mapped(NEMO, "policy.generation.top_k", "generation.top_k", "null: -1 (off)", sampling_top_k),
    same(
        NEMO,
        "policy.generation.vllm_cfg.tensor_parallel_size",
        "generation.engine.tensor_parallel_size",
    ),
    same(
        NEMO,
        "policy.generation.vllm_cfg.gpu_memory_utilization",
        "generation.engine.gpu_memory_utilization",
    ),
    same(
        NEMO,
        "policy.megatron_cfg.tensor_model_parallel_size",
        "policy.megatron.tensor_model_parallel_size",
    ),
    same(
        NEMO,
        "policy.megatron_cfg.pipeline_model_parallel_size",
        "policy.megatron.pipeline_model_parallel_size",
    ),
    same(
        NEMO,
        "policy.megatron_cfg.context_parallel_size",
        "policy.megatron.context_parallel_size",
    ),
    same(NEMO, "policy.megatron_cfg.sequence_parallel", "policy.megatron.sequence_parallel"),
    choice(
        NEMO,
        "policy.megatron_cfg.activation_checkpointing",
        "policy.megatron.recompute_granularity",
        {True: "full", False: "none"},
    ),
    same(NEMO, "policy.megatron_cfg.optimizer.lr", "policy.optimizer.lr"),
    same(NEMO, "policy.megatron_cfg.optimizer.min_lr", "policy.optimizer.min_lr"),
    same(NEMO, "policy.optimizer.kwargs.lr", "policy.optimizer.lr"),
    same(NEMO, "policy.optimizer.kwargs.weight_decay", "policy.optimizer.weight_decay"),
    same(NEMO, "policy.max_grad_norm", "policy.optimizer.clip_grad"),
    same(NEMO, "data.max_input_seq_length", "data.max_prompt_length"),
    same(
        NEMO,
        "grpo.overlong_filtering",
        "dapo.overlong_filtering",
        "same meaning: truncated responses get no loss (NeMo RL grpo.py)",
    ),
    same(
        NEMO,
        "policy.megatron_cfg.optimizer.weight_decay",
        "policy.optimizer.weight_decay",
    ),
    same(NEMO, "policy.megatron_cfg.optimizer.clip_grad", "policy.optimizer.clip_grad"),
    same(NEMO, "policy.megatron_cfg.optimizer.adam_beta1", "policy.optimizer.adam_beta1"),
    same(NEMO, "policy.megatron_cfg.optimizer.adam_beta2", "policy.optimizer.adam_beta2"),
    same(NEMO, "policy.megatron_cfg.optimizer.adam_eps", "policy.optimizer.adam_eps"),
    same(NEMO, "logger.log_dir", "logger.log_dir"),
    same(NEMO, "logger.wandb_enabled", "logger.wandb_enabled"),
    same(NEMO, "logger.tensorboard_enabled", "logger.tensorboard_enabled"),
    same(NEMO, "logger.wandb.project", "logger.wandb_project"),
)
