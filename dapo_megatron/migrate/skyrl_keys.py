"""SkyRL's algorithm keys in the table, with their converters, SkyRL's defaults, tiers and
live-key rule; the layout, engine and data keys are in skyrl_layout.py, and dialect_keys.py
joins the tables.

Read at NovaSky-AI/SkyRL a9564572eb8e91076be43c1bd5e4615e3de17265: skyrl/train/config/
config.py (the dataclasses: every default below), skyrl/train/trainer.py and
skyrl/train/utils/trainer_utils.py (dynamic sampling), skyrl/backends/skyrl_train/utils/
ppo_utils.py (loss reduction, policy losses), off_policy_correction_utils.py (TIS),
workers/megatron/megatron_model_wrapper.py (the KL term) and examples/train/algorithms/dapo/
main_dapo.py (the overlong penalty).
"""

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
    custom,
    hub_model,
    mapped,
    off,
    policy_mini_batch,
    same,
    sampling_top_k,
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
from dapo_megatron.migrate.skyrl_layout import SKYRL_LAYOUT_KEYS, noop, only
from dapo_megatron.migrate.skyrl_rules import (
    ALGO,
    EVAL,
    OPC,
    OPT,
    _betas,
    _epochs,
    _estimator,
    _eval,
    _eval_interval,
    _kl_loss,
    _loss_reduction,
    _max_batches,
    _scheduler,
    _strategy,
    _tis,
    _use_tis,
)


def _skyrl_ds_type(value: Any, ctx: Mapping[str, Any]) -> bool:
    if value == "filter":
        return True
    if value is None or value == "null":
        return False
    if value == "replace":
        raise Untranslatable(
            "SkyRL's replace (POLARIS) overwrites zero-variance groups with copies of "
            "informative ones; needs that replacement, which dapo-megatron lacks (here: "
            "dapo.dynamic_sampling.enabled=true filters and generates more rounds)"
        )
    raise Untranslatable(f"needs SkyRL's {value!r} dynamic sampling, which dapo-megatron lacks")


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
    raise Untranslatable(f"needs SkyRL's {value} policy loss, which dapo-megatron lacks")


def _overlong_default(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is None:
        return Translation(
            ((f"{OB}.enabled", False),),
            "no overlong penalty: only examples/train/algorithms/dapo/main_dapo.py adds one",
        )
    return _skyrl_overlong_length("x").convert(value, ctx)


def _read_with(key: str, other: str) -> ForeignKey:
    return noop(key, f"read with {other}")


SKYRL_ALGO_KEYS: tuple[ForeignKey, ...] = (
    same(SKYRL, f"{ALGO}.eps_clip_low", CLIP_LOW, LOW_WHY),
    same(SKYRL, f"{ALGO}.eps_clip_high", CLIP_HIGH, HIGH_WHY),
    mapped(
        SKYRL,
        f"{ALGO}.dynamic_sampling.type",
        f"{DS}.enabled",
        "filter: true, null: false; SkyRL filters on the environment's reward before the "
        "overlong penalty (trainer.py), the aime reward is +1/-1: ours on accuracy, the same",
        _skyrl_ds_type,
    ),
    custom(
        SKYRL,
        f"{ALGO}.dynamic_sampling.max_sample_batches",
        f"{DS}.max_gen_batches (+ surplus, batch_multiplier)",
        UNLIMITED_WHY + "; with filter: surplus discard, batch_multiplier 1",
        _max_batches,
    ),
    _read_with(f"{ALGO}.dynamic_sampling.min_replace_ratio", f"{ALGO}.dynamic_sampling.type"),
    custom(
        SKYRL,
        f"{ALGO}.loss_reduction",
        AGG,
        "token_mean: token-mean; sequence_mean: seq-mean-token-mean; seq_mean_token_sum_norm "
        "(with max_seq_len); token_mean_legacy: seq-mean-token-mean with one-sample "
        "micro-batches, else refused",
        _loss_reduction,
    ),
    _read_with(f"{ALGO}.max_seq_len", f"{ALGO}.loss_reduction"),
    same(SKYRL, "generator.apply_overlong_filtering", "dapo.overlong_filtering"),
    _skyrl_overlong_length(f"{ALGO}.overlong_buffer.len"),
    custom(
        SKYRL,
        f"{ALGO}.overlong_buffer_len",
        f"{OB}.length (+ enabled)",
        "same ramp over the last {v} tokens of the response cap (main_dapo.py); absent: "
        "no penalty (SkyRL's base trainer)",
        _overlong_default,
    ),
    same(
        SKYRL,
        f"{ALGO}.overlong_buffer.penalty_factor",
        f"{OB}.penalty_factor",
        "same meaning: the penalty lies in [-{v}, 0]",
    ),
    same(
        SKYRL,
        f"{ALGO}.overlong_buffer_penalty_factor",
        f"{OB}.penalty_factor",
        "same meaning: the penalty lies in [-{v}, 0]",
    ),
    same(SKYRL, "trainer.train_batch_size", "dapo.num_prompts_per_step"),
    same(SKYRL, "generator.n_samples_per_prompt", "dapo.num_generations_per_prompt"),
    hub_model("trainer.policy.model.path", SKYRL),
    policy_mini_batch(SKYRL, "trainer.policy_mini_batch_size", "generator.n_samples_per_prompt"),
    noop("trainer.critic_mini_batch_size", "no critic: GRPO"),
    same(SKYRL, "generator.sampling_params.max_generate_length", MAX_RESPONSE),
    same(SKYRL, "generator.sampling_params.temperature", "generation.temperature"),
    same(SKYRL, "generator.sampling_params.top_p", "generation.top_p"),
    mapped(
        SKYRL,
        "generator.sampling_params.top_k",
        "generation.top_k",
        "same meaning (-1: off)",
        sampling_top_k,
    ),
    only("generator.sampling_params.min_p", "min-p sampling", off(0.0, 0), "no min-p"),
    only(
        "generator.sampling_params.repetition_penalty", "a repetition penalty", off(1.0, 1), "none"
    ),
    only("generator.sampling_params.stop", "stop strings", off(None), "the tokenizer's EOS"),
    noop("generator.sampling_params.logprobs", "the engine's log-probs of the sampled tokens"),
    same(SKYRL, "trainer.max_prompt_length", "data.max_prompt_length"),
    same(SKYRL, f"{OPT}.lr", "policy.optimizer.lr"),
    same(SKYRL, f"{OPT}.weight_decay", "policy.optimizer.weight_decay"),
    same(SKYRL, f"{OPT}.max_grad_norm", "policy.optimizer.clip_grad"),
    same(
        SKYRL,
        f"{OPT}.num_warmup_steps",
        "policy.scheduler.lr_warmup_steps",
        "same unit from lr 0: SkyRL's Megatron OptimizerParamScheduler (distributed/megatron/"
        "optimizer.py) steps once per optimizer step (megatron_strategy.py), as ours",
    ),
    custom(
        SKYRL,
        f"{OPT}.scheduler",
        "policy.scheduler.lr_decay_style",
        "constant_with_warmup: constant after the warm-up; others refused",
        _scheduler,
    ),
    custom(
        SKYRL,
        f"{OPT}.adam_betas",
        "policy.optimizer.adam_beta1 (+ adam_beta2)",
        "same meaning",
        _betas,
    ),
    noop(f"{OPT}.offload_after_step", "where optimizer states live between steps"),
    custom(
        SKYRL,
        f"{ALGO}.use_kl_loss",
        "dapo.loss.kl_coef (+ kl_estimator)",
        "false: kl_coef 0; true: kl_loss_coef when the policy loss is per-sequence too "
        "(SkyRL averages the KL per sequence)",
        _kl_loss,
    ),
    _read_with(f"{ALGO}.kl_loss_coef", f"{ALGO}.use_kl_loss"),
    _read_with(f"{ALGO}.kl_estimator_type", f"{ALGO}.use_kl_loss"),
    only(f"{ALGO}.use_kl_in_reward", "a KL penalty in the reward", off(False), "none"),
    only(f"{ALGO}.use_entropy_loss", "SkyRL's per-sequence entropy loss", off(False), "none"),
    _read_with(f"{ALGO}.entropy_loss_coef", f"{ALGO}.use_entropy_loss"),
    custom(
        SKYRL,
        f"{ALGO}.advantage_estimator",
        "dapo.advantage.leave_one_out",
        "grpo: the group mean as baseline (not leave-one-out); others refused",
        _estimator,
    ),
    same(SKYRL, f"{ALGO}.grpo_norm_by_std", "dapo.advantage.norm_by_std"),
    only(f"{ALGO}.advantage_batch_normalize", "batch-normalised advantages", off(False), "none"),
    only(
        f"{ALGO}.zero_variance_filter",
        "loss-masking zero-variance groups",
        off(False),
        "none (dynamic sampling removes them instead)",
    ),
    custom(
        SKYRL,
        f"{ALGO}.clip_ratio_c",
        CLIP_C,
        "the dual-clip bound, applied only when policy_loss_type is dual_clip (SkyRL "
        "ppo_utils.py); otherwise null (off)",
        _skyrl_dual_clip,
    ),
    custom(
        SKYRL,
        f"{ALGO}.policy_loss_type",
        f"{CLIP_C} (read with clip_ratio_c)",
        "regular: the clipped surrogate (dual clip off); dual_clip: with clip_ratio_c; "
        "others refused",
        _skyrl_loss_type,
    ),
    custom(
        SKYRL,
        f"{OPC}.tis_ratio_type",
        "dapo.loss.rollout_correction (+ level, tis_cap)",
        "null: none; token / sequence: truncated importance weights",
        _tis,
    ),
    _read_with(f"{OPC}.token_tis_ratio_clip_high", f"{OPC}.tis_ratio_type"),
    _read_with(f"{OPC}.sequence_tis_ratio_clip_high", f"{OPC}.tis_ratio_type"),
    custom(
        SKYRL,
        f"{ALGO}.use_tis",
        "dapo.loss.rollout_correction (+ tis_cap)",
        "true: token TIS capped at tis_imp_ratio_cap (deprecated there)",
        _use_tis,
    ),
    _read_with(f"{ALGO}.tis_imp_ratio_cap", f"{ALGO}.use_tis"),
    only(
        f"{OPC}.sequence_mask_metric",
        "SkyRL's sequence masking by a ratio metric",
        off(None),
        "none",
    ),
    *(
        _read_with(f"{OPC}.{k}", f"{OPC}.sequence_mask_metric")
        for k in ("geo_mask_high", "geo_mask_low", "product_mask_high", "product_mask_low")
    ),
    *(
        only(f"{OPC}.{k}", "SkyRL's outlier token masking", off(None), "none")
        for k in (
            "outlier_token_is_threshold_low",
            "outlier_token_is_threshold_high",
            "token_mask_is_threshold_low",
            "token_mask_is_threshold_high",
        )
    ),
    same(SKYRL, "generator.eval_n_samples_per_prompt", "validation.num_samples_per_prompt"),
    custom(
        SKYRL,
        f"{EVAL}.temperature",
        "validation.temperature (or greedy)",
        "same meaning; 0 or no eval_sampling_params: greedy",
        _eval("temperature"),
    ),
    custom(SKYRL, f"{EVAL}.top_p", "validation.top_p", "same meaning", _eval("top_p")),
    custom(
        SKYRL,
        f"{EVAL}.max_generate_length",
        "(none: the training cap here)",
        "the training cap: as here; another cap refused",
        _eval("max_generate_length"),
    ),
    custom(
        SKYRL, "trainer.eval_interval", "validation.val_period", "same; -1 (off): 0", _eval_interval
    ),
    same(SKYRL, "trainer.eval_before_train", "validation.val_at_start"),
    same(SKYRL, "trainer.ckpt_interval", "checkpointing.save_period"),
    same(SKYRL, "trainer.ckpt_path", "checkpointing.checkpoint_dir"),
    same(SKYRL, "trainer.seed", "run.seed"),
    same(SKYRL, "trainer.max_training_steps", "dapo.max_num_steps"),
    custom(SKYRL, "trainer.epochs", "(none: dapo.max_num_steps)", "passes over the data", _epochs),
    only("trainer.update_epochs_per_batch", "several passes over each batch", off(1), "one pass"),
    noop(
        "trainer.recompute_old_logprobs_per_minibatch",
        "when old log-probs are computed: the same values",
    ),
    custom(
        SKYRL,
        "trainer.strategy",
        "(none: Megatron-Core here)",
        "megatron: as here; FSDP refused",
        _strategy,
    ),
    only("trainer.policy.sequence_parallel_size", "Ulysses sequence parallelism", off(1), "none"),
    noop("trainer.policy.fsdp_config.fsdp_size", "read with trainer.strategy"),
    only("trainer.policy.model.lora.rank", "LoRA", off(0), "full fine-tuning"),
    *(
        _read_with(f"trainer.policy.model.lora.{k}", "trainer.policy.model.lora.rank")
        for k in ("alpha", "dropout", "target_modules", "init_method", "exclude_modules")
    ),
    only(
        "trainer.policy.model.fake_int4_qat.enabled",
        "fake-INT4 quantisation-aware training",
        off(False),
        "bf16 weights",
    ),
    *(
        _read_with(f"trainer.policy.model.fake_int4_qat.{k}", "fake_int4_qat.enabled")
        for k in ("group_size", "scale_divisor", "bf16_base_path", "symmetric")
    ),
    only("trainer.mtp.enabled", "multi-token prediction (MTP) training", off(False), "none"),
    *(
        _read_with(f"trainer.mtp.{k}", "trainer.mtp.enabled")
        for k in ("num_speculative_tokens", "loss_weight")
    ),
    only(
        "trainer.fully_async.enabled",
        "SkyRL's fully asynchronous training",
        off(False),
        "synchronous steps",
    ),
    *(
        _read_with(f"trainer.fully_async.{k}", "trainer.fully_async.enabled")
        for k in (
            "max_staleness_steps",
            "num_parallel_generation_workers",
            "clear_kv_cache_on_weight_sync",
            "sample_full_batch",
        )
    ),
)
"""SkyRL's algorithm, optimizer and evaluation keys."""

SKYRL_KEYS: tuple[ForeignKey, ...] = SKYRL_ALGO_KEYS + SKYRL_LAYOUT_KEYS
"""All of SkyRL's keys (skyrl_layout.py has the layout, engine and data ones)."""


SKYRL_TIERS: dict[str, str] = {
    "trainer.ckpt_path": IMPACT_HARMLESS,  # a directory
    "trainer.export_path": IMPACT_HARMLESS,
    "trainer.epochs": IMPACT_HARMLESS,  # when the run stops (_epochs says why)
    "trainer.max_ckpts_to_keep": IMPACT_HARMLESS,
    "trainer.eval_batch_size": IMPACT_HARMLESS,  # evaluation batching
    "trainer.remove_microbatch_padding": IMPACT_HARMLESS,  # packing: any value trains alike
    "trainer.strategy": IMPACT_LAYOUT,  # FSDP / Megatron backend
    "generator.batched": IMPACT_LAYOUT,  # batched vs per-request generation
}
"""SkyRL keys (or subtrees ending in ".") classified by what the source does with them,
read before the patterns of dialects.impact."""


SKYRL_DEFAULTS: dict[str, Any] = {
    # skyrl/train/config/config.py, the dataclass defaults (AlgorithmConfig, TrainerConfig,
    # OptimizerConfig, GeneratorConfig, SamplingParams, PlacementConfig, MegatronConfig).
    f"{ALGO}.eps_clip_low": 0.2,
    f"{ALGO}.eps_clip_high": 0.2,
    f"{ALGO}.policy_loss_type": "regular",
    f"{ALGO}.loss_reduction": "token_mean",
    f"{ALGO}.dynamic_sampling.type": None,
    f"{ALGO}.dynamic_sampling.max_sample_batches": 30,
    f"{ALGO}.use_kl_loss": True,
    f"{ALGO}.advantage_estimator": "grpo",
    f"{ALGO}.grpo_norm_by_std": True,
    f"{OPC}.tis_ratio_type": None,
    # main_dapo.py's DAPOAlgorithmConfig adds overlong_buffer_len (512); the base trainer
    # has none, and every shipped main_dapo script sets it: absent means no penalty.
    f"{ALGO}.overlong_buffer_len": None,
    f"{OPT}.lr": 1.0e-6,
    f"{OPT}.weight_decay": 1.0e-2,
    f"{OPT}.max_grad_norm": 1.0,
    f"{OPT}.num_warmup_steps": 0,
    f"{OPT}.scheduler": "constant_with_warmup",
    f"{OPT}.adam_betas": [0.9, 0.999],
    "trainer.train_batch_size": 1024,
    "trainer.policy_mini_batch_size": 256,
    "trainer.micro_train_batch_size_per_gpu": 1,
    "trainer.micro_forward_batch_size_per_gpu": 1,
    "trainer.max_prompt_length": 512,
    "trainer.eval_before_train": True,
    "trainer.eval_interval": 5,
    "trainer.gradient_checkpointing": True,
    "trainer.strategy": "fsdp",
    "trainer.placement.colocate_all": True,
    "trainer.placement.policy_num_nodes": 1,
    "trainer.placement.policy_num_gpus_per_node": 1,
    "trainer.policy.megatron_config.tensor_model_parallel_size": 1,
    "trainer.policy.megatron_config.pipeline_model_parallel_size": 1,
    "trainer.policy.model.path": "Qwen/Qwen2.5-1.5B-Instruct",
    "generator.n_samples_per_prompt": 5,
    "generator.apply_overlong_filtering": False,
    "generator.sampling_params.max_generate_length": 1024,
    "generator.sampling_params.temperature": 1.0,
    "generator.sampling_params.top_p": 1.0,
    "trainer.policy.megatron_config.context_parallel_size": 1,
    "trainer.policy.megatron_config.expert_model_parallel_size": 1,
    "generator.eval_n_samples_per_prompt": 1,
    f"{EVAL}.temperature": None,
    f"{EVAL}.top_p": None,
    f"{EVAL}.max_generate_length": None,
    "generator.inference_engine.backend": "vllm",
    "generator.inference_engine.tensor_parallel_size": 1,
    "generator.inference_engine.num_engines": 1,
    "generator.inference_engine.gpu_memory_utilization": 0.8,
    "generator.inference_engine.max_num_seqs": 1024,
    "environment.env_class": "gsm8k",
    # DataConfig: train_data ~/data/gsm8k/train.parquet, val_data ~/data/gsm8k/validation.parquet
    "data.train_data": ["~/data/gsm8k/train.parquet"],
    "data.val_data": ["~/data/gsm8k/validation.parquet"],
}
"""The value the source's code or base config gives a key that a config omits, for the
keys that change a run (an omitted key takes the source's default, never ours)."""


def inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Keys of a config that are not live in SkyRL (key -> why): a feature's settings
    while the feature is off (config.py reads them only then)."""
    out: dict[str, str] = {}

    def dead(prefix: str, why: str, keep: str = "") -> None:
        for key in flat:
            if key.lstrip("+").startswith(prefix) and key.lstrip("+") != keep:
                out[key] = f"not live: {why}"

    if flat.get(f"{ALGO}.dynamic_sampling.type") is None:
        dead(
            f"{ALGO}.dynamic_sampling.",
            "dynamic_sampling.type is null",
            f"{ALGO}.dynamic_sampling.type",
        )
    if flat.get(f"{ALGO}.use_kl_loss", True) is False:
        for k in ("kl_loss_coef", "kl_estimator_type"):
            dead(f"{ALGO}.{k}", "use_kl_loss is false")
    if flat.get(f"{ALGO}.use_entropy_loss", False) is False:
        dead(f"{ALGO}.entropy_loss_coef", "use_entropy_loss is false")
    if flat.get(f"{OPC}.tis_ratio_type") is None and flat.get(f"{ALGO}.use_tis") is not True:
        dead(f"{OPC}.token_tis_ratio_clip_high", "tis_ratio_type is null")
        dead(f"{OPC}.sequence_tis_ratio_clip_high", "tis_ratio_type is null")
    if flat.get(f"{ALGO}.use_tis") is not True:
        dead(f"{ALGO}.tis_imp_ratio_cap", "use_tis is false")
    if flat.get(f"{OPC}.sequence_mask_metric") is None:
        for k in ("geo_mask_high", "geo_mask_low", "product_mask_high", "product_mask_low"):
            dead(f"{OPC}.{k}", "sequence_mask_metric is null")
    if flat.get("trainer.policy.model.lora.rank", 0) == 0:
        dead("trainer.policy.model.lora.", "lora.rank is 0", "trainer.policy.model.lora.rank")
        dead(f"{MEG_LORA}", "lora.rank is 0")
    if flat.get("trainer.policy.model.fake_int4_qat.enabled", False) is False:
        dead(
            "trainer.policy.model.fake_int4_qat.",
            "fake_int4_qat.enabled is false",
            "trainer.policy.model.fake_int4_qat.enabled",
        )
    if flat.get("trainer.mtp.enabled", False) is False:
        dead("trainer.mtp.", "mtp.enabled is false", "trainer.mtp.enabled")
        dead("trainer.policy.megatron_config.mtp_", "mtp.enabled is false")
    if flat.get("trainer.fully_async.enabled", False) is False:
        dead("trainer.fully_async.", "fully_async.enabled is false", "trainer.fully_async.enabled")
    if flat.get("trainer.strategy") == "megatron":
        dead("trainer.policy.fsdp_config.", "trainer.strategy is megatron")
    return out


MEG_LORA = "trainer.policy.megatron_config.lora_config."
