"""Pre-flight: the weights' shapes against what config.json says the model is.

A config.json whose ``hidden_size`` (or any shape field) disagrees with the weights builds
a model of one shape and loads tensors of another: the run used to fail after the workers
started with ``Sizes of tensors must match ... 64 ... 96``, naming no file, tensor or key.
The safetensors headers hold every tensor's shape, so the shapes the ModelArch of
config.json implies are compared before anything starts, reading headers only (an 8-byte
length and a JSON header per file; no tensor is read).

Compared: the embedding and output layer, the final norm, and the tensors of the first and
last layer (attention q/k/v/o with biases, Qwen3's q_norm/k_norm, both norms, the SwiGLU
MLP or, for Qwen3-MoE, the router and the first and last expert), plus the layer count. A
tensor the files do not hold is not reported here (the loader names missing tensors).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.model_arch import ModelArch, arch_from_hf_config

Dim = tuple[int, str]
"""One expected dimension: its size and the config.json key(s) it comes from."""


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (call after ``safetensors_problem`` is None)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(n))
    return header


def expected_shapes(arch: ModelArch) -> dict[str, list[Dim]]:
    """HF tensor name -> expected shape, each dimension with the config key behind it."""
    hidden: Dim = (arch.hidden_size, "hidden_size")
    vocab: Dim = (arch.vocab_size, "vocab_size")
    heads = "num_attention_heads x head_dim" if arch.explicit_head_dim else "hidden_size"
    query: Dim = (arch.query_width, heads)
    head_key = "head_dim" if arch.explicit_head_dim else "hidden_size / num_attention_heads"
    kv: Dim = (arch.num_query_groups * arch.head_dim, f"num_key_value_heads x {head_key}")
    shapes: dict[str, list[Dim]] = {
        "model.embed_tokens.weight": [vocab, hidden],
        "lm_head.weight": [vocab, hidden],
        "model.norm.weight": [hidden],
    }
    for layer in sorted({0, arch.num_layers - 1}):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": [hidden],
            p + "post_attention_layernorm.weight": [hidden],
            p + "self_attn.q_proj.weight": [query, hidden],
            p + "self_attn.k_proj.weight": [kv, hidden],
            p + "self_attn.v_proj.weight": [kv, hidden],
            p + "self_attn.o_proj.weight": [hidden, query],
            p + "self_attn.q_proj.bias": [query],
            p + "self_attn.k_proj.bias": [kv],
            p + "self_attn.v_proj.bias": [kv],
        }
        if arch.qk_layernorm:
            shapes[p + "self_attn.q_norm.weight"] = [(arch.head_dim, head_key)]
            shapes[p + "self_attn.k_norm.weight"] = [(arch.head_dim, head_key)]
        if arch.moe is None:
            ffn: Dim = (arch.ffn_hidden_size, "intermediate_size")
            shapes |= {
                p + "mlp.gate_proj.weight": [ffn, hidden],
                p + "mlp.up_proj.weight": [ffn, hidden],
                p + "mlp.down_proj.weight": [hidden, ffn],
            }
            continue
        moe_ffn: Dim = (arch.moe.moe_ffn_hidden_size, "moe_intermediate_size")
        shapes[p + "mlp.gate.weight"] = [(arch.moe.num_experts, "num_experts"), hidden]
        for expert in sorted({0, arch.moe.num_experts - 1}):
            e = f"{p}mlp.experts.{expert}."
            shapes |= {
                e + "gate_proj.weight": [moe_ffn, hidden],
                e + "up_proj.weight": [moe_ffn, hidden],
                e + "down_proj.weight": [hidden, moe_ffn],
            }
    return shapes


def shape_problems(model_dir: Path, files: list[Path], key: str) -> list[str]:
    """The first tensor whose shape disagrees with config.json, as one line naming the
    file, the tensor, both shapes and the config key behind the differing dimensions (one
    wrong value makes most tensors disagree: the embedding is compared first, so a wrong
    hidden_size or vocab_size is named as such); [] when they agree or config.json is
    unreadable (its own check reports that)."""
    config_json = model_dir / "config.json"
    try:
        arch = arch_from_hf_config(json.loads(config_json.read_bytes()), str(config_json))
    except (OSError, ValueError, ConfigError):
        return []
    found: dict[str, tuple[Path, list[int]]] = {}
    for file in files:
        for name, info in read_header(file).items():
            if isinstance(info, dict) and isinstance(info.get("shape"), list):
                found[name] = (file, info["shape"])
    for name, dims in expected_shapes(arch).items():
        if name not in found:
            continue
        file, shape = found[name]
        want = [size for size, _ in dims]
        if shape == want:
            continue
        differing = dims
        if len(shape) == len(want):
            differing = [d for d, got in zip(dims, shape, strict=True) if d[0] != got]
        keys = " and ".join(dict.fromkeys(k for _, k in differing))
        return [
            f"{key}: {file}: tensor {name} has shape {shape}, but {config_json} implies "
            f"{want} ({_values(keys, arch)}); correct {keys} in config.json, or use the "
            f"config.json saved with these weights"
        ]
    layers = _layer_problem(found, arch, config_json, key)
    return [layers] if layers else []


def _values(keys: str, arch: ModelArch) -> str:
    """The config values a key expression stands for, e.g. ``hidden_size = 96``."""
    values = {
        "hidden_size": arch.hidden_size,
        "vocab_size": arch.vocab_size,
        "intermediate_size": arch.ffn_hidden_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_query_groups,
        "head_dim": arch.head_dim,
    }
    if arch.moe is not None:
        values["num_experts"] = arch.moe.num_experts
        values["moe_intermediate_size"] = arch.moe.moe_ffn_hidden_size
    shown = [f"{k} = {v}" for k, v in values.items() if k in keys.replace("/", " ").split()]
    return ", ".join(shown)


def _layer_problem(
    found: dict[str, tuple[Path, list[int]]], arch: ModelArch, config_json: Path, key: str
) -> str | None:
    """num_hidden_layers against the layers the files hold."""
    indices = {int(n.split(".")[2]) for n in found if n.startswith("model.layers.")}
    if not indices or max(indices) + 1 == arch.num_layers:
        return None
    return (
        f"{key}: the weights hold {max(indices) + 1} layers (model.layers.0 .. "
        f"{max(indices)}), but {config_json} says num_hidden_layers = {arch.num_layers}; "
        f"correct num_hidden_layers in config.json (or use the config.json saved with the "
        f"weights)"
    )
