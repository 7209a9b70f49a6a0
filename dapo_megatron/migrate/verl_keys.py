"""verl's keys in the table (recipe/dapo/*.sh, trainer/config/ppo_trainer.yaml), with their
converters; dialect_keys.py joins the tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from dapo_megatron.migrate.dialects import (
    IMPACT_HARMLESS,
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    as_int,
    choice,
    custom,
    kl_estimator,
    off,
    policy_mini_batch,
    same,
    same_agg,
    sampling_top_k,
    warmup_in_optimizer_steps,
)
from dapo_megatron.migrate.shared_keys import (
    CLIP_C,
    CLIP_HIGH,
    CLIP_LOW,
    DS,
    DUAL_WHY,
    HIGH_WHY,
    LOW_WHY,
    MAX_RESPONSE,
    OB,
    UNLIMITED_WHY,
    VERL,
)
from dapo_megatron.migrate.verl_data import VERL_DATA_KEYS, VERL_READS_UNRESOLVED, data_inactive
from dapo_megatron.migrate.verl_layout import (
    VERL_ACTOR,
    VERL_LAYOUT_KEYS,
    VERL_ROLLOUT,
    layout_inactive,
)

FILTER_KEY = "algorithm.filter_groups.enable"


def _filtering(ctx: Mapping[str, Any]) -> bool:
    return ctx.get(FILTER_KEY) is True


def trained_prompts(ctx: Mapping[str, Any]) -> tuple[int, str]:
    """(Prompts verl trains per step, in words). verl-recipe dapo_ray_trainer.py `fit`: the
    dataloader yields gen_batch_size prompts (ray_trainer.py _create_dataloader,
    `data.get("gen_batch_size", train_batch_size)`); with filter_groups off `batch =
    new_batch`, the whole generated batch is trained; with it on, kept groups accumulate
    until train_batch_size and `batch[:traj_bsz]` (train_batch_size x n) is trained."""
    prompts = ctx.get("data.train_batch_size")
    if not _positive_int(prompts):
        raise Untranslatable("data.train_batch_size is not a positive integer")
    if _filtering(ctx):
        return prompts, f"train_batch_size {prompts} (filter_groups on)"
    gen = ctx.get("data.gen_batch_size", prompts)
    if not _positive_int(gen):
        raise Untranslatable(f"data.gen_batch_size {gen!r} is not a positive integer")
    if gen == prompts:
        return gen, f"train_batch_size {prompts}"
    return gen, f"gen_batch_size {gen} (filter_groups off: the whole generated batch)"


def _verl_train_batch(value: Any, ctx: Mapping[str, Any]) -> Translation:
    n, words = trained_prompts({**ctx, "data.train_batch_size": as_int(value)})
    if n == value:
        return Translation((("dapo.num_prompts_per_step", n),), "same meaning: prompts per step")
    return Translation(
        (("dapo.num_prompts_per_step", n),),
        f"not train_batch_size: verl trains the whole generated batch, {words} "
        "(dapo_ray_trainer.py fit: `batch = new_batch`)",
    )


def _verl_gen_batch(value: Any, ctx: Mapping[str, Any]) -> Translation:
    gen = as_int(value)
    ctx = {**ctx, "data.gen_batch_size": gen}
    if not _positive_int(ctx.get("data.train_batch_size")):
        raise Untranslatable(
            "verl generates gen_batch_size prompts every round; with filter_groups on ours "
            "generates batch_multiplier x the groups still missing: set "
            "dapo.dynamic_sampling.batch_multiplier = gen_batch_size / data.train_batch_size "
            "(e.g. 1536 / 512 = 3); with it off verl trains all gen_batch_size prompts: set "
            "dapo.num_prompts_per_step = gen_batch_size"
        )
    if not _filtering(ctx):
        n, words = trained_prompts(ctx)
        return Translation(
            (("dapo.num_prompts_per_step", n),),
            f"filter_groups off: each step trains its {words} (dapo_ray_trainer.py fit)",
        )
    prompts = as_int(ctx.get("data.train_batch_size"))
    ratio = gen / prompts
    return Translation(
        ((f"{DS}.batch_multiplier", max(1.0, ratio)),),
        f"approximately: round 1 draws {gen} = {ratio:g} x {prompts} prompts in both; verl's "
        f"later rounds draw {gen} again, ours {ratio:g} x the groups still missing",
    )


def _verl_filter(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is True:
        return Translation(
            ((f"{DS}.enabled", True), (f"{DS}.surplus", "discard")),
            "same meaning; groups kept beyond train_batch_size are discarded, as verl's "
            "`batch = batch[:traj_bsz]` (dapo_ray_trainer.py fit) does: surplus discard",
        )
    if value is False:
        return Translation(((f"{DS}.enabled", False),), "same meaning: no filtering")
    raise Untranslatable(f"{value!r}: expected true or false")


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


# ---------------------------------------------------------------------------------------
# The lr warm-up. verl steps its lr schedule once per trainer step, after all of that step's
# optimizer steps (one per mini-batch: data.train_batch_size / ppo_mini_batch_size x
# ppo_epochs): fsdp_workers.py and megatron_workers.py `update_actor` call
# `update_policy` (dp_actor.py / megatron_actor.py, one optimizer.step() per mini-batch) and
# then step the scheduler once; engine_workers.py `update_actor` sets update_lr_scheduler on
# the last mini-batch only. verl-recipe's dapo_ray_trainer.py `fit` calls update_actor once
# per global step. Ours steps once per optimizer step (megatron/policy_step.py), so the
# counts agree only at one optimizer step per trainer step (dialects.py
# warmup_in_optimizer_steps). The ramp is the same shape: linear from 0 (verl's
# lr_warmup_init, 0.0 in optim/megatron.yaml, our default too) in Megatron's
# OptimizerParamScheduler; min(1, step / N) x lr in torch_functional.py
# get_constant_schedule_with_warmup (FSDP).
#
# lr_warmup_steps <= 0 defers to lr_warmup_steps_ratio x total trainer steps (int();
# engine/fsdp/transformer_impl.py `_build_lr_scheduler`, utils/megatron/optimizer.py
# get_megatron_optimizer_param_scheduler), except in the legacy FSDP worker (fsdp_workers.py
# `_build_model_optimizer`), where only a negative value does (0: no warm-up); Megatron
# multiplies the ratio by optim.lr_decay_steps when that is set. The total
# is trainer.total_training_steps when set, else len(dataloader) x total_epochs
# (ray_trainer.py `_create_dataloader`), which this importer cannot know.


def _verl_updates_per_step(ctx: Mapping[str, Any]) -> tuple[int, str]:
    """(Optimizer steps per trainer step, in words): one per mini-batch per epoch."""
    keys = (
        "data.train_batch_size",
        f"{VERL_ACTOR}.ppo_mini_batch_size",
        f"{VERL_ACTOR}.ppo_epochs",
    )
    prompts, mini, epochs = (ctx.get(k) for k in keys)
    if _positive_int(prompts):
        prompts, batch_words = trained_prompts(ctx)
    if not (_positive_int(prompts) and _positive_int(mini) and _positive_int(epochs)):
        raise Untranslatable(
            "verl counts it in trainer steps, ours in optimizer steps: converting needs "
            + ", ".join(keys)
        )
    if prompts % mini:
        raise Untranslatable(
            f"{batch_words} is not a whole number of ppo_mini_batch_size {mini} mini-batches"
        )
    words = f"{batch_words} / ppo_mini_batch_size {mini} x ppo_epochs {epochs}"
    return prompts // mini * epochs, words


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _warmup(trainer_steps: int, ctx: Mapping[str, Any]) -> Translation:
    steps, note = warmup_in_optimizer_steps(
        VERL, "trainer step", trainer_steps, lambda: _verl_updates_per_step(ctx)
    )
    return Translation((("policy.scheduler.lr_warmup_steps", steps),), note)


def _verl_warmup_steps(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value is not None and as_int(value) > 0:
        return _warmup(value, ctx)
    return Translation((), f"{_shown(value)}: lr_warmup_steps_ratio decides")


def _verl_warmup_ratio(value: Any, ctx: Mapping[str, Any]) -> Translation:
    steps = ctx.get(f"{VERL_ACTOR}.optim.lr_warmup_steps", -1)
    if steps is not None and as_int(steps) > 0:
        return Translation((), f"not read: lr_warmup_steps {steps} decides")
    if value is None or value == 0:
        return _warmup(0, ctx)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise Untranslatable(f"{value!r}: expected a fraction of the training steps")
    if steps == 0:
        raise Untranslatable(
            f"lr_warmup_steps 0 with ratio {value}: verl's legacy FSDP worker then has no "
            "warm-up, its Megatron and engine workers warm up over the ratio; set "
            "lr_warmup_steps to -1 (the ratio) or the ratio to 0 (none)"
        )
    if ctx.get(f"{VERL_ACTOR}.optim.lr_decay_steps") is not None:
        raise Untranslatable(
            "optim.lr_decay_steps is set: verl's Megatron worker takes the ratio of it, "
            "its FSDP workers of the total trainer steps; set lr_warmup_steps instead"
        )
    total = ctx.get("trainer.total_training_steps")
    if not _positive_int(total):
        raise Untranslatable(
            f"lr_warmup_steps_ratio {value} x verl's total trainer steps, which this "
            "importer cannot know (trainer.total_training_steps is not set)"
        )
    return _warmup(int(value * total), ctx)


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


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


KL_SWITCH = f"{VERL_ACTOR}.use_kl_loss"


def _verl_kl_switch(value: Any, ctx: Mapping[str, Any]) -> Translation:
    # verl's actor adds kl_loss_coef x KL(ref) to the loss only when use_kl_loss is true
    # (workers/actor/megatron_actor.py / dp_actor.py); ours when dapo.loss.kl_coef > 0.
    if value is True:
        return Translation((), "true: the KL loss term, its coefficient from kl_loss_coef")
    if value is False:
        return Translation((("dapo.loss.kl_coef", 0.0),), "false: no KL loss, kl_coef 0")
    raise Untranslatable(f"{value!r}: expected true or false")


def _verl_kl_coef(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if ctx.get(KL_SWITCH) is not True:
        return Translation((), "not read: use_kl_loss is false")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise Untranslatable(f"{value!r}: expected a coefficient >= 0")
    return Translation(
        (("dapo.loss.kl_coef", float(value)),),
        "same meaning: a KL loss term against the reference policy",
    )


def _verl_top_k(value: Any, ctx: Mapping[str, Any]) -> Translation:
    k = sampling_top_k(value, ctx)
    note = "off (-1 here)" if k == -1 else f"same meaning: the {k} most likely tokens"
    return Translation((("generation.top_k", k),), f"{_shown(value)}: {note}")


def _verl_do_sample(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if not isinstance(value, bool):
        raise Untranslatable(f"{value!r}: expected true or false")
    if value:
        return Translation((("validation.greedy", False),), "true: sampled validation")
    return Translation((("validation.greedy", True),), "false: greedy validation")


def _verl_val_temperature(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value == 0 or ctx.get(f"{VERL_ROLLOUT}.val_kwargs.do_sample") is False:
        return Translation((("validation.greedy", True),), "greedy validation")
    return Translation((("validation.temperature", value),), "same meaning")


VERL_KEYS: tuple[ForeignKey, ...] = (
    same(VERL, f"{VERL_ACTOR}.clip_ratio_low", CLIP_LOW, LOW_WHY),
    same(VERL, f"{VERL_ACTOR}.clip_ratio_high", CLIP_HIGH, HIGH_WHY),
    same(VERL, f"{VERL_ACTOR}.clip_ratio_c", CLIP_C, DUAL_WHY),
    same_agg(VERL, f"{VERL_ACTOR}.loss_agg_mode"),
    custom(
        VERL,
        FILTER_KEY,
        f"{DS}.enabled (+ surplus)",
        "same meaning; true: surplus groups discarded, as verl's batch[:traj_bsz]",
        _verl_filter,
    ),
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
        "filter_groups off: the prompts trained per step; on: no exact equivalent, verl "
        "generates {v} prompts every round; converted to {v} / data.train_batch_size x the "
        "groups still missing",
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
    custom(
        VERL,
        "data.train_batch_size",
        "dapo.num_prompts_per_step",
        "same meaning with filter_groups on; off: verl trains the whole gen_batch_size batch",
        _verl_train_batch,
    ),
    same(VERL, "data.max_prompt_length", "data.max_prompt_length"),
    same(VERL, "data.max_response_length", MAX_RESPONSE),
    same(VERL, f"{VERL_ACTOR}.optim.lr", "policy.optimizer.lr"),
    policy_mini_batch(VERL, f"{VERL_ACTOR}.ppo_mini_batch_size", f"{VERL_ROLLOUT}.n"),
    same(
        VERL,
        f"{VERL_ACTOR}.entropy_coeff",
        "dapo.loss.entropy_coef",
        "same meaning: the loss subtracts {v} x entropy",
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.use_kl_loss",
        "dapo.loss.kl_coef",
        "false: dapo.loss.kl_coef = 0; true: kl_loss_coef is carried",
        _verl_kl_switch,
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.kl_loss_coef",
        "dapo.loss.kl_coef",
        "same meaning while `use_kl_loss` is true (unused otherwise)",
        _verl_kl_coef,
    ),
    kl_estimator(VERL, f"{VERL_ACTOR}.kl_loss_type"),
    same(VERL, f"{VERL_ROLLOUT}.temperature", "generation.temperature"),
    same(VERL, f"{VERL_ROLLOUT}.top_p", "generation.top_p"),
    custom(
        VERL,
        f"{VERL_ROLLOUT}.top_k",
        "generation.top_k",
        "same meaning; 0 and -1: off (-1 here)",
        _verl_top_k,
    ),
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
    same(VERL, "trainer.nnodes", "cluster.num_nodes"),
    same(VERL, "trainer.n_gpus_per_node", "cluster.gpus_per_node"),
    same(
        VERL,
        "trainer.total_training_steps",
        "dapo.max_num_steps",
        "same unit: trainer steps, one policy update each (verl-recipe dapo_ray_trainer.py "
        "fit counts global_steps), as ours",
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.optim.lr_warmup_steps",
        "policy.scheduler.lr_warmup_steps",
        "verl steps its lr schedule once per trainer step, after all of that step's "
        "optimizer steps (fsdp_workers.py / megatron_workers.py update_actor; "
        "engine_workers.py on the last mini-batch), ours once per optimizer step: the same "
        "count when a trainer step is one optimizer step (train_batch_size = "
        "ppo_mini_batch_size, ppo_epochs 1), else refused (verl keeps one lr over a step's "
        "optimizer steps); <= 0: lr_warmup_steps_ratio decides",
        _verl_warmup_steps,
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.optim.lr_warmup_steps_ratio",
        "policy.scheduler.lr_warmup_steps",
        "read when lr_warmup_steps <= 0: int(ratio x trainer.total_training_steps) trainer "
        "steps, carried as lr_warmup_steps is; refused with lr_warmup_steps 0 (verl's "
        "workers disagree), with optim.lr_decay_steps (Megatron's base), or without "
        "total_training_steps",
        _verl_warmup_ratio,
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
    custom(
        VERL,
        f"{VERL_ROLLOUT}.val_kwargs.do_sample",
        "validation.greedy",
        "false: greedy validation (validation.greedy true); true: sampled (false)",
        _verl_do_sample,
    ),
    same(VERL, "trainer.val_before_train", "validation.val_at_start"),
    same(VERL, "trainer.default_local_dir", "checkpointing.checkpoint_dir"),
    same(
        VERL,
        f"{VERL_ACTOR}.grad_clip",
        "policy.optimizer.clip_grad",
        "same meaning: the global gradient norm cap (the FSDP actor's name of optim.clip_grad)",
    ),
    custom(
        VERL,
        f"{VERL_ACTOR}.optim.lr_decay_style",
        "policy.scheduler.lr_decay_style",
        "Megatron's name of lr_scheduler_type: constant carried, others refused",
        _verl_warmup_style,
    ),
    as_here(
        VERL,
        f"{VERL_ROLLOUT}.val_kwargs.top_k",
        "top-k sampling in validation",
        off(-1, 0, None),
        "validation samples with top-p only (no top-k)",
    ),
    same(VERL, f"{VERL_ROLLOUT}.n", "dapo.num_generations_per_prompt"),
    *VERL_LAYOUT_KEYS,
    *VERL_DATA_KEYS,
)


VERL_TIERS: dict[str, str] = {
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": IMPACT_HARMLESS,  # metrics
    "trainer.default_local_dir": IMPACT_HARMLESS,  # the checkpoint directory
    # where verl reads the same weights converted (use_dist_checkpointing); ours reads HF's
    f"{VERL_ACTOR}.megatron.dist_checkpointing_path": IMPACT_HARMLESS,
    "actor_rollout_ref.ref.megatron.dist_checkpointing_path": IMPACT_HARMLESS,
}
"""Verl keys (or subtrees ending in ".") classified by what the source does with them,
read before the patterns of dialects.impact."""


VERL_DEFAULTS: dict[str, Any] = {
    # verl/trainer/config/_generated_ppo_megatron_trainer.yaml (actor, rollout, data,
    # trainer, algorithm) and verl-recipe dapo/config/dapo_megatron_trainer.yaml /
    # dapo_trainer.yaml (filter_groups, reward_kwargs.overlong_buffer_cfg, gen_batch_size =
    # train_batch_size, reward manager dapo).
    f"{VERL_ACTOR}.clip_ratio_low": 0.2,
    f"{VERL_ACTOR}.clip_ratio_high": 0.2,
    f"{VERL_ACTOR}.clip_ratio_c": 3.0,
    f"{VERL_ACTOR}.loss_agg_mode": "token-mean",
    f"{VERL_ACTOR}.entropy_coeff": 0,
    f"{VERL_ACTOR}.use_kl_loss": False,
    f"{VERL_ACTOR}.kl_loss_coef": 0.001,
    f"{VERL_ACTOR}.optim.lr": 1.0e-6,
    f"{VERL_ACTOR}.optim.lr_warmup_steps": -1,
    f"{VERL_ACTOR}.optim.lr_warmup_steps_ratio": 0.0,
    f"{VERL_ACTOR}.optim.weight_decay": 0.01,
    f"{VERL_ACTOR}.optim.clip_grad": 1.0,
    f"{VERL_ACTOR}.ppo_epochs": 1,
    f"{VERL_ACTOR}.ppo_mini_batch_size": 256,
    f"{VERL_ACTOR}.megatron.tensor_model_parallel_size": 1,
    f"{VERL_ACTOR}.megatron.pipeline_model_parallel_size": 1,
    f"{VERL_ACTOR}.megatron.context_parallel_size": 1,
    f"{VERL_ACTOR}.megatron.expert_model_parallel_size": 1,
    f"{VERL_ACTOR}.megatron.sequence_parallel": True,
    f"{VERL_ACTOR}.use_dynamic_bsz": False,
    f"{VERL_ROLLOUT}.n": 1,
    f"{VERL_ROLLOUT}.temperature": 1.0,
    f"{VERL_ROLLOUT}.top_p": 1.0,
    f"{VERL_ROLLOUT}.top_k": -1,
    f"{VERL_ROLLOUT}.tensor_model_parallel_size": 2,
    f"{VERL_ROLLOUT}.gpu_memory_utilization": 0.5,
    f"{VERL_ROLLOUT}.val_kwargs.n": 1,
    f"{VERL_ROLLOUT}.val_kwargs.temperature": 0,
    f"{VERL_ROLLOUT}.val_kwargs.top_p": 1.0,
    f"{VERL_ROLLOUT}.val_kwargs.do_sample": False,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.shuffle": True,
    "algorithm.filter_groups.enable": False,
    # dapo_trainer.yaml: "Non-positive values mean no upper limit".
    "algorithm.filter_groups.max_num_gen_batches": 0,
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.adv_estimator": "gae",
    "reward_model.reward_manager": "naive",
    "reward.reward_kwargs.overlong_buffer_cfg.enable": False,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.save_freq": -1,
    "trainer.test_freq": -1,
    "trainer.val_before_train": True,
    "trainer.total_epochs": 30,
}
"""The value the source's code or base config gives a key that a config omits, for the
keys that change a run (an omitted key takes the source's default, never ours). verl has no
overlong filtering (dapo.overlong_filtering stays off: VERL_FIXED)."""


__all__ = ["VERL_DEFAULTS", "VERL_KEYS", "VERL_READS_UNRESOLVED", "VERL_TIERS", "inactive"]


def inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Keys of a config that are not live in verl (key -> why)."""
    return {**layout_inactive(flat), **data_inactive(flat)}
