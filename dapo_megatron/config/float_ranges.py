"""The range of every float key of the schema: one generic rule, checked before any other.

YAML reads `.inf` and `.nan` as floats, and the per-key checks of validate.py compare with
`>` and `<=`: infinity passes `> 0`, and NaN fails every comparison with a message about the
wrong bound. Both then crash a run mid-way (`int(inf)` when a round is sized, a timeout of
`inf` handed to a collective), after the steps since the last checkpoint are lost. So every
float key has a declared range here, and `float_problems` refuses a value that is not finite
or lies outside it, naming the key, before workers start. A float key without an entry is an
error of this table (tests/unit/config/test_float_ranges.py walks the schema), so a new key cannot
skip the rule.

The ranges are what a value can mean, not what is sensible: the per-key checks in
validate.py add the cross-key constraints (min_lr <= lr, ...). The ``dapo.loss.*`` ranges
are the loss's own (algorithms/loss_spec.py ``LOSS_FLOAT_RANGES``), declared there once.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from dapo_megatron.algorithms.loss_spec import LOSS_FLOAT_RANGES
from dapo_megatron.shared.float_range import ANY, FRACTION, NON_NEGATIVE, FloatRange, positive

_MIN_CALL_TIMEOUT_S = 60.0
"""A worker call shorter than this cannot even start a worker (actor start, imports, model
build): a smaller run.call_timeout_s restarts the run at its first call, forever."""

FLOAT_RANGES: dict[str, FloatRange] = {
    "run.preemption_grace_s": FloatRange(1.0, math.inf),
    "run.collective_timeout_s": FloatRange(5.0, math.inf),
    "run.call_timeout_s": FloatRange(_MIN_CALL_TIMEOUT_S, math.inf),
    "policy.moe.aux_loss_coef": NON_NEGATIVE,
    "policy.optimizer.lr": positive(),
    "policy.optimizer.min_lr": NON_NEGATIVE,
    "policy.optimizer.weight_decay": NON_NEGATIVE,
    "policy.optimizer.adam_beta1": FloatRange(0.0, 1.0, high_open=True),
    "policy.optimizer.adam_beta2": FloatRange(0.0, 1.0, high_open=True),
    "policy.optimizer.adam_eps": positive(),
    "policy.optimizer.clip_grad": NON_NEGATIVE,
    "policy.scheduler.lr_warmup_init": NON_NEGATIVE,
    "generation.temperature": positive(),
    "generation.top_p": positive(1.0),
    "generation.refit_bucket_mb": positive(),
    "generation.engine.gpu_memory_utilization": positive(1.0),
    # The loss declares its own limits once (algorithms/loss_spec.py); taken as they are.
    **{f"dapo.loss.{name}": r for name, r in LOSS_FLOAT_RANGES.items()},
    "dapo.advantage.eps": NON_NEGATIVE,
    "dapo.dynamic_sampling.batch_multiplier": FloatRange(1.0, math.inf),
    "dapo.dynamic_sampling.max_batch_multiplier": FloatRange(1.0, math.inf),
    "dapo.dynamic_sampling.skip_predicted.target_zero_var_share": FRACTION,
    "dapo.dynamic_sampling.skip_predicted.min_generate_prob": FRACTION,
    "dapo.dynamic_sampling.skip_predicted.audit_fraction": FRACTION,
    "dapo.dynamic_sampling.skip_predicted.initial_strength": FRACTION,
    "dapo.dynamic_sampling.skip_predicted.adapt_rate": FRACTION,
    "dapo.overlong_buffer.penalty_factor": NON_NEGATIVE,
    "dapo.reward_scaling.source_min": ANY,
    "dapo.reward_scaling.source_max": ANY,
    "dapo.reward_scaling.target_min": ANY,
    "dapo.reward_scaling.target_max": ANY,
    "rollout.abort_tail_oversample": FloatRange(1.0, math.inf),
    "sft_warmup.lr": NON_NEGATIVE,
    "data.val_fraction": FloatRange(0.0, 1.0, low_open=True, high_open=True),
    "validation.temperature": positive(),
    "validation.top_p": positive(1.0),
    "reward.timeout_s": positive(),
}
"""Dotted key -> the range of its value (None, where the schema allows it, is not checked)."""


def float_keys(config_type: type, prefix: str = "") -> list[str]:
    """Dotted keys of every field of ``config_type`` (a schema dataclass, recursively) whose
    type admits a float (``float``, ``float | None``, ``float | Literal[...]``)."""
    keys: list[str] = []
    hints = typing.get_type_hints(config_type)
    for f in dataclasses.fields(config_type):
        hint = hints[f.name]
        key = prefix + f.name
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            keys += float_keys(hint, key + ".")
        elif hint is float or float in typing.get_args(hint):
            keys.append(key)
    return keys


def value_at(config: Any, key: str) -> Any:
    """The value of the dotted ``key`` in ``config`` (a schema dataclass)."""
    for part in key.split("."):
        config = getattr(config, part)
    return config


def float_problems(config: Any, sources: dict[str, str]) -> dict[str, str]:
    """Key -> message for every float key of ``config`` whose value is not finite or lies
    outside its FLOAT_RANGES entry (bools and the non-float alternatives of a union, such as
    ``batch_multiplier: auto``, are left to the per-key checks)."""
    problems: dict[str, str] = {}
    for key in float_keys(type(config)):
        value = value_at(config, key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        where = f"(set in {sources.get(key, 'configs')})"
        if not math.isfinite(value):
            problems[key] = f"{key} = {value!r} {where}: must be a finite number"
        elif key not in FLOAT_RANGES:
            problems[key] = f"{key}: no range declared in config/float_ranges.py FLOAT_RANGES"
        elif not FLOAT_RANGES[key].contains(value):
            problems[key] = f"{key} = {value!r} {where}: must be in {FLOAT_RANGES[key]}"
    return problems
