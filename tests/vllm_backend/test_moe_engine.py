"""A Qwen3-MoE engine of the vLLM backend against HF transformers, refits included (CPU).

Two tiny random fp32 Qwen3-MoE checkpoints A and B (4 experts, top-2, expert FFN 32: the
CPU experts kernel wants it divisible by 32; head size 32; q/k norms; every weight
randomised) and one in-process engine started from A:

* greedy responses equal HF's and the logprobs HF's ``log_softmax`` (bound 1e-4);
* a refit to B with the tensors as the checkpoint FILES name them (one tensor per
  expert, ``mlp.experts.{e}.gate_proj.weight``: what our exporter streams) makes the
  engine B; a refit back with transformers' in-memory names (stacked
  ``mlp.experts.gate_up_proj``) makes it A again. Without the repack of
  ``vllm_worker._repack_experts`` the CPU experts kernel keeps multiplying with raw
  weights laid out as prepacked ones after a refit (logprobs off by up to 7).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers
from engine_builder import start_engine
from hf_parity import MAX_MODEL_LEN, check_against_hf, hf_model
from safetensors.torch import load_file

from dapo_megatron.data.tokenizer import build_char_tokenizer, save_char_tokenizer
from dapo_megatron.generation.base import GenerationBackend

VOCAB = 64
TEXTS = ["12+7=", "3*4=", "100-58=9", "5"]


def _hf_config() -> transformers.Qwen3MoeConfig:
    return transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_MODEL_LEN,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def _save_model(out: Path, seed: int) -> None:
    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM(_hf_config())
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(
                1.0 + 0.2 * torch.randn_like(param)
                if name.endswith("norm.weight")
                else 0.2 * torch.randn_like(param)
            )
    model.save_pretrained(out)
    save_char_tokenizer(build_char_tokenizer(model_max_length=MAX_MODEL_LEN), out)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vllm_moe_models")
    for seed, name in enumerate(("a", "b")):
        _save_model(root / name, seed)
    return {name: str(root / name) for name in ("a", "b")}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = build_char_tokenizer()
    return [tokenizer.encode(text) for text in TEXTS]


@pytest.fixture(scope="module")
def engine(model_dirs: dict[str, str]) -> Iterator[GenerationBackend]:
    backend = start_engine(model_dirs["a"], max_model_len=MAX_MODEL_LEN)
    yield backend
    backend.shutdown()


def _file_tensors(hf_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under the names its files hold (one per expert)."""
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        yield from load_file(path).items()


def test_moe_engine_matches_hf_and_refits_in_both_naming_schemes(
    engine, model_dirs, prompts
) -> None:
    names = dict(_file_tensors(model_dirs["b"]))
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in names  # per-expert files
    start = check_against_hf(engine, model_dirs["a"], prompts)
    try:
        engine.update_weights(_file_tensors(model_dirs["b"]))
        to_b = check_against_hf(engine, model_dirs["b"], prompts)
    finally:
        # transformers 5 holds the experts stacked in memory: the other naming scheme.
        engine.update_weights(iter(hf_model(model_dirs["a"]).state_dict().items()))
    back = check_against_hf(engine, model_dirs["a"], prompts)
    print(f"max |logprob - HF|: start {start:.1e}, refit to B {to_b:.1e}, back to A {back:.1e}")
