"""NeMo RL's learning-rate schedule and optimizer keys: the torch schedulers of
policy.scheduler (DTensor), Megatron's policy.megatron_cfg.scheduler.* and .optimizer.*
hyperparameters, and the converters they need; nemo_keys.py joins them to NeMo RL's table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from dapo_megatron.migrate.dialects import (
    IMPACT_ALGORITHM,
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    as_int,
    custom,
    mapped,
    off,
    same,
    warmup_in_optimizer_steps,
)
from dapo_megatron.migrate.shared_keys import NEMO

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
# Weight decay. Megatron Core's OptimizerParamScheduler (optimizer_param_scheduler.py
# get_wd, step) writes `weight_decay = get_wd() x wd_mult` into every parameter group at each
# scheduler step, its construction included; get_wd returns end_weight_decay for the
# constant style (asserting start == end) and ramps start -> end otherwise. Megatron Bridge
# builds that scheduler from policy.megatron_cfg.scheduler (NeMo RL models/megatron/setup.py
# `SchedulerConfig(**config["megatron_cfg"]["scheduler"])`), so when it sets the two, the
# weight decay trained with is end_weight_decay, not optimizer.weight_decay.

_WD_START = f"{_SCHED}.start_weight_decay"
_WD_END = f"{_SCHED}.end_weight_decay"
_WD_STYLE = f"{_SCHED}.weight_decay_incr_style"


def _held_weight_decay(ctx: Mapping[str, Any]) -> bool:
    """Megatron's weight decay stays at end_weight_decay over the run."""
    start, end = ctx.get(_WD_START), ctx.get(_WD_END)
    return ctx.get(_WD_STYLE, "constant") == "constant" or start is None or start == end


def _end_weight_decay(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if not _held_weight_decay(ctx):
        raise Untranslatable(
            f"needs a weight-decay schedule ({ctx.get(_WD_START)} -> {value}, "
            f"{ctx.get(_WD_STYLE)}), which dapo-megatron lacks (here: one weight decay)"
        )
    return Translation(
        (("policy.optimizer.weight_decay", value),),
        "the weight decay trained with: Megatron's scheduler sets every parameter group's "
        "weight decay to end_weight_decay at each step (constant style), overriding "
        "megatron_cfg.optimizer.weight_decay",
    )


def weight_decay_overridden(flat: Mapping[str, Any]) -> bool:
    """megatron_cfg.optimizer.weight_decay is replaced by the scheduler's end_weight_decay."""
    return isinstance(flat.get(_WD_END), int | float) and not isinstance(flat.get(_WD_END), bool)


_OPT = "policy.megatron_cfg.optimizer"
_TORCH_OPT = "policy.optimizer"


def _betas(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if not (isinstance(value, list | tuple) and len(value) == 2 and all(map(_is_number, value))):
        raise Untranslatable(f"{value!r}: expected [beta1, beta2]")
    return Translation(
        (("policy.optimizer.adam_beta1", value[0]), ("policy.optimizer.adam_beta2", value[1])),
        "same meaning: Adam's betas",
    )


def _is_bf16(value: Any, ctx: Mapping[str, Any]) -> bool:
    return value is (ctx.get("policy.precision") == "bfloat16")


def _is_fp16(value: Any, ctx: Mapping[str, Any]) -> bool:
    return value is (ctx.get("policy.precision") == "float16")


NEMO_SCHEDULE_KEYS: tuple[ForeignKey, ...] = (
    same(NEMO, f"{_OPT}.lr", "policy.optimizer.lr"),
    same(NEMO, f"{_OPT}.min_lr", "policy.optimizer.min_lr"),
    same(NEMO, f"{_OPT}.weight_decay", "policy.optimizer.weight_decay"),
    same(NEMO, f"{_OPT}.clip_grad", "policy.optimizer.clip_grad"),
    same(NEMO, f"{_OPT}.adam_beta1", "policy.optimizer.adam_beta1"),
    same(NEMO, f"{_OPT}.adam_beta2", "policy.optimizer.adam_beta2"),
    same(NEMO, f"{_OPT}.adam_eps", "policy.optimizer.adam_eps"),
    mapped(
        NEMO,
        f"{_OPT}.optimizer",
        "policy.optimizer.name",
        "same optimizers: Megatron's adam (decoupled weight decay) or sgd",
        lambda v, ctx: {"adam": "adam", "sgd": "sgd"}[v] if v in ("adam", "sgd") else _no(v),
    ),
    as_here(
        NEMO,
        f"{_OPT}.sgd_momentum",
        "SGD with momentum",
        lambda v, ctx: ctx.get(f"{_OPT}.optimizer") != "sgd" or v == 0,
        "read only by the sgd optimizer; adam is used",
    ),
    same(
        NEMO,
        f"{_OPT}.use_distributed_optimizer",
        "policy.megatron.use_distributed_optimizer",
        "same meaning: optimizer states sharded over data-parallel ranks",
    ),
    as_here(
        NEMO,
        f"{_OPT}.bf16",
        "an optimizer precision other than the policy's",
        _is_bf16,
        "the optimizer follows policy.precision (bf16 with fp32 master weights)",
    ),
    as_here(
        NEMO,
        f"{_OPT}.fp16",
        "an optimizer precision other than the policy's",
        _is_fp16,
        "the optimizer follows policy.precision",
    ),
    as_here(
        NEMO,
        f"{_OPT}.params_dtype",
        "master weights in a dtype other than fp32",
        off("float32"),
        "fp32 master weights",
    ),
    as_here(
        NEMO,
        f"{_OPT}.use_precision_aware_optimizer",
        "reduced-precision optimizer states",
        lambda v, ctx: isinstance(v, bool),
        "fp32 Adam states and master weights (Megatron's precision-aware optimizer keeps "
        "them fp32 by default: its exp_avg/main-param dtypes are not set by NeMo RL)",
    ),
    as_here(NEMO, f"{_OPT}.optimizer_cpu_offload", "optimizer CPU offload", off(False), "on GPU"),
    as_here(
        NEMO, f"{_OPT}.optimizer_offload_fraction", "optimizer CPU offload", off(0.0, 0), "on GPU"
    ),
    as_here(
        NEMO,
        f"{_OPT}.overlap_cpu_optimizer_d2h_h2d",
        "optimizer CPU offload",
        lambda v, ctx: v is False or ctx.get(f"{_OPT}.optimizer_cpu_offload") is False,
        "no offload to overlap",
    ),
    custom(
        NEMO,
        _WD_END,
        "policy.optimizer.weight_decay",
        "the weight decay trained with (Megatron's scheduler overrides the optimizer's); a "
        "weight-decay ramp (start != end, not constant) refused",
        _end_weight_decay,
    ),
    as_here(
        NEMO,
        _WD_START,
        "a weight-decay schedule",
        lambda v, ctx: v is None or v == ctx.get(_WD_END),
        "one weight decay over the run",
    ),
    as_here(
        NEMO,
        _WD_STYLE,
        "a weight-decay schedule",
        lambda v, ctx: v == "constant" or ctx.get(_WD_START) == ctx.get(_WD_END),
        "one weight decay over the run",
    ),
    same(NEMO, f"{_TORCH_OPT}.kwargs.lr", "policy.optimizer.lr"),
    same(NEMO, f"{_TORCH_OPT}.kwargs.weight_decay", "policy.optimizer.weight_decay"),
    custom(
        NEMO,
        f"{_TORCH_OPT}.kwargs.betas",
        "policy.optimizer.adam_beta1 (+ adam_beta2)",
        "same meaning",
        _betas,
    ),
    same(NEMO, f"{_TORCH_OPT}.kwargs.eps", "policy.optimizer.adam_eps"),
    as_here(
        NEMO,
        f"{_TORCH_OPT}.name",
        "an optimizer other than AdamW",
        off("torch.optim.AdamW"),
        "AdamW (decoupled weight decay)",
    ),
    as_here(
        NEMO,
        f"{_TORCH_OPT}.kwargs.foreach",
        "nothing: any value gives the same run",
        lambda v, ctx: isinstance(v, bool),
        "an implementation choice of torch's AdamW: same update",
    ),
    as_here(
        NEMO,
        f"{_TORCH_OPT}.kwargs.fused",
        "nothing: any value gives the same run",
        lambda v, ctx: isinstance(v, bool),
        "an implementation choice of torch's AdamW: same update",
    ),
    same(NEMO, "policy.max_grad_norm", "policy.optimizer.clip_grad"),
    custom(
        NEMO,
        "policy.scheduler",
        "policy.scheduler.lr_warmup_steps (+ lr_warmup_init, lr_decay_style)",
        "LinearLR(start_factor, end_factor 1, total_iters) then ConstantLR(factor 1) from a "
        "milestone >= total_iters: lr_warmup_steps = total_iters, lr_warmup_init = "
        "start_factor x lr, constant after; counted in GRPO steps as NeMo RL steps it "
        "(policy.scheduler.unit train_step); other schedules refused",
        _torch_schedule,
    ),
    custom(
        NEMO,
        f"{_SCHED}.lr_warmup_iters",
        "policy.scheduler.lr_warmup_steps",
        "the same count: NeMo RL steps Megatron's schedule once per GRPO step, as ours with "
        "policy.scheduler.unit train_step",
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
)
"""NeMo RL's optimizer and learning-rate schedule keys (Megatron's and torch's)."""

NEMO_SCHEDULE_TIERS: dict[str, str] = {
    # Megatron's LR/weight-decay schedule: what is learned, though the path says megatron
    f"{_SCHED}.": IMPACT_ALGORITHM,
    f"{_OPT}.": IMPACT_ALGORITHM,
}


def _no(value: Any) -> Any:
    raise Untranslatable(f"needs the {value!r} optimizer, which dapo-megatron lacks")
