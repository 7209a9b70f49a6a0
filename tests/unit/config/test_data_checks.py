"""Validation of data.prompt_template and data.val_fraction (config/data_checks.py through
config/validate.py): each refused value names the key, its value and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dapo_megatron.config import ConfigError, load_config
from dapo_megatron.data.prompt_template import NEMO_COT_TEMPLATE

TINY = Path(__file__).resolve().parents[3] / "recipes" / "dapo-tiny-cpu.yaml"
FILES = ("data.format=aime", "data.train_path=train.jsonl", "reward.verifier=math")


def quoted(template: str) -> str:
    """The template as a YAML scalar (command-line values are YAML: ``Q: {}`` is a mapping)."""
    return yaml.safe_dump(template, default_style='"', width=10_000).strip()


def error_of(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(TINY, overrides)
    return str(info.value)


@pytest.mark.parametrize(
    "template, expected",
    [
        ("Solve: no field", "(found: none)"),
        ("{} then {}", "(found: {}, {})"),
        ("Solve {problem}", "(found: {problem})"),
        ("Put it in \\boxed{} : {}", "(found: {}, {})"),
        ("open { {}", "is not a format string"),
    ],
)
def test_prompt_template_needs_exactly_one_field(template: str, expected: str) -> None:
    msg = error_of(f"data.prompt_template={quoted(template)}")
    assert f"data.prompt_template = {template!r} (set in command line)" in msg
    assert expected in msg and "{{" in msg  # the fix: double literal braces


def test_val_fraction_range_file_and_format() -> None:
    for value in ("0", "1", "1.5", "-0.1"):
        msg = error_of(*FILES, "data.val_path=null", f"data.val_fraction={value}")
        assert "data.val_fraction" in msg and "must be in (0, 1)" in msg
    msg = error_of(*FILES, "data.val_path=val.jsonl", "data.val_fraction=0.05")
    assert "data.val_fraction = 0.05" in msg and "set data.val_path: null" in msg
    msg = error_of("data.val_fraction=0.05")  # the tiny recipe's arithmetic task
    assert "generates its own validation problems" in msg


def test_both_keys_load_when_valid() -> None:
    loaded = load_config(
        TINY,
        [
            *FILES,
            "data.val_path=null",
            "data.val_fraction=0.05",
            f"data.prompt_template={quoted(NEMO_COT_TEMPLATE)}",
        ],
    )
    data = loaded.config.data
    assert data.val_fraction == 0.05 and data.prompt_template == NEMO_COT_TEMPLATE
