"""The mapping table: every NeMo RL, SkyRL, RLinf and verl key we translate, with its
converter and the semantic difference (the builders are in dialects.py).

docs/MIGRATING.md is this table rendered (`python -m dapo_megatron.config.import_config
--table`); tests/unit/test_dialects.py checks the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.config.dialects import (
    ForeignKey,
    Translation,
    Untranslatable,
    as_int,
    choice,
    custom,
    hub_model,
    kl_coef,
    kl_estimator,
    kl_switch,
    mapped,
    policy_mini_batch,
    same,
    same_agg,
    sampling_top_k,
)

NEMO, SKYRL, RLINF, VERL = "nemo-rl", "skyrl", "rlinf", "verl"

CLIP_LOW = "dapo.loss.clip_ratio_low"
CLIP_HIGH = "dapo.loss.clip_ratio_high"
CLIP_C = "dapo.loss.clip_ratio_c"
AGG = "dapo.loss.loss_agg_mode"
DS = "dapo.dynamic_sampling"
OB = "dapo.overlong_buffer"
RS = "dapo.reward_scaling"
MAX_RESPONSE = "generation.max_response_length"

LOW_WHY = "same meaning: the ratio is clipped below at 1 - {v}"
HIGH_WHY = "same meaning: the ratio is clipped at 1 + {v}"
DUAL_WHY = "same meaning: the dual-clip bound for negative advantages, here {v} (null: off)"
UNLIMITED_WHY = "same meaning: at most {v} generation rounds per step, <= 0 unlimited"


# ---------------------------------------------------------------------------------------
# Converters shared by several systems


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


def _resamples_plus_first(value: Any, ctx: Mapping[str, Any]) -> int:
    """RLinf's guide counts resampling attempts after the first generation."""
    n = as_int(value)
    return n + 1 if n > 0 else 0


def _batch_multiplier(value: Any, ctx: Mapping[str, Any]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        raise Untranslatable(f"{value!r}: expected a number >= 1")
    return float(value)


# ---------------------------------------------------------------------------------------
# NeMo RL (examples/configs/grpo_math_1B.yaml, recipes/llm/*dapo*.yaml, docs/guides/dapo.md)


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
        "to {v} + 1 rounds; ours runs at most max_gen_batches = {out}",
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
    same(NEMO, "data.max_input_seq_length", "data.max_prompt_length"),
    same(NEMO, "logger.log_dir", "logger.log_dir"),
    same(NEMO, "logger.wandb_enabled", "logger.wandb_enabled"),
    same(NEMO, "logger.tensorboard_enabled", "logger.tensorboard_enabled"),
    same(NEMO, "logger.wandb.project", "logger.wandb_project"),
)


# ---------------------------------------------------------------------------------------
# SkyRL (skyrl-train: config/ppo_base_config.yaml, examples/algorithms/dapo/*)


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
)


# ---------------------------------------------------------------------------------------
# RLinf (docs reference/algorithms/dapo.rst, examples/reasoning/config/math/*.yaml)


def _rlinf_safe_length(value: Any, ctx: Mapping[str, Any]) -> Translation:
    safe = as_int(value)
    cap = ctx.get("algorithm.max_length")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap <= safe:
        raise Untranslatable(
            "RLinf starts its length penalty at safe_length; ours starts it "
            "dapo.overlong_buffer.length tokens before generation.max_response_length: set "
            "dapo.overlong_buffer.length = algorithm.max_length - safe_length (e.g. 20480 - "
            "16384 = 4096)"
        )
    return Translation(
        ((f"{OB}.enabled", True), (f"{OB}.length", cap - safe)),
        f"converted: the penalty starts at {safe} tokens in both: "
        f"length = max_length {cap} - safe_length {safe}",
    )


def _rlinf_len_penalty(value: Any, ctx: Mapping[str, Any]) -> Translation:
    raise Untranslatable(
        "RLinf's guide calls it a length penalty coefficient yet bounds the length reward "
        "to [-1, 0] (its trainer code does not read the key); ours ramps linearly to "
        "-dapo.overlong_buffer.penalty_factor at the cap: set dapo.overlong_buffer."
        "penalty_factor (1.0 = the paper's [-1, 0])"
    )


RLINF_KEYS: tuple[ForeignKey, ...] = (
    same(RLINF, "algorithm.group_size", "dapo.num_generations_per_prompt"),
    same(RLINF, "algorithm.clip_ratio_low", CLIP_LOW, LOW_WHY),
    same(RLINF, "algorithm.clip_ratio_high", CLIP_HIGH, HIGH_WHY),
    same_agg(RLINF, "algorithm.loss_agg_func"),
    mapped(
        RLINF,
        "algorithm.max_resample",
        f"{DS}.max_gen_batches",
        "converted: {v} resampling attempts after the first generation = {out} rounds "
        "(RLinf's guide; its trainer code does not read the key)",
        _resamples_plus_first,
    ),
    custom(
        RLINF,
        "algorithm.safe_length",
        f"{OB}.length (+ enabled)",
        "no exact equivalent: the penalty starts at {v} there, at the cap minus "
        "overlong_buffer.length here; converted to max_length - {v} when max_length is given",
        _rlinf_safe_length,
    ),
    same(
        RLINF,
        "algorithm.max_length",
        MAX_RESPONSE,
        "the response cap; RLinf's guide discards longer responses, here the engine stops "
        "at it (dapo.overlong_filtering masks truncated ones)",
    ),
    custom(
        RLINF,
        "algorithm.len_reward_penalty",
        "(none: dapo.overlong_buffer.penalty_factor)",
        "no exact equivalent: a coefficient there, a bound [-penalty_factor, 0] here",
        _rlinf_len_penalty,
    ),
    same(RLINF, "algorithm.kl_beta", "dapo.loss.kl_coef"),
    kl_estimator(RLINF, "algorithm.kl_penalty_type"),
    same(
        RLINF,
        "algorithm.entropy_bonus",
        "dapo.loss.entropy_coef",
        "same meaning: the loss subtracts {v} x entropy",
    ),
    same(RLINF, "data.rollout_batch_size", "dapo.num_prompts_per_step"),
    same(RLINF, "cluster.num_nodes", "cluster.num_nodes"),
)


# ---------------------------------------------------------------------------------------
# verl (recipe/dapo/*.sh, trainer/config/ppo_trainer.yaml)


def _verl_gen_batch(value: Any, ctx: Mapping[str, Any]) -> Translation:
    gen = as_int(value)
    prompts = ctx.get("data.train_batch_size")
    if not isinstance(prompts, int) or isinstance(prompts, bool) or prompts <= 0:
        raise Untranslatable(
            "verl generates gen_batch_size prompts every round; ours generates "
            "batch_multiplier x the groups still missing: set "
            "dapo.dynamic_sampling.batch_multiplier = gen_batch_size / data.train_batch_size "
            "(e.g. 1536 / 512 = 3)"
        )
    ratio = gen / prompts
    return Translation(
        ((f"{DS}.batch_multiplier", max(1.0, ratio)),),
        f"approximately: round 1 draws {gen} = {ratio:g} x {prompts} prompts in both; verl's "
        f"later rounds draw {gen} again, ours {ratio:g} x the groups still missing",
    )


def _verl_metric(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value in ("acc", "score"):
        return Translation(((f"{DS}.metric", value),), "same meaning: the raw metric")
    if value in ("seq_reward", "seq_final_reward"):
        return Translation(
            ((f"{DS}.metric", "score"),),
            f"not the same: verl's {value} includes the overlong penalty; ours filters on "
            f"the raw score (never the shaped reward, which would keep groups whose answers "
            f"were all wrong but of different lengths)",
        )
    raise Untranslatable(f"{value!r}: ours filters on acc or the raw score only")


def _verl_overlong_enable(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if not isinstance(value, bool):
        raise Untranslatable(f"{value!r}: expected true or false")
    return Translation(((f"{OB}.enabled", value),), "same meaning")


VERL_ACTOR = "actor_rollout_ref.actor"
VERL_ROLLOUT = "actor_rollout_ref.rollout"

VERL_KEYS: tuple[ForeignKey, ...] = (
    same(VERL, f"{VERL_ACTOR}.clip_ratio_low", CLIP_LOW, LOW_WHY),
    same(VERL, f"{VERL_ACTOR}.clip_ratio_high", CLIP_HIGH, HIGH_WHY),
    same(VERL, f"{VERL_ACTOR}.clip_ratio_c", CLIP_C, DUAL_WHY),
    same_agg(VERL, f"{VERL_ACTOR}.loss_agg_mode"),
    same(VERL, "algorithm.filter_groups.enable", f"{DS}.enabled"),
    custom(
        VERL,
        "algorithm.filter_groups.metric",
        f"{DS}.metric",
        "acc and score: same; seq_reward and seq_final_reward (shaped) become score: ours "
        "filters on the raw score, never the shaped reward",
        _verl_metric,
    ),
    same(
        VERL,
        "algorithm.filter_groups.max_num_gen_batches",
        f"{DS}.max_gen_batches",
        UNLIMITED_WHY + " (verl raises once `rounds >= {v}` and more are needed)",
    ),
    custom(
        VERL,
        "data.gen_batch_size",
        f"{DS}.batch_multiplier",
        "no exact equivalent: verl generates {v} prompts every round; converted to "
        "{v} / data.train_batch_size x the groups still missing",
        _verl_gen_batch,
    ),
    custom(
        VERL,
        "reward_model.overlong_buffer.enable",
        f"{OB}.enabled",
        "same meaning",
        _verl_overlong_enable,
    ),
    same(VERL, "reward_model.overlong_buffer.len", f"{OB}.length"),
    same(
        VERL,
        "reward_model.overlong_buffer.penalty_factor",
        f"{OB}.penalty_factor",
        "same ramp; verl's penalty is not clamped at -{v} (it reaches it at "
        "data.max_response_length), ours stays in [-{v}, 0]",
    ),
    same(VERL, f"{VERL_ROLLOUT}.n", "dapo.num_generations_per_prompt"),
    same(VERL, "data.train_batch_size", "dapo.num_prompts_per_step"),
    same(VERL, "data.max_prompt_length", "data.max_prompt_length"),
    same(VERL, "data.max_response_length", MAX_RESPONSE),
    hub_model("actor_rollout_ref.model.path", VERL),
    same(VERL, f"{VERL_ACTOR}.optim.lr", "policy.optimizer.lr"),
    policy_mini_batch(VERL, f"{VERL_ACTOR}.ppo_mini_batch_size", f"{VERL_ROLLOUT}.n"),
    same(
        VERL,
        f"{VERL_ACTOR}.entropy_coeff",
        "dapo.loss.entropy_coef",
        "same meaning: the loss subtracts {v} x entropy",
    ),
    kl_switch(VERL, f"{VERL_ACTOR}.use_kl_loss"),
    kl_coef(VERL, f"{VERL_ACTOR}.kl_loss_coef", f"{VERL_ACTOR}.use_kl_loss"),
    kl_estimator(VERL, f"{VERL_ACTOR}.kl_loss_type"),
    same(VERL, f"{VERL_ROLLOUT}.temperature", "generation.temperature"),
    same(VERL, f"{VERL_ROLLOUT}.top_p", "generation.top_p"),
    mapped(VERL, f"{VERL_ROLLOUT}.top_k", "generation.top_k", "0: -1 (off)", sampling_top_k),
    same(
        VERL,
        f"{VERL_ROLLOUT}.tensor_model_parallel_size",
        "generation.engine.tensor_parallel_size",
    ),
    same(
        VERL,
        f"{VERL_ROLLOUT}.gpu_memory_utilization",
        "generation.engine.gpu_memory_utilization",
    ),
    same(
        VERL,
        f"{VERL_ACTOR}.megatron.tensor_model_parallel_size",
        "policy.megatron.tensor_model_parallel_size",
    ),
    same(
        VERL,
        f"{VERL_ACTOR}.megatron.pipeline_model_parallel_size",
        "policy.megatron.pipeline_model_parallel_size",
    ),
    same(
        VERL,
        f"{VERL_ACTOR}.megatron.context_parallel_size",
        "policy.megatron.context_parallel_size",
    ),
    same(VERL, "trainer.nnodes", "cluster.num_nodes"),
    same(VERL, "trainer.n_gpus_per_node", "cluster.gpus_per_node"),
    same(VERL, "trainer.total_training_steps", "dapo.max_num_steps"),
    same(VERL, "trainer.save_freq", "checkpointing.save_period"),
    same(VERL, "trainer.test_freq", "validation.val_period"),
    same(VERL, "trainer.val_before_train", "validation.val_at_start"),
    same(VERL, "trainer.default_local_dir", "checkpointing.checkpoint_dir"),
)


FOREIGN_KEYS: tuple[ForeignKey, ...] = NEMO_KEYS + SKYRL_KEYS + RLINF_KEYS + VERL_KEYS
"""The whole table, NeMo RL first: a key two systems share is explained as the first's."""
