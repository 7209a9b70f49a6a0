"""A Qwen3 dense engine of the vLLM backend against HF transformers, a refit included (CPU).

Two tiny random fp32 Qwen3 checkpoints A and B of one architecture: hidden 64, 4 query
heads of 32 (query width 128 != hidden: head size 32 is the smallest vLLM's CPU attention
takes), 2 KV heads, q/k norms, untied; every weight randomised (HF one-inits the norms,
which would hide a q/k norm vLLM skipped). One in-process engine started from A:

* greedy responses equal HF's greedy ``generate`` and the logprobs HF's ``log_softmax``
  (bound 1e-4, as test_vllm_backend.py); tests/distributed/test_qwen3.py ties HF to our
  Megatron policy (logits 1e-5), so the engine scores what the policy trains;
* a refit (``update_weights``, the path every transport ends in) with B's tensors under
  the names and shapes our exporter streams (``hf_weight_specs`` of the Qwen3 arch: the
  q/k norms included) makes the engine B; a refit back makes it A again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers
from engine_builder import start_engine
from hf_parity import MAX_MODEL_LEN, check_against_hf
from safetensors.torch import load_file

from dapo_megatron.config.model_arch import arch_from_hf_config
from dapo_megatron.data.tokenizer import build_char_tokenizer, save_char_tokenizer
from dapo_megatron.generation.base import GenerationBackend

VOCAB = 64
TEXTS = ["12+7=", "3*4=", "100-58=9", "5"]


def _hf_config() -> transformers.Qwen3Config:
    return transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_MODEL_LEN,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def _save_model(out: Path, seed: int) -> None:
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(_hf_config())
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(
                1.0 + 0.2 * torch.randn_like(param)
                if name.endswith("norm.weight")  # q_norm / k_norm too
                else 0.2 * torch.randn_like(param)
            )
    model.save_pretrained(out)
    save_char_tokenizer(build_char_tokenizer(model_max_length=MAX_MODEL_LEN), out)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vllm_qwen3_models")
    for seed, name in enumerate(("a", "b")):
        _save_model(root / name, seed + 20)
    return {name: str(root / name) for name in ("a", "b")}


@pytest.fixture(scope="module")
def engine(model_dirs: dict[str, str]) -> Iterator[GenerationBackend]:
    backend = start_engine(model_dirs["a"], max_model_len=MAX_MODEL_LEN)
    yield backend
    backend.shutdown()


def _exporter_stream(hf_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors in the names, shapes and order our exporter streams them
    (``hf_weight_specs``, what a refit from the Megatron policy sends)."""
    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.megatron.hf_weights import hf_weight_specs

    tensors: dict[str, torch.Tensor] = {}
    for path in Path(hf_dir).glob("*.safetensors"):
        tensors.update(load_file(path))
    arch = arch_from_hf_config(_hf_config().to_dict(), "vllm qwen3 test config")
    specs = hf_weight_specs(arch, ParallelDims(1, 1, 1, 1, False))
    assert sorted(name for name, _ in specs) == sorted(tensors)
    for name, shape in specs:
        assert tuple(tensors[name].shape) == shape, name
        yield name, tensors[name]


def test_qwen3_engine_matches_hf_and_refits(engine, model_dirs) -> None:
    tokenizer = build_char_tokenizer()
    prompts = [tokenizer.encode(text) for text in TEXTS]
    start = check_against_hf(engine, model_dirs["a"], prompts)
    try:
        engine.update_weights(_exporter_stream(model_dirs["b"]))
        to_b = check_against_hf(engine, model_dirs["b"], prompts)
    finally:
        engine.update_weights(_exporter_stream(model_dirs["a"]))
    back = check_against_hf(engine, model_dirs["a"], prompts)
    print(f"qwen3 max |logprob - HF|: start {start:.1e}, refit to B {to_b:.1e}, back {back:.1e}")
