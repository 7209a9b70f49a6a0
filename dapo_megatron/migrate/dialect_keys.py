"""The mapping table: every NeMo RL, SkyRL, RLinf and verl key we translate, with its
converter and the semantic difference (the builders are in dialects.py),
and the lookups `foreign_key`, `all_foreign_keys` and `explain_foreign`.

docs/MIGRATING.md is this table rendered (`python -m dapo_megatron.migrate.import_config
--table`); tests/unit/test_dialects.py checks the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    DIALECTS,
    ForeignKey,
    Translation,
    Untranslatable,
    as_int,
    choice,
    custom,
    describe_settings,
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
UNLIMITED_WHY = (
    "same meaning: at most {v} full generation rounds' worth of prompts per step, <= 0 unlimited"
)


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


def _rlinf_clip(ours: str, key: str) -> ForeignKey:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        if value is None:
            eps = ctx.get("algorithm.ratio_clip_eps")
            if eps is None:
                raise Untranslatable("null and no algorithm.ratio_clip_eps to fall back to")
            return Translation(((ours, eps),), f"null: RLinf falls back to ratio_clip_eps {eps}")
        side = "below at 1 -" if ours == CLIP_LOW else "at 1 +"
        return Translation(((ours, value),), f"same meaning: the ratio is clipped {side} {value}")

    return custom(
        RLINF,
        key,
        ours,
        "same meaning; null falls back to `algorithm.ratio_clip_eps` (RLinf "
        "megatron_actor_worker.py)",
        convert,
    )


def _rlinf_placement(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """RLinf's component_placement: `all` = every GPU of cluster.num_nodes nodes; a GPU
    index or range (`0`, `0-3`) = those GPUs of one node."""
    if not isinstance(value, Mapping) and not isinstance(value, int | str):
        raise Untranslatable(f"{value!r}: expected all, a GPU index or a range")
    if isinstance(value, Mapping):
        raise Untranslatable("a placement per component (disaggregated) has no counterpart here")
    text = str(value).strip()
    if text == "all":
        return Translation((), "all GPUs of cluster.num_nodes (gpus_per_node: ours, 8)")
    if "," in text:
        raise Untranslatable(f"{text}: a list of GPU ranges has no counterpart here")
    lo, _, hi = text.partition("-")
    try:
        count = int(hi or lo) - int(lo) + 1
    except ValueError:
        raise Untranslatable(f"{text}: expected all, a GPU index or a range") from None
    if ctx.get("cluster.num_nodes", 1) != 1:
        raise Untranslatable(f"GPUs {text} of several nodes has no counterpart here")
    return Translation(
        (("cluster.num_nodes", 1), ("cluster.gpus_per_node", count)),
        f"GPUs {text} of one node: {count} GPU(s), colocated",
    )


RLINF_KEYS: tuple[ForeignKey, ...] = (
    same(RLINF, "algorithm.group_size", "dapo.num_generations_per_prompt"),
    _rlinf_clip(CLIP_LOW, "algorithm.clip_ratio_low"),
    _rlinf_clip(CLIP_HIGH, "algorithm.clip_ratio_high"),
    custom(
        RLINF,
        "algorithm.ratio_clip_eps",
        "(read with clip_ratio_low/high)",
        "the clip range when clip_ratio_low/high are null",
        lambda v, ctx: Translation((), "read with clip_ratio_low/high"),
    ),
    same(RLINF, "algorithm.clip_ratio_c", CLIP_C, DUAL_WHY),
    same(
        RLINF,
        "actor.model.tensor_model_parallel_size",
        "policy.megatron.tensor_model_parallel_size",
    ),
    same(
        RLINF,
        "actor.model.pipeline_model_parallel_size",
        "policy.megatron.pipeline_model_parallel_size",
    ),
    same(RLINF, "actor.model.context_parallel_size", "policy.megatron.context_parallel_size"),
    same(RLINF, "rollout.tensor_parallel_size", "generation.engine.tensor_parallel_size"),
    same(RLINF, "actor.optim.lr", "policy.optimizer.lr"),
    same(RLINF, "actor.optim.weight_decay", "policy.optimizer.weight_decay"),
    same(RLINF, "actor.optim.clip_grad", "policy.optimizer.clip_grad"),
    custom(
        RLINF,
        "cluster.component_placement.actor,rollout,reward",
        "(cluster.num_nodes and cluster.gpus_per_node)",
        "all: every GPU of the nodes; a GPU index or range: that many GPUs of one node",
        _rlinf_placement,
    ),
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


def _verl_save_freq(value: Any, ctx: Mapping[str, Any]) -> Translation:
    n = as_int(value)
    if n <= 0:
        return Translation((("checkpointing.enabled", False),), f"{n}: verl never saves")
    return Translation(
        (("checkpointing.enabled", True), ("checkpointing.save_period", n)), "same meaning"
    )


def _verl_warmup(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """verl's warm-up counts trainer steps; ours, optimizer steps (one per mini-batch)."""
    steps = ctx.get(f"{VERL_ACTOR}.optim.lr_warmup_steps", -1)
    ratio = ctx.get(f"{VERL_ACTOR}.optim.lr_warmup_steps_ratio", 0.0)
    prompts = ctx.get("data.train_batch_size")
    mini = ctx.get(f"{VERL_ACTOR}.ppo_mini_batch_size")
    epochs = ctx.get(f"{VERL_ACTOR}.ppo_epochs", 1)
    if not (
        isinstance(prompts, int)
        and isinstance(mini, int)
        and isinstance(epochs, int)
        and min(prompts, mini, epochs) > 0
    ):
        raise Untranslatable(
            "needs data.train_batch_size, ppo_mini_batch_size and ppo_epochs to convert "
            "trainer steps to optimizer steps"
        )
    updates = (prompts // mini) * epochs
    if steps is None or steps <= 0:
        if not ratio:
            return Translation((("policy.scheduler.lr_warmup_steps", 0),), "no warm-up (ratio 0)")
        total = ctx.get("trainer.total_training_steps")
        if not isinstance(total, int) or total <= 0:
            raise Untranslatable(
                f"lr_warmup_steps_ratio {ratio} x verl's total trainer steps, which this "
                "importer cannot know (trainer.total_training_steps is not set)"
            )
        steps = int(ratio * total)
    return Translation(
        (("policy.scheduler.lr_warmup_steps", steps * updates),),
        f"converted: {steps} trainer steps x {updates} optimizer steps each "
        f"({prompts} // {mini} prompts x {epochs} epochs)",
    )


def _verl_warmup_style(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is None:
        return Translation((), "null: lr_scheduler_type decides")
    if value == "constant":
        return Translation((("policy.scheduler.lr_decay_style", "constant"),), "same meaning")
    raise Untranslatable(f"{value!r}: only constant is carried (cosine's floor differs)")


def _verl_epochs(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if as_int(value) != 1:
        raise Untranslatable(f"{value} passes over each batch; ours makes one")
    return Translation((), "one pass, as here")


def _verl_val_temperature(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value == 0 or ctx.get(f"{VERL_ROLLOUT}.val_kwargs.do_sample") is False:
        return Translation((("validation.greedy", True),), "greedy validation")
    return Translation((("validation.temperature", value),), "same meaning")


def _one_file(value: Any, ctx: Mapping[str, Any]) -> Any:
    if isinstance(value, list):
        if len(value) != 1:
            raise Untranslatable(f"{len(value)} files; ours reads one")
        value = value[0]
    if not isinstance(value, str):
        raise Untranslatable(f"{value!r}: expected a path")
    return value


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
    custom(
        VERL,
        "trainer.save_freq",
        "checkpointing.save_period (or enabled)",
        "<= 0: never save (verl ray_trainer.py saves only when save_freq > 0): "
        "checkpointing.enabled false",
        _verl_save_freq,
    ),
    mapped(
        VERL,
        "trainer.test_freq",
        "validation.val_period",
        "<= 0: never validate during training: 0",
        lambda v, ctx: max(0, as_int(v)),
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.optim.lr_warmup_steps",
        "policy.scheduler.lr_warmup_steps",
        "converted: verl steps its scheduler once per trainer step (engine_workers.py, "
        "update_lr_scheduler), ours once per optimizer step: x train_batch_size / "
        "ppo_mini_batch_size x ppo_epochs; <= 0 uses lr_warmup_steps_ratio",
        _verl_warmup,
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.optim.lr_warmup_steps_ratio",
        "policy.scheduler.lr_warmup_steps",
        "read with lr_warmup_steps (used when that is <= 0): ratio x total trainer steps, "
        "converted to optimizer steps",
        _verl_warmup,
    ),
    choice(
        VERL,
        f"{VERL_ACTOR}.optim.lr_scheduler_type",
        "policy.scheduler.lr_decay_style",
        {"constant": "constant"},
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.optim.warmup_style",
        "policy.scheduler.lr_decay_style",
        "deprecated name of lr_scheduler_type (null: that key decides)",
        _verl_warmup_style,
    ),
    same(VERL, f"{VERL_ACTOR}.optim.weight_decay", "policy.optimizer.weight_decay"),
    same(VERL, f"{VERL_ACTOR}.optim.clip_grad", "policy.optimizer.clip_grad"),
    custom(
        VERL,
        f"{VERL_ACTOR}.ppo_epochs",
        "(none: one pass)",
        "1: one pass over the batch, as here; more passes have no counterpart",
        _verl_epochs,
    ),
    choice(
        VERL,
        f"{VERL_ACTOR}.megatron.dtype",
        "policy.precision",
        {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"},
    ),
    custom(
        VERL,
        "reward_model.reward_kwargs.overlong_buffer_cfg.enable",
        f"{OB}.enabled",
        "same meaning",
        _verl_overlong_enable,
    ),
    same(VERL, "reward_model.reward_kwargs.overlong_buffer_cfg.len", f"{OB}.length"),
    custom(
        VERL,
        "reward.reward_kwargs.overlong_buffer_cfg.enable",
        f"{OB}.enabled",
        "same meaning",
        _verl_overlong_enable,
    ),
    same(VERL, "reward.reward_kwargs.overlong_buffer_cfg.len", f"{OB}.length"),
    same(
        VERL,
        "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor",
        f"{OB}.penalty_factor",
        "same ramp; verl's penalty is not clamped at -{v}, ours stays in [-{v}, 0]",
    ),
    same(
        VERL,
        "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor",
        f"{OB}.penalty_factor",
        "same ramp; verl's penalty is not clamped at -{v}, ours stays in [-{v}, 0]",
    ),
    same(VERL, f"{VERL_ROLLOUT}.val_kwargs.n", "validation.num_samples_per_prompt"),
    custom(
        VERL,
        f"{VERL_ROLLOUT}.val_kwargs.temperature",
        "validation.temperature",
        "same meaning while val_kwargs.do_sample is true; 0 or do_sample false: greedy",
        _verl_val_temperature,
    ),
    same(VERL, f"{VERL_ROLLOUT}.val_kwargs.top_p", "validation.top_p"),
    mapped(
        VERL,
        f"{VERL_ROLLOUT}.val_kwargs.do_sample",
        "validation.greedy",
        "false: greedy validation (true here)",
        lambda v, ctx: not v,
    ),
    mapped(VERL, "data.train_files", "data.train_path", "one file: same meaning", _one_file),
    mapped(VERL, "data.val_files", "data.val_path", "one file: same meaning", _one_file),
    same(VERL, "trainer.val_before_train", "validation.val_at_start"),
    same(VERL, "trainer.default_local_dir", "checkpointing.checkpoint_dir"),
)


# ---------------------------------------------------------------------------------------
# The source's defaults for keys a config omits, and which parts of a config are live


SOURCE_DEFAULTS: dict[str, dict[str, Any]] = {
    # verl/trainer/config/_generated_ppo_megatron_trainer.yaml (actor, rollout, trainer) and
    # verl-recipe dapo/config/dapo_trainer.yaml (filter_groups, overlong_buffer_cfg).
    VERL: {
        f"{VERL_ACTOR}.clip_ratio_low": 0.2,
        f"{VERL_ACTOR}.clip_ratio_high": 0.2,
        f"{VERL_ACTOR}.clip_ratio_c": 3.0,
        f"{VERL_ACTOR}.loss_agg_mode": "token-mean",
        f"{VERL_ACTOR}.entropy_coeff": 0,
        f"{VERL_ACTOR}.use_kl_loss": False,
        f"{VERL_ACTOR}.optim.lr": 1.0e-6,
        f"{VERL_ACTOR}.optim.lr_warmup_steps": -1,
        f"{VERL_ACTOR}.optim.lr_warmup_steps_ratio": 0.0,
        f"{VERL_ACTOR}.optim.weight_decay": 0.01,
        f"{VERL_ACTOR}.optim.clip_grad": 1.0,
        f"{VERL_ACTOR}.ppo_epochs": 1,
        f"{VERL_ACTOR}.ppo_mini_batch_size": 256,
        f"{VERL_ROLLOUT}.n": 1,
        f"{VERL_ROLLOUT}.temperature": 1.0,
        f"{VERL_ROLLOUT}.top_p": 1.0,
        f"{VERL_ROLLOUT}.top_k": -1,
        f"{VERL_ROLLOUT}.val_kwargs.n": 1,
        f"{VERL_ROLLOUT}.val_kwargs.temperature": 0,
        f"{VERL_ROLLOUT}.val_kwargs.top_p": 1.0,
        f"{VERL_ROLLOUT}.val_kwargs.do_sample": False,
        "data.train_batch_size": 1024,
        "data.max_prompt_length": 512,
        "data.max_response_length": 512,
        "algorithm.filter_groups.enable": False,
        "reward.reward_kwargs.overlong_buffer_cfg.enable": False,
        "trainer.save_freq": -1,
        "trainer.test_freq": -1,
    },
    # skyrl/train/config/config.py (the dataclass defaults).
    SKYRL: {
        "trainer.algorithm.eps_clip_low": 0.2,
        "trainer.algorithm.eps_clip_high": 0.2,
        "trainer.algorithm.policy_loss_type": "regular",
        "trainer.algorithm.loss_reduction": "token_mean",
        "trainer.algorithm.dynamic_sampling.type": None,
        "trainer.policy.optimizer_config.lr": 1.0e-6,
        "trainer.policy.optimizer_config.num_warmup_steps": 0,
        "generator.apply_overlong_filtering": False,
        "generator.sampling_params.max_generate_length": 1024,
    },
    # RLinf: rlinf/workers/actor/megatron_actor_worker.py reads clip_ratio_low/high with
    # .get() (absent = null = ratio_clip_eps).
    RLINF: {
        "algorithm.clip_ratio_low": None,
        "algorithm.clip_ratio_high": None,
    },
    # NeMo RL: examples/configs/grpo_math_1B.yaml is the parent of its recipes and sets
    # these itself; nothing is added for a config read with its parent.
    NEMO: {},
}
"""Per system, the value its code or base config gives a key that a config omits, for the
keys that change a run: an omitted key takes the source's default, never ours."""


def inactive_keys(dialect: str, flat: Mapping[str, Any]) -> dict[str, str]:
    """Source keys that are not live there (key -> why): NeMo RL reads policy.megatron_cfg
    only with megatron_cfg.enabled true, and then neither dtensor_cfg nor policy.optimizer
    / policy.scheduler (the Megatron worker builds its optimizer from megatron_cfg); RLinf
    reads actor.model's Megatron layout only with actor.training_backend megatron."""
    dead: dict[str, str] = {}
    if dialect == NEMO:
        megatron = flat.get("policy.megatron_cfg.enabled") is True
        for key in flat:
            if megatron and key.startswith(
                ("policy.dtensor_cfg.", "policy.optimizer.", "policy.scheduler.")
            ):
                dead[key] = "not live: policy.megatron_cfg.enabled is true (Megatron's optimizer)"
            elif megatron and key in ("policy.optimizer", "policy.scheduler"):
                dead[key] = "not live: policy.megatron_cfg.enabled is true"
            elif not megatron and key.startswith("policy.megatron_cfg."):
                dead[key] = "not live: policy.megatron_cfg.enabled is not true"
    return dead


FOREIGN_KEYS: tuple[ForeignKey, ...] = NEMO_KEYS + SKYRL_KEYS + RLINF_KEYS + VERL_KEYS
"""The whole table, NeMo RL first: a key two systems share is explained as the first's."""


# ---------------------------------------------------------------------------------------
# Lookups


def _index(keys: Iterable[ForeignKey]) -> dict[tuple[str, str], ForeignKey]:
    index: dict[tuple[str, str], ForeignKey] = {}
    for fk in keys:
        if fk.dialect not in DIALECTS:
            raise ValueError(f"{fk.key}: unknown dialect {fk.dialect!r}")
        if (fk.dialect, fk.key) in index:
            raise ValueError(f"{fk.system} key {fk.key} is in the table twice")
        index[(fk.dialect, fk.key)] = fk
    return index


def foreign_key(key: str, dialect: str | None = None) -> ForeignKey | None:
    """The table entry of a foreign dotted key (Hydra's `+`/`++` prefix ignored); with no
    dialect, the first system that has it."""
    bare = key.lstrip("+")
    for fk in FOREIGN_KEYS:
        if fk.key == bare and (dialect is None or fk.dialect == dialect):
            return fk
    return None


def all_foreign_keys() -> tuple[ForeignKey, ...]:
    """The whole table, checked for duplicates."""
    _index(FOREIGN_KEYS)
    return FOREIGN_KEYS


def explain_foreign(flat: Mapping[str, Any], source: str) -> str | None:
    """The one-line error for the first foreign key among `flat` (dotted key -> value, the
    unknown part of a recipe or one override), or None when none is known.

    Translated: `KEY in SOURCE is SYSTEM's name; here it is OURS (note)`; no exact
    equivalent: `...; it has no exact equivalent here: what differs; what to set`.
    """
    found = [(k, v, fk) for k, v in flat.items() if (fk := foreign_key(k)) is not None]
    if not found:
        return None
    key, value, fk = found[0]
    where = f"{key.lstrip('+')} in {source} is {fk.system}'s name"
    more = ""
    if len(found) > 1:
        more = (
            f"; {len(found) - 1} more {fk.system} key(s) follow: `dapo-import-config --from "
            f"{fk.dialect} FILE -o recipes/mine.yaml` translates a whole config"
        )
    try:
        tr = fk.convert(value, {})
    except Untranslatable as e:
        return f"{where}; it has no exact equivalent here: {e}{more}"
    return f"{where}; here it is {describe_settings(tr.settings, value)} ({tr.note}){more}"
