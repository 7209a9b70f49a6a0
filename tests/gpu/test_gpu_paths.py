"""GPU-only paths: Transformer Engine layer spec, NCCL, the logprob kernel on CUDA.

Marked `gpu`: tests/conftest.py skips them (with a reason, counted) on machines without
CUDA. On a GPU machine: `.venv/bin/python -m pytest tests/gpu -m gpu`.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_chunked_logprob_on_cuda_matches_float64_reference():
    from dapo_megatron.kernels import linear_logprob
    from dapo_megatron.kernels.reference import linear_logprob_reference

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(257, 512, generator=gen, dtype=torch.float64)
    weight = torch.randn(32000, 512, generator=gen, dtype=torch.float64) / 512**0.5
    targets = torch.randint(0, 32000, (257,), generator=gen)
    want, want_ent = linear_logprob_reference(hidden, weight, targets, compute_entropy=True)
    got, got_ent = linear_logprob(
        hidden.cuda().bfloat16(), weight.cuda().bfloat16(), targets.cuda(), compute_entropy=True
    )
    assert (got <= 0).all()
    # bf16 inputs: compare against the reference at a bf16-sized tolerance.
    torch.testing.assert_close(got.double().cpu(), want, rtol=0, atol=5e-2)
    torch.testing.assert_close(got_ent.double().cpu(), want_ent, rtol=0, atol=5e-2)


def test_transformer_engine_spec_matches_hf(tmp_path):
    pytest.importorskip("transformer_engine", reason="transformer-engine (gpu extra) not installed")
    import transformers

    from dapo_megatron.config.model_arch import arch_from_hf_config
    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
    from dapo_megatron.megatron.hf_weights import load_hf_checkpoint
    from dapo_megatron.megatron.model import build_model, uses_transformer_engine

    config = transformers.Qwen2Config(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    hf = transformers.Qwen2ForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dims = ParallelDims(1, 1, 1, 1, False)
    initialize_parallel(dims, seed=0)
    try:
        assert uses_transformer_engine()
        arch = arch_from_hf_config(config.to_dict(), "test")
        model = build_model(arch, dims, "fp32")
        load_hf_checkpoint(model, tmp_path / "hf", arch, dims)
        tokens = torch.randint(0, 256, (2, 16), device="cuda")
        positions = torch.arange(16, device="cuda").expand(2, 16)
        with torch.no_grad():
            ours = model.eval()(tokens, positions, None)[..., :256].float()
            theirs = hf.cuda()(tokens).logits.float()
        assert (ours - theirs).abs().max().item() <= 1e-3  # TF32/fused kernels on GPU
    finally:
        destroy_parallel()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL TP2")
def test_nccl_tensor_parallel_all_reduce():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
    from launch import run_distributed

    results = run_distributed(_nccl_worker, 2)
    assert results == [3.0, 3.0]


def _nccl_worker() -> float:
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    value = torch.tensor([float(rank + 1)], device="cuda")
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value.item())
