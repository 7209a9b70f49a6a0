"""The policy loss's hyper-parameters as one frozen, validated value (torch-free).

``LossParams`` declares each hyper-parameter once; the config section ``dapo.loss``
(config/schema.py ``LossConfig``) and ``LossSpec`` extend it. ``LossSpec`` is built once per
run from ``dapo.loss`` (config/run_plan.py) and travels unchanged, as ``loss``, from the
policy step through the kernel dispatch (kernels/pg_loss.py) into
``algorithms.loss.torch_policy_loss``, which trust it. Its fields have no defaults: every default
lives in configs/dapo_base.yaml. The value sets (Literal types) are defined here once; the config
schema imports them, so a YAML value and a function argument can never disagree.

Torch-free on purpose: config validation imports this module and must stay fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args, get_origin, get_type_hints

from dapo_megatron.shared.float_range import NON_NEGATIVE, FloatRange, positive

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
KLEstimator = Literal["k1", "k2", "k3"]
RolloutCorrectionMode = Literal["none", "tis", "mis"]
RolloutCorrectionLevel = Literal["token", "sequence"]

LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
ROLLOUT_CORRECTION_MODES: tuple[str, ...] = get_args(RolloutCorrectionMode)
ROLLOUT_CORRECTION_LEVELS: tuple[str, ...] = get_args(RolloutCorrectionLevel)


Problem = tuple[str, object, str]
"""A broken limit: (the argument's name, its value, the constraint it breaks). Each limit of
the loss is written once: a float's as its range in ``LOSS_FLOAT_RANGES``, a choice's as the
Literal type of its ``LossParams`` field. The ``validate_*`` functions and ``LossSpec`` raise
on the first problem, config validation (config/validate.py) reports every one under its
``dapo.loss`` key."""

LOSS_FLOAT_RANGES: dict[str, FloatRange] = {
    # The ratio is clipped to [1 - low, 1 + high]: low >= 1 would let the lower clip reach 0.
    "clip_ratio_low": FloatRange(0.0, 1.0, high_open=True),
    "clip_ratio_high": NON_NEGATIVE,
    # Dual clip caps the loss of a negative advantage at c * |A|: only c > 1 lies beyond the
    # ordinary clip (c <= 1 would cut into the clipped region itself).
    "clip_ratio_c": FloatRange(1.0, math.inf, low_open=True),
    "kl_coef": NON_NEGATIVE,
    "kl_clamp": positive(),
    # The loss adds -entropy_coef * entropy only when entropy_coef > 0 (algorithms/kl.py
    # kl_entropy_terms), and the policy step asks for the entropy's gradient only then
    # (megatron/policy_step.py): a negative coefficient (an entropy penalty) would be
    # silently dropped, so it is refused rather than accepted and ignored.
    "entropy_coef": NON_NEGATIVE,
    # The TIS weight is truncated at tis_cap: 0 would zero every token's gradient.
    "tis_cap": positive(),
    # MIS keeps weights in [mis_low, mis_high]; the interval must hold 1, the weight of a
    # token on which rollout and training agree.
    "mis_low": FloatRange(0.0, 1.0, high_open=True),
    "mis_high": FloatRange(1.0, math.inf, low_open=True),
}
"""``LossParams`` float field -> the range of its value (None, where the field allows it, is
not checked). The one declaration of the loss's float limits: ``spec_problems`` checks
them and config/float_ranges.py ``FLOAT_RANGES`` takes them as its ``dapo.loss.*`` entries."""


def raise_first(problems: list[Problem]) -> None:
    """Raise ValueError ``"{name}={value!r} {constraint}"`` for the first problem, if any."""
    if problems:
        name, value, constraint = problems[0]
        raise ValueError(f"{name}={value!r} {constraint}")


def choice_problems(name: str, value: str, choices: tuple[str, ...]) -> list[Problem]:
    """``value`` is one of ``choices``."""
    return [] if value in choices else [(name, value, f"is not one of {choices}")]


def range_problems(name: str, value: object) -> list[Problem]:
    """``value`` is a finite number in ``LOSS_FLOAT_RANGES[name]``."""
    r = LOSS_FLOAT_RANGES[name]
    return [] if r.admits(value) else [(name, value, f"must be a finite number in {r}")]


def correction_cap_problems(tis_cap: float, mis_low: float, mis_high: float) -> list[Problem]:
    """The rollout-correction caps are in their ranges.

    Checked whatever the mode, so a misconfiguration surfaces at start-up and not only once
    someone switches the mode on."""
    return [
        *range_problems("tis_cap", tis_cap),
        *range_problems("mis_low", mis_low),
        *range_problems("mis_high", mis_high),
    ]


def scale_length_problems(length: int) -> list[Problem]:
    """The constant length of seq-mean-token-sum-norm is an int >= 1."""
    # bool is an int subclass: True would silently mean a length of 1.
    if isinstance(length, int) and not isinstance(length, bool) and length >= 1:
        return []
    return [("loss_scale_length", length, "must be an int >= 1")]


def field_problems(name: str, value: object) -> list[Problem]:
    """The limits of the ``LossParams`` field ``name`` that ``value`` breaks: its range for a
    float, its Literal's values for a choice; None passes where the field allows it."""
    hint = _PARAM_HINTS[name]
    if value is None and type(None) in get_args(hint):
        return []
    if get_origin(hint) is Literal:
        return choice_problems(name, value, get_args(hint))  # type: ignore[arg-type]
    return range_problems(name, value)


def spec_problems(params: LossParams, loss_scale_length: int) -> list[Problem]:
    """Every limit that ``params`` and the resolved ``loss_scale_length`` break, in field
    order ([] = valid). The one validation entry point of the loss's hyper-parameters:
    ``LossSpec`` runs it on construction, config validation (config/validate.py) once per
    configuration, reporting each problem under its ``dapo.loss`` key. Walks the fields of
    ``LossParams``, so a new field is checked by declaring its type (and, for a float, its
    range in ``LOSS_FLOAT_RANGES``), with no edit here."""
    problems = [
        p for f in fields(LossParams) for p in field_problems(f.name, getattr(params, f.name))
    ]
    return [*problems, *scale_length_problems(loss_scale_length)]


def validate_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError (naming ``name``) unless ``value`` is one of ``choices``."""
    raise_first(choice_problems(name, value, choices))


def validate_agg_mode(loss_agg_mode: str) -> None:
    """Raise ValueError unless ``loss_agg_mode`` is one of ``LOSS_AGG_MODES``."""
    validate_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)


def validate_rollout_correction_args(
    mode: str, level: str, tis_cap: float, mis_low: float, mis_high: float
) -> None:
    """Raise ValueError (naming the argument, its value and the constraint) on a bad setting."""
    validate_choice("mode", mode, ROLLOUT_CORRECTION_MODES)
    validate_choice("level", level, ROLLOUT_CORRECTION_LEVELS)
    raise_first(correction_cap_problems(tis_cap, mis_low, mis_high))


def validate_range(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a finite number in ``LOSS_FLOAT_RANGES[name]``."""
    raise_first(range_problems(name, value))


@dataclass(frozen=True)
class LossParams:
    """The hyper-parameters of the DAPO policy loss that travel unchanged from ``dapo.loss`` to
    the loss, each declared once, here: the config section (config/schema.py ``LossConfig``)
    and the run's ``LossSpec`` both extend this class and add only ``loss_scale_length``, the
    one field whose config value (null allowed) is resolved before the loss reads it. A new
    hyper-parameter is a field here and its default in configs/dapo_base.yaml."""

    clip_ratio_low: float
    """eps_low: the ratio is clipped below at 1 - clip_ratio_low (DAPO: 0.2)."""
    clip_ratio_high: float
    """Ratio clipped above at 1 + clip_ratio_high (DAPO clip-higher: 0.28)."""
    clip_ratio_c: float | None
    """Dual-clip bound c > 1 for negative advantages; null: no dual clip."""
    loss_agg_mode: LossAggMode
    """Loss aggregation: token-mean (DAPO) or seq-mean-token-{sum,mean,sum-norm}.

    token-mean is DAPO's token-level loss; the sequence-mean variants are
    ``algorithms.loss.aggregate_terms``'s. The normaliser is global over the mini-batch, so
    micro-batching never changes the loss."""
    kl_coef: float
    """KL penalty coefficient against the reference policy (DAPO: 0, none).

    > 0: the reference is the policy at the start of DAPO training (after the SFT warm-up),
    kept frozen on every policy rank (one extra copy of the rank's weights) and saved in
    the checkpoints, so a resumed run keeps it."""
    kl_estimator: KLEstimator
    """KL estimator (k1, k2 or k3) used when kl_coef > 0."""
    kl_clamp: float | None
    """Clamp of the per-token KL estimate to [-c, c]; null: none.

    Applied to the estimate before it is weighted by kl_coef, with no gradient beyond the
    bound: NeMo RL's kl_output_clamp_value (nemo_rl/algorithms/utils.py calculate_kl)."""
    entropy_coef: float
    """Entropy bonus coefficient (0 = off)."""
    rollout_correction: RolloutCorrectionMode
    """Rollout/train mismatch: none, tis (truncated) or mis (masked) weights."""
    rollout_correction_level: RolloutCorrectionLevel
    """Whether the correction weight is per token or per sequence."""
    tis_cap: float
    """Upper truncation of the TIS weight exp(old_logprob - rollout_logprob)."""
    mis_low: float
    """MIS: tokens (sequences) with a weight below this are masked out."""
    mis_high: float
    """MIS: tokens (sequences) with a weight above this are masked out."""


_PARAM_HINTS: dict[str, Any] = get_type_hints(LossParams)
"""``LossParams`` field -> its resolved type (``from __future__ import annotations`` leaves
strings): what ``field_problems`` reads a field's kind of limit from."""


def param_values(params: LossParams) -> dict[str, Any]:
    """``params``'s ``LossParams`` fields by name (a subclass's own fields left out)."""
    return {f.name: getattr(params, f.name) for f in fields(LossParams)}


@dataclass(frozen=True)
class LossSpec(LossParams):
    """The run's loss hyper-parameters, resolved and validated on construction.

    Built once per run (config/run_plan.py ``build_loss_spec``); the code that takes a
    ``LossSpec`` trusts it and validates nothing again."""

    loss_scale_length: int
    """Constant length of seq-mean-token-sum-norm (resolved: never None here)."""

    def __post_init__(self) -> None:
        # The limits are written once, in spec_problems (validation maps each to its key).
        raise_first(spec_problems(self, self.loss_scale_length))

    @classmethod
    def resolve(cls, params: LossParams, loss_scale_length: int) -> LossSpec:
        """The spec of ``params`` (a ``LossConfig``, say) with ``loss_scale_length``
        resolved; raises ValueError on a broken limit."""
        return cls(**param_values(params), loss_scale_length=loss_scale_length)
