"""Model architectures (config/model_arch.py): presets against published parameter counts,
the HF config.json round trip, and unsupported models."""

from __future__ import annotations

import json

import pytest

from dapo_megatron.config import ConfigError
from dapo_megatron.config.model_arch import (
    HF_ARCHITECTURES,
    PRESETS,
    arch_from_hf_config,
    hf_config,
)


def test_unknown_model_type_is_an_error():
    with pytest.raises(
        ConfigError,
        match="model_type 'gpt2' is not supported; supported: qwen2, llama, qwen3, qwen3_moe",
    ):
        arch_from_hf_config({"model_type": "gpt2"}, "x/config.json")


@pytest.mark.parametrize(
    "preset, params",
    [
        # Published parameter counts of the Hugging Face checkpoints.
        ("qwen2.5-7b", 7_615_616_512),
        ("qwen2.5-0.5b", 494_032_768),
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.1-70b", 70_553_706_496),
        ("llama-3.3-70b", 70_553_706_496),
        ("llama-3.2-1b", 1_235_814_400),
        ("qwen2.5-math-1.5b", 1_543_714_304),
        ("qwen3-0.6b", 596_049_920),
        ("qwen3-8b", 8_190_735_360),
        ("qwen3-14b", 14_768_307_200),
        ("qwen3-32b", 32_762_123_264),
        ("qwen3-30b-a3b", 30_532_122_624),
    ],
)
def test_preset_parameter_counts(preset, params):
    assert PRESETS[preset].num_parameters() == params


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe"])
def test_tiny_presets_match_the_hf_model_and_read_back(preset):
    # The HF model built from hf_config(arch) is the independent reference: its parameter
    # count, and its config.json read back to the same arch.
    transformers = pytest.importorskip("transformers")
    arch = PRESETS[preset]
    config = hf_config(arch)
    model = getattr(transformers, HF_ARCHITECTURES[arch.family])(config)
    assert sum(p.numel() for p in model.parameters()) == arch.num_parameters()
    assert arch_from_hf_config(json.loads(config.to_json_string()), preset) == arch


def test_qwen3_configs_as_released_read_correctly():
    # The fields of the released Qwen3-30B-A3B config.json (num_experts, not transformers
    # 5's num_local_experts) and a Qwen3 with head_dim != hidden / heads (Qwen3-0.6B).
    moe = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    }
    assert arch_from_hf_config(moe, "c.json") == PRESETS["qwen3-30b-a3b"]
    dense = {k: v for k, v in moe.items() if "expert" not in k and "moe" not in k}
    dense.update(
        model_type="qwen3",
        num_hidden_layers=28,
        hidden_size=1024,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    )
    arch = arch_from_hf_config(dense, "c.json")
    assert arch == PRESETS["qwen3-0.6b"]
    assert (arch.head_dim, arch.query_width, arch.hidden_size) == (128, 2048, 1024)
    with pytest.raises(ConfigError, match="mlp_only_layers"):
        arch_from_hf_config({**moe, "mlp_only_layers": [0]}, "c.json")
    with pytest.raises(ConfigError, match="use_sliding_window"):
        arch_from_hf_config({**dense, "use_sliding_window": True}, "c.json")


def test_tiny_parameter_count_by_hand():
    # tiny-qwen2: h=64, 4 heads of 16, 2 kv groups -> kv width 32, ffn 128, vocab 64, tied.
    # attention: q 64*64 + k,v 2*64*32 + o 64*64 = 4096 + 4096 + 4096 = 12288; biases 64+64 = 128
    # mlp: 3*64*128 = 24576; norms 2*64 = 128 -> layer 37120; 2 layers = 74240
    # embedding 64*64 = 4096 (tied), final norm 64 -> 78400
    assert PRESETS["tiny-qwen2"].num_parameters() == 78400
