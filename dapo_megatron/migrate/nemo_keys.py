"""NeMo RL's keys in the table (examples/configs/grpo_math_1B.yaml, recipes/llm/*dapo*.yaml,
docs/guides/dapo.md), with their converters; dialect_keys.py joins the tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from dapo_megatron.migrate.dialects import (
    IMPACT_ALGORITHM,
    IMPACT_HARMLESS,
    IMPACT_LAYOUT,
    ForeignKey,
    Translation,
    Untranslatable,
    as_int,
    custom,
    hub_model,
    mapped,
    same,
    sampling_top_k,
    warmup_in_optimizer_steps,
)
from dapo_megatron.migrate.nemo_layout import (
    NEMO_LAYOUT_KEYS,
    NEMO_LAYOUT_TIERS,
    layout_inactive,
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


# ---------------------------------------------------------------------------------------
# The learning-rate schedule. Both NeMo RL policy workers step their scheduler once per
# train() call, i.e. once per GRPO step, after all of that step's optimizer steps
# (megatron_policy_worker.py `scheduler.step(increment=gbs)`, with Megatron Bridge's
# lr_warmup_steps = lr_warmup_iters x global batch; dtensor_policy_worker(_v2).py
# `scheduler.step()` after the global-batch loop). Ours steps once per optimizer step
# (megatron/policy_step.py). The two count alike only when a GRPO step is one optimizer
# step; otherwise NeMo RL holds one lr over a step's optimizer steps while ours ramps.
# (NeMo RL's Megatron worker also ticks after a step its optimizer skipped for a non-finite
# gradient; ours does not: the schedules part only after such a step.)

_SCHED = "policy.megatron_cfg.scheduler"
_LINEAR_LR = "torch.optim.lr_scheduler.LinearLR"
_CONSTANT_LR = "torch.optim.lr_scheduler.ConstantLR"
_TORCH_DEFAULTS: dict[str, dict[str, float]] = {
    _LINEAR_LR: {"start_factor": 1 / 3, "end_factor": 1.0, "total_iters": 5},
    _CONSTANT_LR: {"factor": 1 / 3, "total_iters": 5},
}
"""The torch schedulers carried, with torch's defaults for the kwargs a config omits."""
_BATCH_KEYS = (
    "grpo.num_prompts_per_step",
    "grpo.num_generations_per_prompt",
    "policy.train_global_batch_size",
)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(ctx: Mapping[str, Any], key: str) -> int | None:
    value = ctx.get(key)
    return value if _is_int(value) and value > 0 else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _optimizer_steps_per_grpo_step(ctx: Mapping[str, Any]) -> tuple[int, str]:
    """A GRPO step trains num_prompts_per_step x num_generations_per_prompt samples in
    global batches of train_global_batch_size, in NeMo RL as here: (that many optimizer
    steps, the sum in words)."""
    prompts, n, batch = (_positive_int(ctx, k) for k in _BATCH_KEYS)
    if prompts is None or n is None or batch is None:
        raise Untranslatable(
            "NeMo RL counts it in GRPO steps, ours in optimizer steps: converting needs "
            + ", ".join(_BATCH_KEYS)
        )
    if (prompts * n) % batch:
        raise Untranslatable(
            f"{prompts} x {n} samples per GRPO step is not a whole number of "
            f"train_global_batch_size {batch} batches"
        )
    return prompts * n // batch, f"{prompts} x {n} samples / train_global_batch_size {batch}"


def _warmup_steps(iters: int, ctx: Mapping[str, Any]) -> tuple[int, str]:
    """A warm-up of `iters` GRPO steps in our optimizer steps, with the note; refused when a
    GRPO step is several optimizer steps (NeMo RL's staircase is not our ramp)."""
    return warmup_in_optimizer_steps(
        NEMO, "GRPO step", iters, lambda: _optimizer_steps_per_grpo_step(ctx)
    )


def _megatron_warmup(value: Any, ctx: Mapping[str, Any]) -> Translation:
    iters = as_int(value)
    if ctx.get(f"{_SCHED}.lr_warmup_fraction") is not None:
        raise Untranslatable(
            "lr_warmup_fraction is set, and Megatron Bridge warms up over that fraction of "
            "the decay steps instead"
        )
    decay = ctx.get(f"{_SCHED}.lr_decay_iters")
    if decay is None:
        decay = ctx.get("grpo.max_num_steps")  # Bridge's train_iters is at most this
    if iters > 0 and _is_int(decay) and iters >= decay:
        raise Untranslatable(
            f"{iters} >= {decay} decay steps: Megatron Bridge shortens such a warm-up to end "
            "before the decay does; ours keeps it"
        )
    steps, note = _warmup_steps(iters, ctx)
    return Translation((("policy.scheduler.lr_warmup_steps", steps),), note)


def _megatron_decay_style(value: Any, ctx: Mapping[str, Any]) -> str:
    if value == "constant":
        return "constant"
    raise Untranslatable(
        f"{value!r}: only constant is carried; NeMo RL decays over GRPO steps "
        "(lr_decay_iters, null: its train_iters), ours over optimizer steps"
    )


def _megatron_decay_iters(value: Any, ctx: Mapping[str, Any]) -> Translation:
    style = ctx.get(f"{_SCHED}.lr_decay_style")
    if style == "constant":
        return Translation((), "not read: lr_decay_style is constant")
    raise Untranslatable(f"read with lr_decay_style {style!r}, which is not carried")


def _torch_entries(value: Any) -> tuple[list[tuple[str, dict[str, Any]]], Any]:
    """NeMo RL's list form of policy.scheduler: (name, kwargs with torch's defaults) per
    scheduler, and the milestones entry (SequentialLR's)."""
    if not isinstance(value, list) or not value:
        raise Untranslatable(
            f"{value!r}: only NeMo RL's list of torch schedulers and milestones is carried"
        )
    schedulers: list[tuple[str, dict[str, Any]]] = []
    milestones = None
    for entry in value:
        if isinstance(entry, dict) and set(entry) == {"milestones"}:
            milestones = entry["milestones"]
            continue
        name = entry.get("name") if isinstance(entry, dict) else None
        kwargs = entry.get("kwargs") if isinstance(entry, dict) else None
        known = _TORCH_DEFAULTS.get(str(name))
        if (
            known is None
            or not isinstance(kwargs, dict)
            or set(entry) != {"name", "kwargs"}
            or set(kwargs) - set(known)
        ):
            raise Untranslatable(
                f"{entry!r}: only a LinearLR warm-up followed by ConstantLR(factor 1) is carried"
            )
        schedulers.append((str(name), {**known, **kwargs}))
    wanted = len(schedulers) - 1
    if not (
        isinstance(milestones, list)
        and len(milestones) == wanted
        and all(_is_int(m) for m in milestones)
    ):
        raise Untranslatable(
            f"milestones {milestones!r}: SequentialLR needs {wanted} (one per scheduler after "
            "the first)"
        )
    return schedulers, milestones


def _torch_schedule(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """LinearLR(start_factor s, end_factor 1, total_iters N), then ConstantLR(factor 1) from
    a milestone >= N: lr goes from s x lr to lr over N scheduler steps, then stays. ConstantLR
    with factor 1 alone: no warm-up."""
    schedulers, milestones = _torch_entries(value)
    for name, kw in schedulers[1:]:
        if name != _CONSTANT_LR or kw["factor"] != 1:
            raise Untranslatable(
                f"{name.rsplit('.', 1)[-1]}({kw}) after the first scheduler changes the lr "
                "after warm-up; only ConstantLR(factor 1) is carried"
            )
    (name, kw) = schedulers[0]
    constant = ("policy.scheduler.lr_decay_style", "constant")
    if name == _CONSTANT_LR:
        if kw["factor"] != 1:
            raise Untranslatable(
                f"ConstantLR(factor {kw['factor']}) for {kw['total_iters']} steps, then the "
                "full lr: no counterpart here"
            )
        return Translation((("policy.scheduler.lr_warmup_steps", 0), constant), "no warm-up")
    start, end, iters = kw["start_factor"], kw["end_factor"], as_int(kw["total_iters"])
    if not (_is_number(start) and 0 < start <= 1) or end != 1:
        raise Untranslatable(
            f"LinearLR from {start} to {end} x lr: only a warm-up ending at the full lr "
            "(end_factor 1, 0 < start_factor <= 1) is carried"
        )
    if milestones and milestones[0] < iters:
        raise Untranslatable(
            f"milestone {milestones[0]} ends the {iters}-step LinearLR early (the lr jumps "
            "to its peak); ours has no such jump"
        )
    lr = ctx.get("policy.optimizer.kwargs.lr")
    if not _is_number(lr):
        raise Untranslatable("needs policy.optimizer.kwargs.lr: it starts at start_factor x lr")
    steps, note = _warmup_steps(iters if start < 1 else 0, ctx)
    init = start * lr
    return Translation(
        (
            ("policy.scheduler.lr_warmup_steps", steps),
            ("policy.scheduler.lr_warmup_init", init),
            constant,
        ),
        f"LinearLR warm-up from {start} x lr = {init}: {note}; then constant",
    )


# ---------------------------------------------------------------------------------------
# Lengths. NeMo RL's engine ends a response at its context, vLLM's max_model_len (by default
# policy.max_total_sequence_length), less the prompt: vllm_worker.py passes max_new_tokens
# and vLLM stops at max_model_len, vllm_worker_async.py takes min(max_new_tokens,
# max_model_len - prompt). Ours caps every response at generation.max_response_length and
# needs max_total_sequence_length >= data.max_prompt_length + that cap.
#
# Prompts. NeMo RL's data processors (data/processors.py: math_data_processor,
# math_hf_data_processor and the others alike, called for every row by
# data/datasets/processed_dataset.py, which drops none) test `length >= max_seq_length`, with
# max_seq_length = data.max_input_seq_length (data/utils.py): such a prompt stays in the data
# as a stub, each message cut to at most 4 tokens, with loss_multiplier 0 (the sample mask of
# the loss), so it is generated from and never trained. Ours drops a prompt longer than
# data.max_prompt_length before training (data/datasets.py encode_prompts). The longest
# prompt either trains is max_input_seq_length - 1 tokens.


def _prompt_limit(value: Any, ctx: Mapping[str, Any]) -> int:
    n = as_int(value)
    if n < 2:
        raise Untranslatable(
            f"{n}: NeMo RL turns every prompt (>= {n} tokens) into a stub it never trains"
        )
    return n - 1


def _total_length(value: Any, ctx: Mapping[str, Any]) -> int:
    total = as_int(value)
    prompt = ctx.get("data.max_input_seq_length")
    response = ctx.get("policy.generation.max_new_tokens")
    if not (_is_int(prompt) and _is_int(response)) or total >= prompt - 1 + response:
        return total
    longest = prompt - 1  # the longest prompt NeMo RL generates from for training
    context = ctx.get("policy.generation.vllm_cfg.max_model_len")
    context = context if _is_int(context) else total
    example = f", e.g. policy.generation.max_new_tokens={total - longest}" if total > prompt else ""
    raise Untranslatable(
        f"data.max_input_seq_length {prompt} trains prompts of up to {longest} tokens; "
        f"{longest} + policy.generation.max_new_tokens {response} = {longest + response} > "
        f"{total}: NeMo RL's engine ends each response at its context ({context} tokens, "
        "vLLM's max_model_len) less the prompt, a cap that differs per prompt; ours caps "
        "every response at generation.max_response_length and needs "
        "max_total_sequence_length >= prompt + response. Re-import with NeMo RL overrides "
        "that fit, max_input_seq_length - 1 + max_new_tokens <= "
        f"max_total_sequence_length{example}"
    )


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
    mapped(
        NEMO,
        "policy.max_total_sequence_length",
        "policy.max_total_sequence_length",
        "same meaning when the longest prompt NeMo RL trains (data.max_input_seq_length - "
        "1 tokens) + policy.generation.max_new_tokens fit in it; else refused: NeMo RL's "
        "engine then ends each response at its context "
        "(vLLM's max_model_len, by default this length) less the prompt, a cap per prompt; "
        "ours has one response cap",
        _total_length,
    ),
    same(
        NEMO,
        "policy.generation.max_new_tokens",
        MAX_RESPONSE,
        "same meaning: the engine's response cap (prompt + response must fit in "
        "max_total_sequence_length, checked there)",
    ),
    same(NEMO, "policy.generation.temperature", "generation.temperature"),
    same(NEMO, "policy.generation.top_p", "generation.top_p"),
    mapped(NEMO, "policy.generation.top_k", "generation.top_k", "null: -1 (off)", sampling_top_k),
    same(NEMO, "policy.megatron_cfg.optimizer.lr", "policy.optimizer.lr"),
    same(NEMO, "policy.megatron_cfg.optimizer.min_lr", "policy.optimizer.min_lr"),
    same(NEMO, "policy.optimizer.kwargs.lr", "policy.optimizer.lr"),
    custom(
        NEMO,
        "policy.scheduler",
        "policy.scheduler.lr_warmup_steps (+ lr_warmup_init, lr_decay_style)",
        "LinearLR(start_factor, end_factor 1, total_iters) then ConstantLR(factor 1) from a "
        "milestone >= total_iters: lr_warmup_steps = total_iters, lr_warmup_init = "
        "start_factor x lr, constant after. NeMo RL steps it once per GRPO step: carried "
        "only when a GRPO step is one optimizer step (num_prompts_per_step x "
        "num_generations_per_prompt = train_global_batch_size); other schedules refused",
        _torch_schedule,
    ),
    custom(
        NEMO,
        f"{_SCHED}.lr_warmup_iters",
        "policy.scheduler.lr_warmup_steps",
        "NeMo RL steps Megatron's schedule once per GRPO step, ours once per optimizer "
        "step: the same count when a GRPO step is one optimizer step (num_prompts_per_step "
        "x num_generations_per_prompt = train_global_batch_size), else refused (NeMo RL "
        "keeps one lr over a step's optimizer steps)",
        _megatron_warmup,
    ),
    same(
        NEMO,
        f"{_SCHED}.lr_warmup_init",
        "policy.scheduler.lr_warmup_init",
        "same meaning: the lr the warm-up starts from",
    ),
    mapped(
        NEMO,
        f"{_SCHED}.lr_decay_style",
        "policy.scheduler.lr_decay_style",
        "constant only (a decay runs over GRPO steps there, optimizer steps here)",
        _megatron_decay_style,
    ),
    custom(
        NEMO,
        f"{_SCHED}.lr_decay_iters",
        "(none: not read with a constant lr)",
        "not read while `lr_decay_style` is constant; refused otherwise",
        _megatron_decay_iters,
    ),
    same(NEMO, "policy.optimizer.kwargs.weight_decay", "policy.optimizer.weight_decay"),
    same(NEMO, "policy.max_grad_norm", "policy.optimizer.clip_grad"),
    mapped(
        NEMO,
        "data.max_input_seq_length",
        "data.max_prompt_length",
        "converted to {v} - 1: NeMo RL keeps a prompt of {v} tokens or more in its data as a "
        "stub (each message cut to at most 4 tokens, loss_multiplier 0: generated from, never "
        "trained; processors.py), ours drops a prompt longer than {out} before training. The "
        "same prompts can be trained, but the number of prompts used can differ: a NeMo RL "
        "step spends slots of num_prompts_per_step on stubs, ours has that many trainable "
        "prompts, so steps cover the data at different rates",
        _prompt_limit,
    ),
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
) + NEMO_LAYOUT_KEYS


_ROLLOUT_MCORE = "policy.generation.mcore_generation_config."
_VLLM_CFG = "policy.generation.vllm_cfg."
NEMO_TIERS: dict[str, str] = {
    **NEMO_LAYOUT_TIERS,
    # Megatron's LR/weight-decay schedule: what is learned, though the path says megatron
    "policy.megatron_cfg.scheduler.": IMPACT_ALGORITHM,
    "grpo.val_start_at": IMPACT_HARMLESS,  # first validation step: measurement only
    "grpo.val_at_end": IMPACT_HARMLESS,  # one more validation at the end
    "grpo.max_val_samples": IMPACT_HARMLESS,  # how many validation prompts are scored
    "grpo.val_batch_size": IMPACT_HARMLESS,  # validation batching
    "policy.generation.port_range_low": IMPACT_HARMLESS,  # engine ports
    "policy.generation.port_range_high": IMPACT_HARMLESS,
    "cluster.master_port_range_low": IMPACT_HARMLESS,  # torch.distributed ports
    "cluster.master_port_range_high": IMPACT_HARMLESS,
    _VLLM_CFG + "use_tqdm": IMPACT_HARMLESS,  # progress bar
    _ROLLOUT_MCORE + "expose_http_server": IMPACT_HARMLESS,
    "cluster.segment_size": IMPACT_LAYOUT,  # node grouping for placement
    "data_plane.": IMPACT_LAYOUT,  # how batches move between workers
    _ROLLOUT_MCORE + "buffer_size_gb": IMPACT_LAYOUT,  # Megatron inference KV memory
    _ROLLOUT_MCORE + "block_size_tokens": IMPACT_LAYOUT,
    _ROLLOUT_MCORE + "kv_cache_management_mode": IMPACT_LAYOUT,
    _ROLLOUT_MCORE + "materialize_only_last_token_logits": IMPACT_LAYOUT,
    _ROLLOUT_MCORE + "max_tokens": IMPACT_LAYOUT,  # inference token budget per step
    _VLLM_CFG + "use_deep_gemm": IMPACT_LAYOUT,  # FP8 GEMM kernels
    _VLLM_CFG + "num_first_layers_in_bf16": IMPACT_LAYOUT,  # FP8 generation precision
    _VLLM_CFG + "num_last_layers_in_bf16": IMPACT_LAYOUT,
    _VLLM_CFG + "reset_encoder_cache_after_weight_update": IMPACT_LAYOUT,
    "policy.logprob_chunk_size": IMPACT_LAYOUT,  # chunked log-prob computation
    "policy.generation_batch_size": IMPACT_LAYOUT,  # HF-backend generation batching
    "policy.tokenizer.use_fastokens": IMPACT_LAYOUT,  # tokenizer implementation
    "policy.generation.refit_cfg.nixl.backend_name": IMPACT_LAYOUT,  # weight transport
}
"""NeMo RL keys (or subtrees ending in ".") classified by what the source does with them,
read before the patterns of dialects.impact."""


NEMO_DEFAULTS: dict[str, Any] = {
    # examples/configs/grpo_math_1B.yaml is the parent of its recipes and sets these itself;
    # nothing is added for a config read with its parent.
}
"""The value the source's code or base config gives a key that a config omits, for the
keys that change a run (an omitted key takes the source's default, never ours)."""


def inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Source keys that are not live there (key -> why): NeMo RL reads policy.megatron_cfg
    only with megatron_cfg.enabled true, and then neither dtensor_cfg nor policy.optimizer
    / policy.scheduler (the Megatron worker builds its optimizer from megatron_cfg). NeMo RL's reward_shaping.max_response_length is read only by the shaping (reward_functions.py)
    and caps nothing while grpo.reward_shaping.enabled is not true; ours is the engine's cap."""
    dead: dict[str, str] = layout_inactive(flat)
    shaping = "grpo.reward_shaping.max_response_length"
    if shaping in flat and flat.get("grpo.reward_shaping.enabled") is not True:
        dead[shaping] = "not live: grpo.reward_shaping.enabled is not true"
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
