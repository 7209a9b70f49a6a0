"""Issue 30 case 6: what pre-flight finds in the model's weights before Ray starts
(planning/weight_shapes.py): a config.json that disagrees with the weights is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.data.tiny_model import create_tiny_model
from dapo_megatron.planning.preflight import check_model
from dapo_megatron.planning.weight_shapes import shape_problems

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def _config(*args: str) -> DapoMegatronConfig:
    return load_config(RECIPE, list(args)).config


# ---------------------------------------------------------------- case 6: weight shapes


def test_a_config_json_that_disagrees_with_the_weights_is_named(
    tiny_model: Path, tmp_path: Path
) -> None:
    model = shutil.copytree(tiny_model, tmp_path / "model")
    hf = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**hf, "hidden_size": 96}))
    (problem,) = check_model(_config(f"policy.model_name_or_path={model}").policy)
    assert problem == (
        f"policy.model_name_or_path: {model / 'model.safetensors'}: tensor "
        f"model.embed_tokens.weight has shape [64, 64], but {model / 'config.json'} implies "
        f"[64, 96] (hidden_size = 96); correct hidden_size in config.json, or use the "
        f"config.json saved with these weights"
    )
    # Another field: the MLP width, named by its own key.
    (model / "config.json").write_text(json.dumps({**hf, "intermediate_size": 256}))
    (problem,) = check_model(_config(f"policy.model_name_or_path={model}").policy)
    assert "tensor model.layers.0.mlp.gate_proj.weight has shape [128, 64]" in problem
    assert "implies [256, 64] (intermediate_size = 256); correct intermediate_size" in problem
    (model / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": 3}))
    (problem,) = check_model(_config(f"policy.model_name_or_path={model}").policy)
    assert "the weights hold 2 layers" in problem and "num_hidden_layers = 3" in problem


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> Path:
    """A real safetensors file of zeros with these tensor shapes (float32)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * int(torch.tensor(shape).prod().item()) if shape else 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))
    return path


def test_qwen3_moe_experts_router_and_qk_norms_are_compared(tmp_path: Path) -> None:
    hf = {
        "model_type": "qwen3_moe", "hidden_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 1,
        "intermediate_size": 64, "moe_intermediate_size": 24, "num_experts": 4,
        "num_experts_per_tok": 2, "vocab_size": 50, "max_position_embeddings": 128,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hf))
    good = {
        "model.embed_tokens.weight": [50, 32],
        "model.layers.0.self_attn.q_proj.weight": [64, 32],  # heads x head_dim
        "model.layers.0.self_attn.k_proj.weight": [32, 32],
        "model.layers.0.self_attn.q_norm.weight": [16],
        "model.layers.0.mlp.gate.weight": [4, 32],
        "model.layers.0.mlp.experts.0.gate_proj.weight": [24, 32],
        "model.layers.0.mlp.experts.3.down_proj.weight": [32, 24],
    }
    files = [_safetensors(tmp_path / "model.safetensors", good)]
    assert shape_problems(tmp_path, files, "policy.model_name_or_path") == []
    for name, shape, key in (
        ("model.layers.0.self_attn.q_norm.weight", [8], "head_dim"),
        ("model.layers.0.mlp.gate.weight", [8, 32], "num_experts"),
        ("model.layers.0.mlp.experts.3.down_proj.weight", [32, 48], "moe_intermediate_size"),
    ):
        files = [_safetensors(tmp_path / "model.safetensors", {**good, name: shape})]
        (problem,) = shape_problems(tmp_path, files, "policy.model_name_or_path")
        assert f"tensor {name} has shape {shape}" in problem and f"correct {key} " in problem
