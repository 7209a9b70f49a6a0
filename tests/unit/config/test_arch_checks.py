"""A model config that contradicts itself is refused before workers start, naming the file
and the config.json key (config/arch_checks.py), instead of a RuntimeError on a rank."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dapo_megatron.config.arch_checks import arch_problems
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.model_arch import PRESETS, hf_config

REPO = Path(__file__).resolve().parents[3]
MOE_RECIPE = REPO / "recipes" / "dapo-tiny-moe-cpu.yaml"


def test_every_preset_is_consistent() -> None:
    assert {name: arch_problems(arch) for name, arch in PRESETS.items() if arch_problems(arch)} == {}


def test_each_rule_names_its_key() -> None:
    dense = PRESETS["qwen2.5-0.5b"]  # 896 hidden, 14 heads, 2 kv heads, no explicit head_dim
    moe = PRESETS["tiny-qwen3-moe"]  # 4 experts, top-2
    cases = {
        "num_key_value_heads = 4 must divide num_attention_heads = 14": dataclasses.replace(
            dense, num_query_groups=4
        ),
        "num_attention_heads = 12 must divide hidden_size = 896": dataclasses.replace(
            dense, num_attention_heads=12, num_query_groups=2
        ),
        "head_dim = 33: must be even": dataclasses.replace(moe, explicit_head_dim=33),
        "num_experts_per_tok = 6 must be in [1, num_experts = 4]": dataclasses.replace(
            moe, moe=dataclasses.replace(moe.moe, experts_per_token=6)
        ),
        "num_key_value_heads = 0: must be >= 1": dataclasses.replace(dense, num_query_groups=0),
        "rms_norm_eps = 0.0: must be > 0": dataclasses.replace(dense, norm_epsilon=0.0),
    }
    for expected, arch in cases.items():
        problems = arch_problems(arch)
        assert any(expected in p for p in problems), (expected, problems)
    # Qwen3's explicit head_dim: 16 heads x 128 is not the hidden size 1024, and that is fine.
    assert arch_problems(PRESETS["qwen3-0.6b"]) == []


def test_a_moe_config_json_with_top_k_above_its_experts_fails_validation(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = hf_config(PRESETS["tiny-qwen3-moe"]).to_dict()
    config["num_experts_per_tok"] = 6
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as e:
        load_config(MOE_RECIPE, [f"policy.model_name_or_path={model}"])
    message = str(e.value)
    assert str(model / "config.json") in message
    assert "num_experts_per_tok = 6 must be in [1, num_experts = 4]" in message
