"""Tests of dapo_megatron.algorithms.loss_spec: LossSpec validation, immutability, how
config/run_plan.py builds it from a recipe, and the value sets shared with the schema."""

from __future__ import annotations

import ast
import dataclasses
import math
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from dapo_megatron.algorithms.loss_spec import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    LOSS_FLOAT_RANGES,
    ROLLOUT_CORRECTION_LEVELS,
    ROLLOUT_CORRECTION_MODES,
    KLEstimator,
    LossAggMode,
    LossParams,
    LossSpec,
    Problem,
    RolloutCorrectionLevel,
    RolloutCorrectionMode,
    field_problems,
    param_values,
    spec_problems,
)
from dapo_megatron.config import schema, validate
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.float_ranges import FLOAT_RANGES, float_keys
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.run_plan import build_loss_spec, shipped_loss_spec
from dapo_megatron.shared.float_range import FloatRange

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"

# Valid settings that differ from the shipped defaults where they can, so that a field read
# from the wrong place shows up.
BASE = shipped_loss_spec(
    8,
    clip_ratio_low=0.1,
    clip_ratio_high=0.3,
    clip_ratio_c=3.0,
    loss_agg_mode="seq-mean-token-sum-norm",
    rollout_correction="tis",
    rollout_correction_level="sequence",
    tis_cap=1.5,
    mis_low=0.25,
    mis_high=4.0,
    kl_coef=0.05,
    kl_estimator="k2",
    entropy_coef=0.01,
)


def spec(**changes: Any) -> LossSpec:
    """BASE with ``changes`` (validated again by LossSpec)."""
    return dataclasses.replace(BASE, **changes)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

BAD_VALUES = [
    ("clip_ratio_low", 1.0, "must be a finite number in [0, 1)"),
    ("clip_ratio_low", -0.1, "must be a finite number in [0, 1)"),
    ("clip_ratio_low", math.nan, "must be a finite number in [0, 1)"),
    ("clip_ratio_high", -0.1, "must be a finite number in [0, inf)"),
    ("clip_ratio_high", math.inf, "must be a finite number in [0, inf)"),
    ("clip_ratio_c", 1.0, "must be a finite number in (1, inf)"),
    ("clip_ratio_c", math.inf, "must be a finite number in (1, inf)"),
    ("loss_agg_mode", "mean", "is not one of"),
    ("loss_scale_length", 0, "must be an int >= 1"),
    ("loss_scale_length", None, "must be an int >= 1"),
    ("loss_scale_length", 2.5, "must be an int >= 1"),
    ("loss_scale_length", True, "must be an int >= 1"),
    ("rollout_correction", "is", "is not one of"),
    ("rollout_correction_level", "batch", "is not one of"),
    ("tis_cap", 0.0, "must be a finite number in (0, inf)"),
    ("tis_cap", math.inf, "must be a finite number in (0, inf)"),
    ("mis_low", 1.0, "must be a finite number in [0, 1)"),
    ("mis_low", -0.5, "must be a finite number in [0, 1)"),
    ("mis_high", 1.0, "must be a finite number in (1, inf)"),
    ("kl_coef", -0.1, "must be a finite number in [0, inf)"),
    ("kl_coef", math.nan, "must be a finite number in [0, inf)"),
    ("kl_estimator", "k4", "is not one of"),
    ("kl_clamp", 0.0, "must be a finite number in (0, inf)"),
    ("kl_clamp", math.inf, "must be a finite number in (0, inf)"),
    ("entropy_coef", math.inf, "must be a finite number in [0, inf)"),
    ("entropy_coef", True, "must be a finite number in [0, inf)"),
    ("entropy_coef", -0.01, "must be a finite number in [0, inf)"),
]


@pytest.mark.parametrize(("field", "value", "constraint"), BAD_VALUES)
def test_each_bad_field_is_rejected_by_name(field: str, value: object, constraint: str) -> None:
    with pytest.raises(ValueError) as info:
        spec(**{field: value})
    message = str(info.value)
    # The message starts with the field's own name (not "mode=" or "level=") and its value.
    assert message.startswith(f"{field}={value!r} "), message
    assert constraint in message


def test_every_field_has_a_bad_value_case() -> None:
    fields = {f.name for f in dataclasses.fields(LossSpec)}
    assert {field for field, _, _ in BAD_VALUES} == fields
    assert len(fields) == 14


@pytest.mark.parametrize(
    "changes",
    [
        # The edges of each interval are accepted: the checks are not stricter than stated.
        {"clip_ratio_low": 0.0, "clip_ratio_high": 0.0},
        {"clip_ratio_c": None},
        {"clip_ratio_c": 1.0001},
        {"loss_scale_length": 1},
        {"mis_low": 0.0},
        {"kl_coef": 0.0, "entropy_coef": 0.0},
        {"kl_coef": 1, "loss_agg_mode": "token-mean", "rollout_correction": "none"},
    ],
)
def test_boundary_values_are_accepted(changes: dict[str, object]) -> None:
    built = spec(**changes)
    for field, value in changes.items():
        assert getattr(built, field) == value


def test_spec_is_frozen() -> None:
    s = spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.kl_coef = 0.5  # type: ignore[misc]
    assert s.kl_coef == 0.05
    assert hash(s) == hash(spec())  # frozen and eq: usable as a key, equal specs hash alike


# --------------------------------------------------------------------------------------------
# Built from a config
# --------------------------------------------------------------------------------------------


def test_build_loss_spec_from_the_tiny_recipe() -> None:
    loaded = load_config(TINY)
    # configs/dapo_base.yaml's dapo.loss (the recipe changes none of it); loss_scale_length is
    # null there and resolves to the recipe's generation.max_response_length, 16.
    built = build_loss_spec(loaded.config)
    assert built == shipped_loss_spec(16)
    assert (built.clip_ratio_low, built.clip_ratio_high, built.clip_ratio_c) == (0.2, 0.28, None)
    assert (built.loss_agg_mode, built.rollout_correction, built.kl_coef) == (
        "token-mean",
        "none",
        0,
    )


def test_loss_scale_length_null_resolves_to_max_response_length() -> None:
    resized = load_config(TINY, ["generation.max_response_length=12"])
    assert resized.config.dapo.loss.loss_scale_length is None
    assert build_loss_spec(resized.config).loss_scale_length == 12
    # An explicit value is kept, whatever the response length.
    explicit = load_config(TINY, ["dapo.loss.loss_scale_length=7"])
    assert build_loss_spec(explicit.config).loss_scale_length == 7


def test_overrides_reach_the_spec() -> None:
    overrides = [
        "dapo.loss.clip_ratio_c=3.0",
        "dapo.loss.kl_estimator=k1",
        "dapo.loss.rollout_correction=mis",
        "dapo.loss.rollout_correction_level=sequence",
        "dapo.loss.mis_low=0.3",
    ]
    built = build_loss_spec(load_config(TINY, overrides).config)
    assert (built.clip_ratio_c, built.kl_estimator) == (3.0, "k1")
    assert (built.rollout_correction, built.rollout_correction_level) == ("mis", "sequence")
    assert (built.mis_low, built.mis_high) == (0.3, 2.0)


# --------------------------------------------------------------------------------------------
# One definition of each value set
# --------------------------------------------------------------------------------------------


def test_value_tuples() -> None:
    assert LOSS_AGG_MODES == (
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    )
    assert KL_ESTIMATORS == ("k1", "k2", "k3")
    assert ROLLOUT_CORRECTION_MODES == ("none", "tis", "mis")
    assert ROLLOUT_CORRECTION_LEVELS == ("token", "sequence")


@pytest.mark.parametrize(
    ("field", "alias", "values"),
    [
        ("loss_agg_mode", LossAggMode, LOSS_AGG_MODES),
        ("kl_estimator", KLEstimator, KL_ESTIMATORS),
        ("rollout_correction", RolloutCorrectionMode, ROLLOUT_CORRECTION_MODES),
        ("rollout_correction_level", RolloutCorrectionLevel, ROLLOUT_CORRECTION_LEVELS),
    ],
)
def test_schema_uses_the_same_aliases(field: str, alias: object, values: tuple[str, ...]) -> None:
    schema_type = typing.get_type_hints(schema.LossConfig)[field]
    assert schema_type is alias  # imported, not redefined
    assert typing.get_args(schema_type) == values
    assert typing.get_type_hints(LossSpec)[field] is alias


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("loss_agg_mode", "mean"),
        ("kl_estimator", "k4"),
        ("rollout_correction", "is"),
        ("rollout_correction_level", "batch"),
    ],
)
def test_the_loader_rejects_values_outside_the_sets(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"dapo.loss.{key}"):
        load_config(TINY, [f"dapo.loss.{key}={value}"], validate=False)


def test_loss_spec_and_schema_do_not_import_torch() -> None:
    # Config loading (the CLI, the controller) imports them and must stay fast.
    code = (
        "import sys, dapo_megatron.algorithms.loss_spec, dapo_megatron.config.schema; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------
# Declared once, validated once
# --------------------------------------------------------------------------------------------


def test_config_and_spec_share_one_declaration() -> None:
    # dapo.loss and LossSpec extend LossParams: each hyper-parameter is declared there once,
    # and only loss_scale_length (null in the config, resolved in the spec) is their own.
    assert issubclass(schema.LossConfig, LossParams) and issubclass(LossSpec, LossParams)
    shared = [f.name for f in dataclasses.fields(LossParams)]
    assert [f.name for f in dataclasses.fields(schema.LossConfig)] == [*shared, "loss_scale_length"]
    assert [f.name for f in dataclasses.fields(LossSpec)] == [*shared, "loss_scale_length"]
    for cls in (schema.LossConfig, LossSpec):
        assert set(vars(cls).get("__annotations__", {})) == {"loss_scale_length"}


def test_a_bad_loss_value_is_refused_once_at_configuration_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[object] = []

    def counting(params: LossParams, length: int) -> list[Problem]:
        calls.append(params)
        return spec_problems(params, length)

    monkeypatch.setattr(validate, "spec_problems", counting)
    with pytest.raises(ConfigError, match=r"dapo\.loss\.clip_ratio_high"):
        load_config(TINY, ["dapo.loss.clip_ratio_high=-1"])
    # A limit only spec_problems knows (an int key: the float ranges skip it) is reported
    # under its key, from one call.
    calls.clear()
    with pytest.raises(ConfigError, match=r"dapo\.loss\.loss_scale_length.*must be an int >= 1"):
        load_config(TINY, ["dapo.loss.loss_scale_length=0"])
    assert len(calls) == 1
    calls.clear()
    load_config(TINY)
    assert len(calls) == 1


def _probes(r: FloatRange) -> list[float]:
    """Values at, just inside and just outside each finite bound of ``r``, plus the
    non-finite values and a spread of ordinary ones."""
    values = [math.nan, math.inf, -math.inf, -1.0, 0.0, 0.5, 1.0, 2.0, 1e9, -1e9]
    for bound in (r.low, r.high):
        if math.isfinite(bound):
            values += [bound, math.nextafter(bound, -math.inf), math.nextafter(bound, math.inf)]
    return values


@pytest.mark.parametrize("name", float_keys(schema.LossConfig))
def test_loss_limits_and_the_float_ranges_accept_the_same_values(name: str) -> None:
    # The generic float rule (config/float_ranges.py) and the loss's own limits
    # (spec_problems) must agree on every float key of dapo.loss: a value one accepts and
    # the other refuses is a limit declared twice that has drifted.
    key = f"dapo.loss.{name}"
    params = LossParams(**param_values(BASE))
    for value in _probes(FLOAT_RANGES[key]):
        in_range = math.isfinite(value) and FLOAT_RANGES[key].contains(value)
        problems = spec_problems(dataclasses.replace(params, **{name: value}), 8)
        accepted = not [p for p in problems if p[0] == name]
        assert accepted == in_range, f"{key}={value!r}: float range {in_range}, loss {accepted}"


PARAM_NAMES = frozenset(f.name for f in dataclasses.fields(LossParams))


def _full_lists(path: Path) -> list[int]:
    """Lines of ``path`` where one call's keywords or one dict literal's keys name every
    ``LossParams`` field: a hand-written list that a new field would have to join."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Call):
            names = {k.arg for k in node.keywords}
        elif isinstance(node, ast.Dict):
            names = {k.value for k in node.keys if isinstance(k, ast.Constant)}
        else:
            continue
        if names >= PARAM_NAMES:
            lines.append(node.lineno)
    return lines


def test_no_code_spells_out_every_loss_field() -> None:
    # The fields are listed once, by LossParams; building a spec (LossSpec.resolve,
    # shipped_loss_spec), validating it (spec_problems) and copying it (param_values) walk
    # dataclasses.fields, so a new hyper-parameter is a field, its range (a float) and its
    # default in configs/dapo_base.yaml, with no list elsewhere to extend.
    roots = [REPO / "dapo_megatron", REPO / "bench", REPO / "tests"]
    found = {
        str(path.relative_to(REPO)): lines
        for root in roots
        for path in sorted(root.rglob("*.py"))
        if (lines := _full_lists(path))
    }
    assert found == {}


def test_every_field_is_checked_and_built_from_its_declaration() -> None:
    hints = typing.get_type_hints(LossParams)
    for name in PARAM_NAMES:
        choices = typing.get_args(hints[name]) if typing.get_origin(hints[name]) is Literal else ()
        # A field is a choice (its Literal's values) or a float with a declared range.
        assert bool(choices) != (name in LOSS_FLOAT_RANGES), name
        bad: object = "not-a-choice" if choices else math.nan
        assert [p[0] for p in field_problems(name, bad)] == [name]
    # Every field comes from the shipped defaults, and copies generically.
    shipped = shipped_loss_spec(5)
    assert set(param_values(shipped)) == PARAM_NAMES
    assert LossSpec.resolve(shipped, 5) == shipped
