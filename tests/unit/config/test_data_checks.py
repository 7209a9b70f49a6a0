"""Validation of data.prompt_template (config/data_checks.py through
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


def test_both_keys_load_when_valid() -> None:
    loaded = load_config(
        TINY,
        [
            *FILES,
            f"data.prompt_template={quoted(NEMO_COT_TEMPLATE)}",
        ],
    )
    data = loaded.config.data
    assert data.prompt_template == NEMO_COT_TEMPLATE
