"""Model architecture facts needed before any weight is loaded.

Validation (heads and query groups divisible by TP, layers by PP) and planning need the
architecture of the policy. It comes from the checkpoint's Hugging Face config.json when
the checkpoint is on disk, else from a named preset (policy.model_arch), so that a 70B
recipe can be validated on a laptop. Presets mirror the published HF configs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_megatron.config.errors import ConfigError

if TYPE_CHECKING:
    import transformers

VOCAB_DIVISIBLE_BY = 128
"""Megatron pads the vocabulary to a multiple of this times the TP size."""


def padded_vocab_size(vocab_size: int, tp: int, *, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Rows of the embedding/output layer: ``vocab_size`` rounded up to divisible_by * tp
    (Megatron's rule by default; the memory planner also uses it for vLLM's)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True)
class ModelArch:
    """Decoder-only transformer shape (Qwen2 / Llama families)."""

    family: str
    """HF model_type: "qwen2" or "llama"."""
    num_layers: int
    """Transformer layers (num_hidden_layers)."""
    hidden_size: int
    """Model width."""
    ffn_hidden_size: int
    """SwiGLU intermediate size."""
    num_attention_heads: int
    """Query heads."""
    num_query_groups: int
    """Key/value heads (GQA groups)."""
    vocab_size: int
    """Vocabulary size of the embedding and output layer."""
    max_position_embeddings: int
    """Longest sequence the rotary embedding was trained for."""
    rope_theta: float
    """RoPE base."""
    norm_epsilon: float
    """RMSNorm epsilon."""
    tie_word_embeddings: bool
    """Output layer shares the input embedding."""
    add_qkv_bias: bool
    """Bias on the q/k/v projections (Qwen2)."""
    rope_scaling_factor: float | None = None
    """Llama 3.x RoPE frequency scaling factor (low/high freq factors 1 and 4, original
    context 8192, as Llama 3.1 ships); None for unscaled RoPE."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def num_parameters(self) -> int:
        """Exact parameter count of the HF model (RMSNorm weights, biases, embeddings)."""
        h, kv = self.hidden_size, self.num_query_groups * self.head_dim
        attn = h * h + 2 * h * kv + h * h  # q, k, v, o projections
        if self.add_qkv_bias:
            attn += h + 2 * kv
        mlp = 3 * h * self.ffn_hidden_size  # gate, up, down
        layer = attn + mlp + 2 * h  # two RMSNorms
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + embeddings + h  # + final norm


def _qwen2(
    layers: int,
    hidden: int,
    ffn: int,
    heads: int,
    groups: int,
    vocab: int,
    *,
    max_pos: int = 32768,
    theta: float = 1e6,
    eps: float = 1e-6,
    tied: bool = False,
) -> ModelArch:
    return ModelArch(
        "qwen2",
        layers,
        hidden,
        ffn,
        heads,
        groups,
        vocab,
        max_pos,
        theta,
        eps,
        tied,
        add_qkv_bias=True,
    )


def _llama(layers: int, hidden: int, ffn: int, heads: int, groups: int) -> ModelArch:
    return ModelArch(
        "llama",
        layers,
        hidden,
        ffn,
        heads,
        groups,
        128256,
        131072,
        500000.0,
        1e-5,
        False,
        add_qkv_bias=False,
        rope_scaling_factor=8.0,
    )


# The Llama 3 RoPE scaling constants Megatron-Core implements; other values are refused
# rather than silently computed with the wrong frequencies.
_LLAMA3_ROPE_CONSTANTS = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _rope(hf: dict[str, Any], source: str) -> tuple[float, float | None]:
    """(theta, llama3 scaling factor) from an HF config of any transformers version.

    transformers >= 5 writes `rope_parameters: {rope_theta, rope_type, ...}`; older versions
    write a top-level `rope_theta` and an optional `rope_scaling` mapping.
    """
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    if rope_type in (None, "default"):
        return theta, None
    if rope_type != "llama3":
        raise ConfigError(f"{source}: RoPE type {rope_type!r} is not supported (default, llama3)")
    values = {**scaling, **params}
    for key, expected in _LLAMA3_ROPE_CONSTANTS.items():
        if key in values and float(values[key]) != expected:
            raise ConfigError(
                f"{source}: llama3 RoPE {key} = {values[key]} is not supported (only {expected})"
            )
    return theta, float(values.get("factor", 8.0))


PRESETS: dict[str, ModelArch] = {
    # A CPU-sized Qwen2 for tests and the tiny recipe (vocab fits the char tokenizer).
    "tiny-qwen2": _qwen2(2, 64, 128, 4, 2, 64, max_pos=512, theta=10000.0, tied=True),
    # The same with head size 32, the smallest vLLM's CPU attention supports (tiny-qwen2 has
    # 16): the tiny recipe's vLLM variant. Two KV heads, so engine and policy TP2 both work.
    "tiny-qwen2-hd32": _qwen2(2, 64, 128, 2, 2, 64, max_pos=512, theta=10000.0, tied=True),
    "qwen2.5-0.5b": _qwen2(24, 896, 4864, 14, 2, 151936, tied=True),
    "qwen2.5-1.5b": _qwen2(28, 1536, 8960, 12, 2, 151936, tied=True),
    "qwen2.5-7b": _qwen2(28, 3584, 18944, 28, 4, 152064, max_pos=131072),
    "qwen2.5-math-7b": _qwen2(28, 3584, 18944, 28, 4, 152064, max_pos=4096, theta=10000.0),
    "qwen2.5-32b": _qwen2(64, 5120, 27648, 40, 8, 152064, max_pos=131072, eps=1e-5),
    "llama-3.1-8b": _llama(32, 4096, 14336, 32, 8),
    "llama-3.1-70b": _llama(80, 8192, 28672, 64, 8),
}


def hf_config_fields(arch: ModelArch) -> dict[str, object]:
    """The HF config.json fields of ``arch`` that Qwen2 and Llama configs share (the inverse
    of ``arch_from_hf_config`` for them); family-specific fields are the caller's."""
    return {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.ffn_hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_query_groups,
        "max_position_embeddings": arch.max_position_embeddings,
        "rope_theta": arch.rope_theta,
        "rms_norm_eps": arch.norm_epsilon,
        "tie_word_embeddings": arch.tie_word_embeddings,
    }


def qwen2_hf_config(arch: ModelArch, **extra: object) -> transformers.Qwen2Config:
    """The HF Qwen2 config of a (qwen2-family) ModelArch; `extra` adds HF-only fields.

    Here, beside ``hf_config_fields``, because both the tiny-model writer (data/) and the HF
    exporter (megatron/) build it, and both import config/."""
    import transformers  # lazily: importing the config package stays light

    # Keywords gathered in a dict[str, Any]: transformers 5's typed signature lacks
    # `rope_theta` (still accepted and turned into rope_parameters; 4.x needs it), and
    # `extra` may hold values for any field.
    kwargs: dict[str, Any] = {**hf_config_fields(arch), **extra}
    return transformers.Qwen2Config(**kwargs)


def arch_from_hf_config(hf: dict[str, Any], source: str) -> ModelArch:
    """Read a ModelArch from a parsed HF config.json; `source` names the file in errors."""
    family = hf.get("model_type")
    if family not in ("qwen2", "llama"):
        raise ConfigError(
            f"{source}: model_type {family!r} is not supported; supported: qwen2, llama"
        )
    theta, rope_factor = _rope(hf, source)
    try:
        return ModelArch(
            family=family,
            num_layers=int(hf["num_hidden_layers"]),
            hidden_size=int(hf["hidden_size"]),
            ffn_hidden_size=int(hf["intermediate_size"]),
            num_attention_heads=int(hf["num_attention_heads"]),
            num_query_groups=int(hf.get("num_key_value_heads", hf["num_attention_heads"])),
            vocab_size=int(hf["vocab_size"]),
            max_position_embeddings=int(hf["max_position_embeddings"]),
            rope_theta=theta,
            norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            add_qkv_bias=family == "qwen2" or bool(hf.get("attention_bias", False)),
            rope_scaling_factor=rope_factor,
        )
    except KeyError as e:
        raise ConfigError(f"{source}: missing field {e.args[0]!r} in the HF config") from None


def resolve_arch(model_name_or_path: str, preset: str | None) -> tuple[ModelArch | None, str]:
    """The policy architecture and where it came from.

    config.json in the checkpoint wins; else the preset; else (None, reason), which lets a
    dry run say that model-dependent checks were skipped instead of failing.
    """
    config_json = Path(model_name_or_path) / "config.json"
    if config_json.is_file():
        with open(config_json, encoding="utf-8") as f:
            return arch_from_hf_config(json.load(f), str(config_json)), str(config_json)
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(
                f"policy.model_arch: unknown preset {preset!r}; choose one of "
                f"{', '.join(sorted(PRESETS))} or null"
            )
        return PRESETS[preset], f"preset {preset}"
    return None, f"no {config_json} and policy.model_arch is null"
