"""Model architecture facts needed before any weight is loaded.

Validation (heads and query groups divisible by TP, layers by PP) and planning need the
architecture of the policy. It comes from the model's Hugging Face config.json (local
directory, HF cache or hub: config/model_source.py), else from a preset (policy.model_arch,
or the one the model's name names), so that a 70B recipe can be validated on a laptop
(``resolve_arch``). Presets mirror the published HF configs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.model_source import (
    has_release_suffix,
    locate_config_json,
    model_basename,
    preset_for_name,
)

if TYPE_CHECKING:
    import transformers

VOCAB_DIVISIBLE_BY = 128
"""Megatron pads the vocabulary to a multiple of this times the TP size."""


def padded_vocab_size(vocab_size: int, tp: int, *, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Rows of the embedding/output layer: ``vocab_size`` rounded up to divisible_by * tp
    (Megatron's rule by default; the memory planner also uses it for vLLM's)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


SUPPORTED_FAMILIES = ("qwen2", "llama", "qwen3", "qwen3_moe")
"""HF model_types the policy can be built from."""


@dataclass(frozen=True)
class MoeArch:
    """The mixture-of-experts MLP of a Qwen3-MoE model (every layer sparse, no shared
    expert)."""

    num_experts: int
    """Routed experts per layer (HF num_experts)."""
    experts_per_token: int
    """Experts each token is routed to (HF num_experts_per_tok, the router's top-k)."""
    moe_ffn_hidden_size: int
    """SwiGLU intermediate size of one expert (HF moe_intermediate_size)."""
    norm_topk_prob: bool
    """Renormalise the top-k routing probabilities to sum to one (Megatron:
    ``moe_router_pre_softmax=False``, softmax over the top-k logits)."""
    router_aux_loss_coef: float
    """The HF config's load-balancing loss coefficient; the trainer uses
    ``policy.moe.aux_loss_coef`` (0 for RL by default), this is kept for export."""


@dataclass(frozen=True)
class ModelArch:
    """Decoder-only transformer shape (Qwen2, Llama, Qwen3 and Qwen3-MoE families)."""

    family: str
    """HF model_type: one of SUPPORTED_FAMILIES."""
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
    explicit_head_dim: int | None = None
    """Attention head size when the HF config sets ``head_dim`` to something other than
    hidden / heads (Qwen3: 128 at every size); None: hidden / heads."""
    qk_layernorm: bool = False
    """RMSNorm over each query and key head before RoPE (Qwen3's q_norm / k_norm)."""
    moe: MoeArch | None = None
    """The expert MLP (Qwen3-MoE); None for a dense model."""

    @property
    def head_dim(self) -> int:
        if self.explicit_head_dim is not None:
            return self.explicit_head_dim
        return self.hidden_size // self.num_attention_heads

    @property
    def query_width(self) -> int:
        """Width of the query projection's output (heads x head size); the hidden size
        except where ``head_dim`` is explicit."""
        return self.num_attention_heads * self.head_dim

    def mlp_parameters(self) -> int:
        """Parameters of one layer's MLP: SwiGLU, or the router and every expert."""
        h = self.hidden_size
        if self.moe is None:
            return 3 * h * self.ffn_hidden_size  # gate, up, down
        return (
            h * self.moe.num_experts + self.moe.num_experts * 3 * h * self.moe.moe_ffn_hidden_size
        )

    def num_parameters(self) -> int:
        """Exact parameter count of the HF model (RMSNorm weights, biases, embeddings)."""
        h, q, kv = self.hidden_size, self.query_width, self.num_query_groups * self.head_dim
        attn = h * q + 2 * h * kv + q * h  # q, k, v, o projections
        if self.add_qkv_bias:
            attn += q + 2 * kv
        if self.qk_layernorm:
            attn += 2 * self.head_dim  # q_norm, k_norm (shared over heads)
        layer = attn + self.mlp_parameters() + 2 * h  # two RMSNorms
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


def _llama(
    layers: int,
    hidden: int,
    ffn: int,
    heads: int,
    groups: int,
    *,
    tied: bool = False,
    rope_factor: float = 8.0,
) -> ModelArch:
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
        tied,
        add_qkv_bias=False,
        rope_scaling_factor=rope_factor,
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


def _qwen3(
    layers: int,
    hidden: int,
    ffn: int,
    heads: int,
    groups: int,
    *,
    vocab: int = 151936,
    head_dim: int = 128,
    max_pos: int = 40960,
    theta: float = 1e6,
    tied: bool = False,
    moe: MoeArch | None = None,
) -> ModelArch:
    return ModelArch(
        "qwen3" if moe is None else "qwen3_moe",
        layers,
        hidden,
        ffn,
        heads,
        groups,
        vocab,
        max_pos,
        theta,
        1e-6,
        tied,
        add_qkv_bias=False,
        explicit_head_dim=head_dim,
        qk_layernorm=True,
        moe=moe,
    )


PRESETS: dict[str, ModelArch] = {
    # A CPU-sized Qwen2 for tests and the tiny recipe (vocab fits the char tokenizer).
    "tiny-qwen2": _qwen2(2, 64, 128, 4, 2, 64, max_pos=512, theta=10000.0, tied=True),
    # The same with head size 32, the smallest vLLM's CPU attention supports (tiny-qwen2 has
    # 16): the tiny recipe's vLLM variant. Two KV heads, so engine and policy TP2 both work.
    "tiny-qwen2-hd32": _qwen2(2, 64, 128, 2, 2, 64, max_pos=512, theta=10000.0, tied=True),
    "qwen2.5-0.5b": _qwen2(24, 896, 4864, 14, 2, 151936, tied=True),
    "qwen2.5-1.5b": _qwen2(28, 1536, 8960, 12, 2, 151936, tied=True),
    "qwen2.5-7b": _qwen2(28, 3584, 18944, 28, 4, 152064, max_pos=131072),
    "qwen2.5-math-1.5b": _qwen2(
        28, 1536, 8960, 12, 2, 151936, max_pos=4096, theta=10000.0, tied=True
    ),
    "qwen2.5-math-7b": _qwen2(28, 3584, 18944, 28, 4, 152064, max_pos=4096, theta=10000.0),
    "qwen2.5-32b": _qwen2(64, 5120, 27648, 40, 8, 152064, max_pos=131072, eps=1e-5),
    # CPU-sized Qwen3 dense and MoE for tests and the tiny MoE recipe (head size 32: vLLM's
    # CPU attention accepts it; two KV heads so TP2 works; the char tokenizer's vocabulary).
    "tiny-qwen3": _qwen3(
        2, 64, 128, 2, 2, vocab=64, head_dim=32, max_pos=512, theta=1e4, tied=True
    ),
    "tiny-qwen3-moe": _qwen3(
        2,
        64,
        128,
        2,
        2,
        vocab=64,
        head_dim=32,
        max_pos=512,
        theta=1e4,
        tied=True,
        moe=MoeArch(4, 2, 32, norm_topk_prob=True, router_aux_loss_coef=0.001),
    ),
    "qwen3-0.6b": _qwen3(28, 1024, 3072, 16, 8, tied=True),
    "qwen3-1.7b": _qwen3(28, 2048, 6144, 16, 8, tied=True),
    "qwen3-4b": _qwen3(36, 2560, 9728, 32, 8, tied=True),
    "qwen3-8b": _qwen3(36, 4096, 12288, 32, 8),
    "qwen3-14b": _qwen3(40, 5120, 17408, 40, 8),
    "qwen3-32b": _qwen3(64, 5120, 25600, 64, 8),
    "qwen3-30b-a3b": _qwen3(
        48,
        2048,
        6144,
        32,
        4,
        moe=MoeArch(128, 8, 768, norm_topk_prob=True, router_aux_loss_coef=0.001),
    ),
    "llama-3.1-8b": _llama(32, 4096, 14336, 32, 8),
    "llama-3.1-70b": _llama(80, 8192, 28672, 64, 8),
    # Llama 3.2 1B: tied embeddings and RoPE scaling factor 32; Llama 3.3 70B is 3.1's shape.
    "llama-3.2-1b": _llama(16, 2048, 8192, 32, 8, tied=True, rope_factor=32.0),
    "llama-3.3-70b": _llama(80, 8192, 28672, 64, 8),
}


def hf_config_fields(arch: ModelArch) -> dict[str, object]:
    """The HF config.json fields of ``arch`` that every supported family's config shares
    (the inverse of ``arch_from_hf_config`` for them), plus ``head_dim`` when it is
    explicit and the expert fields of a MoE; the rest is the caller's."""
    fields: dict[str, object] = {
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
    if arch.explicit_head_dim is not None:
        fields["head_dim"] = arch.explicit_head_dim
    if arch.moe is not None:
        fields.update(
            num_experts=arch.moe.num_experts,
            num_experts_per_tok=arch.moe.experts_per_token,
            moe_intermediate_size=arch.moe.moe_ffn_hidden_size,
            norm_topk_prob=arch.moe.norm_topk_prob,
            router_aux_loss_coef=arch.moe.router_aux_loss_coef,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return fields


def hf_config(arch: ModelArch, **extra: object) -> transformers.PretrainedConfig:
    """The HF config of ``arch`` (any supported family; Llama RoPE scaling is the caller's
    ``extra``); ``extra`` adds HF-only fields (token ids, dtype)."""
    import transformers  # lazily: importing the config package stays light

    kwargs: dict[str, Any] = {**hf_config_fields(arch), **extra}
    if arch.family == "qwen2":
        return transformers.Qwen2Config(**kwargs)
    if arch.family == "qwen3":
        return transformers.Qwen3Config(attention_bias=False, **kwargs)
    if arch.family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(attention_bias=False, **kwargs)
    if arch.family == "llama":
        return transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **kwargs)
    raise ValueError(f"model family {arch.family!r} has no HF config")


HF_ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
"""The transformers model class (config.json ``architectures``) of each family."""


def arch_from_hf_config(hf: dict[str, Any], source: str) -> ModelArch:
    """Read a ModelArch from a parsed HF config.json; `source` names the file in errors."""
    family = hf.get("model_type")
    if family not in SUPPORTED_FAMILIES:
        raise ConfigError(
            f"{source}: model_type {family!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_FAMILIES)}"
        )
    theta, rope_factor = _rope(hf, source)
    qwen3 = family in ("qwen3", "qwen3_moe")
    if qwen3 and hf.get("use_sliding_window"):
        raise ConfigError(
            f"{source}: use_sliding_window = true is not supported (full attention only; "
            "released Qwen3 models set it false)"
        )
    try:
        heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
        head_dim = int(hf.get("head_dim") or hidden // heads)
        # Qwen3 states its head size (transformers defaults it to hidden / heads), so it
        # is always explicit there; elsewhere only when it differs from hidden / heads.
        explicit = head_dim if qwen3 or head_dim * heads != hidden else None
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
            explicit_head_dim=explicit,
            qk_layernorm=qwen3,
            moe=_moe_from_hf(hf, source) if family == "qwen3_moe" else None,
        )
    except KeyError as e:
        raise ConfigError(f"{source}: missing field {e.args[0]!r} in the HF config") from None


def _moe_from_hf(hf: dict[str, Any], source: str) -> MoeArch:
    """The expert MLP of a Qwen3-MoE config.json; layouts we do not build are refused."""
    sparse_step = int(hf.get("decoder_sparse_step", 1))
    dense_layers = list(hf.get("mlp_only_layers") or [])
    if sparse_step != 1 or dense_layers:
        raise ConfigError(
            f"{source}: decoder_sparse_step = {sparse_step}, mlp_only_layers = {dense_layers}: "
            "only models whose every layer is sparse are supported (decoder_sparse_step 1, "
            "mlp_only_layers [], as every released Qwen3-MoE)"
        )
    if int(hf.get("shared_expert_intermediate_size", 0) or 0):
        raise ConfigError(f"{source}: shared experts are not supported (Qwen3-MoE has none)")
    return MoeArch(
        # transformers 5 writes num_local_experts; released Qwen3-MoE configs num_experts.
        num_experts=int(hf["num_experts"] if "num_experts" in hf else hf["num_local_experts"]),
        experts_per_token=int(hf["num_experts_per_tok"]),
        moe_ffn_hidden_size=int(hf["moe_intermediate_size"]),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.0)),
    )


def preset_for_model(model_name_or_path: str) -> str | None:
    """The preset named by a model's name (hub id, directory or path), or None: the one
    matcher of dapo-plan, dapo-train and dapo-import-config (config/model_source.py)."""
    return preset_for_name(model_name_or_path, PRESETS)


def weight_shape(arch: ModelArch) -> ModelArch:
    """``arch`` less what no weight's shape depends on: context length, RoPE base and
    scaling, norm epsilon, the MoE aux-loss coefficient. A preset and a checkpoint agree when
    these agree: a -Base model ships another context length than its preset (Qwen3-8B-Base:
    32768 positions, the preset 40960) and is still that architecture."""
    moe = None if arch.moe is None else dataclasses.replace(arch.moe, router_aux_loss_coef=0.0)
    return dataclasses.replace(
        arch,
        max_position_embeddings=0,
        rope_theta=0.0,
        norm_epsilon=0.0,
        rope_scaling_factor=None,
        moe=moe,
    )


def describe_shape(arch: ModelArch) -> str:
    """One line of the shape fields (weight_shape) for an error message."""
    text = (
        f"{arch.family}, {arch.num_layers} layers, hidden {arch.hidden_size}, "
        f"ffn {arch.ffn_hidden_size}, heads {arch.num_attention_heads}/"
        f"{arch.num_query_groups} kv (head size {arch.head_dim}), vocab {arch.vocab_size}"
    )
    if arch.moe is not None:
        text += (
            f", {arch.moe.num_experts} experts (top-{arch.moe.experts_per_token}, "
            f"FFN {arch.moe.moe_ffn_hidden_size})"
        )
    return text + (", tied embeddings" if arch.tie_word_embeddings else "")


def resolve_arch(
    model_name_or_path: str,
    preset: str | None,
    *,
    preset_applies: bool = True,
    preset_source: str = "",
    env: Mapping[str, str] | None = None,
) -> tuple[ModelArch, str]:
    """The policy architecture and where it came from, or ConfigError naming
    policy.model_arch.

    1. The model's config.json wins: the local directory, else the Hugging Face cache for a
       hub id, else (online) config.json alone from the hub (config/model_source.py).
    2. Else the preset ``preset`` (policy.model_arch), when it applies to this model
       (``preset_applies``: False for a preset inherited from a parent recipe that named
       another model; ``preset_source`` names that file in messages).
    3. Else the preset the model's name names (``Qwen/Qwen3-8B-Base`` -> qwen3-8b).
    4. Else an error naming policy.model_arch, the model and the presets.

    A preset that applies but disagrees with the config.json's weight shapes, or is another
    preset than the name's, is an error naming both: never silently one of them.
    """
    known = ", ".join(sorted(PRESETS))
    if preset is not None and preset not in PRESETS:
        raise ConfigError(
            f"policy.model_arch: unknown preset {preset!r}; choose one of {known} or null"
        )
    chosen = preset if preset_applies else None
    config_json, looked = locate_config_json(model_name_or_path, env)
    if config_json is not None:
        with open(config_json, encoding="utf-8") as f:
            arch = arch_from_hf_config(json.load(f), str(config_json))
        if chosen is not None and weight_shape(arch) != weight_shape(PRESETS[chosen]):
            raise ConfigError(
                f"policy.model_arch = {chosen!r} disagrees with {config_json}, the config of "
                f"policy.model_name_or_path = {model_name_or_path!r}: the preset is "
                f"{describe_shape(PRESETS[chosen])}; the checkpoint is "
                f"{describe_shape(arch)}. Set policy.model_arch=null (the checkpoint's "
                f"config.json is used) or point policy.model_name_or_path at the model meant"
            )
        return arch, looked
    named = preset_for_model(model_name_or_path)
    if chosen is not None:
        if named is not None and PRESETS[named] != PRESETS[chosen]:
            raise ConfigError(
                f"policy.model_arch = {chosen!r} disagrees with the name of "
                f"policy.model_name_or_path = {model_name_or_path!r}, which is preset "
                f"{named!r}: {chosen} is {describe_shape(PRESETS[chosen])}; {named} is "
                f"{describe_shape(PRESETS[named])}. Set policy.model_arch={named} (or null) "
                f"or point policy.model_name_or_path at the model meant"
            )
        return PRESETS[chosen], f"preset {chosen}"
    if named is not None:
        return PRESETS[named], f"preset {named}, from the name {model_basename(model_name_or_path)}"
    why = [f"{looked}"]
    if preset is not None:
        where = f" in {preset_source}" if preset_source else ""
        why.append(
            f"policy.model_arch = {preset!r} was set{where} for the model named there, not "
            f"for this one"
        )
    hint = ""
    if has_release_suffix(model_name_or_path):
        hint = (
            " (a release suffix such as -2507 is not matched: those releases change the "
            "context length and RoPE base; their config.json has them)"
        )
    raise ConfigError(
        f"policy.model_arch: the architecture of policy.model_name_or_path = "
        f"{model_name_or_path!r} is unknown: {'; '.join(why)}; and its name "
        f"{model_basename(model_name_or_path)!r} names no preset{hint}. Put the "
        f"checkpoint (its config.json) there, or set policy.model_arch (next to "
        f"policy.model_name_or_path) to one of {known}"
    )
