"""GPU-only paths: Transformer Engine layer spec, NCCL, the logprob and PG-loss kernels on CUDA.

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


def test_triton_logprob_hidden_gradient_is_deterministic():
    """dH is accumulated per (token block, vocab split) without atomics: bitwise repeatable."""
    pytest.importorskip("triton")
    from dapo_megatron.kernels import linear_logprob

    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(300, 512, generator=gen, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(20000, 512, generator=gen, device="cuda", dtype=torch.bfloat16) / 8
    targets = torch.randint(0, 20000, (300,), generator=gen, device="cuda")
    coef = torch.randn(300, generator=gen, device="cuda")
    grads = []
    for _ in range(3):
        h = hidden.clone().requires_grad_()
        lp, _ = linear_logprob(h, weight, targets, impl="triton")
        (coef * lp).sum().backward()
        grads.append(h.grad)
    assert all(torch.equal(grads[0], g) for g in grads[1:])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_triton_pg_loss_on_cuda_matches_torch(mode):
    """The compiled fused PG loss (not the interpreter) against torch_policy_loss in float64."""
    pytest.importorskip("triton")
    from dapo_megatron.algorithms.loss import loss_denominator, torch_policy_loss
    from dapo_megatron.algorithms.loss_inputs import LossInputs
    from dapo_megatron.config.run_plan import shipped_loss_spec
    from dapo_megatron.kernels.pg_loss import pg_loss

    gen = torch.Generator().manual_seed(0)
    b, t = 5, 1031
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 4
    lp = old + torch.randn(b, t, generator=gen, dtype=torch.float64)
    rollout = old + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=gen) > 0.1).float()
    spec = shipped_loss_spec(t, clip_ratio_c=3.0, loss_agg_mode=mode, rollout_correction="tis")
    norm = loss_denominator(mask, mode)
    lp64 = lp.clone().requires_grad_()
    want = torch_policy_loss(
        LossInputs(lp64, old, adv, mask, norm, rollout_logprobs_BT=rollout), spec
    )
    want.loss.backward()
    lp32 = lp.float().cuda().requires_grad_()
    got = pg_loss(
        LossInputs(
            lp32,
            old.float().cuda(),
            adv.float().cuda(),
            mask.cuda(),
            norm,
            rollout_logprobs_BT=rollout.float().cuda(),
        ),
        spec,
        impl="auto",  # must pick the Triton kernel on CUDA
    )
    got.loss.backward()
    torch.testing.assert_close(got.loss.double().cpu(), want.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lp32.grad.double().cpu(), lp64.grad, rtol=1e-5, atol=1e-6)
    for key, value in want.metrics.items():
        torch.testing.assert_close(got.metrics[key].cpu(), value, rtol=1e-5, atol=1e-3, msg=key)


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
