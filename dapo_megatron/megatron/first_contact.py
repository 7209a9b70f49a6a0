"""GPU-check section: one Megatron train step and one packed logprob pass, checked against HF.

A random tiny Qwen2 (tied embeddings, qkv bias; an HF checkpoint written to a temporary
directory) is loaded into ``MegatronPolicy`` at TP1 on whatever device this process has
(CUDA on a GPU node, the CPU compatibility layer elsewhere), with the local layer spec (the
first-contact machine has no Transformer Engine). Checks, against the same model in HF
float64:

* packed logprobs (``policy.max_tokens_per_microbatch``, THD) and the padded pass: the
  token logprobs at temperature 0.9;
* one DAPO train step with plain SGD at lr 1 (no momentum on the first step, no clipping,
  no weight decay): the change of every exported HF tensor is minus its gradient, which must
  equal the gradient of the same DAPO loss computed on the HF model in float64.

This runs the policy's own code end to end on the device: parallel init (NCCL on GPU),
model build, HF load, packing, the logprob kernels the dispatcher picks for the device, the
loss and its global normaliser, the collectives of the step, the optimizer, the export.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
B, S, VOCAB, TEMPERATURE = 8, 24, 256, 0.9


def _hf_model(hf_dir: Path) -> Any:
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else 0.1
            param.copy_(
                (1.0 if name.endswith("norm.weight") else 0.0) + scale * torch.randn_like(param)
            )
    model.save_pretrained(hf_dir)
    return model


def _hf_logprobs(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """Token-aligned logprobs (position 0 is 0) of the HF model at TEMPERATURE."""
    logits = model(input_ids).logits[:, :-1] / TEMPERATURE
    lp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(input_ids.shape[0], 1, dtype=lp.dtype), lp], 1)


def _config(hf_dir: Path, budget: int) -> Any:
    from dapo_megatron.config.loader import load_config

    overrides = [
        f"policy.model_name_or_path={hf_dir}",
        "policy.model_arch=null",
        "policy.init_model_if_missing=false",
        "policy.precision=fp32",
        "policy.optimizer.name=sgd",
        "policy.optimizer.lr=1.0",
        "policy.optimizer.min_lr=0.0",
        "policy.optimizer.weight_decay=0.0",
        "policy.optimizer.clip_grad=0.0",
        "policy.scheduler.lr_warmup_steps=0",
        "policy.scheduler.lr_decay_style=constant",
        f"policy.train_micro_batch_size={B}",
        "policy.logprob_micro_batch_size=4",
        f"policy.max_tokens_per_microbatch={budget}",
        f"generation.temperature={TEMPERATURE}",
        "policy.megatron.use_distributed_optimizer=false",
        # The first-contact machine has no Transformer Engine: the local spec, on purpose.
        "policy.allow_local_spec=true",
    ]
    return load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", overrides, validate=False).config


def megatron_step_section() -> dict[str, Any]:
    """Run the checks of the module docstring; raises AssertionError on a mismatch."""
    import dataclasses

    from dapo_megatron.algorithms.loss import loss_denominator
    from dapo_megatron.algorithms.loss_inputs import LossInputs
    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.config.run_plan import build_loss_spec, policy_plan
    from dapo_megatron.kernels.pg_loss import pg_loss
    from dapo_megatron.megatron.policy import MegatronPolicy
    from dapo_megatron.shared.batch import PolicyBatch

    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK"):  # one rank: an in-memory rendezvous
        os.environ.pop(key, None)
    os.environ["WORLD_SIZE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "qwen2"
        model = _hf_model(hf_dir).double()
        gen = torch.Generator().manual_seed(1)
        input_ids = torch.randint(0, VOCAB, (B, S), generator=gen)
        lengths = torch.tensor([S - b % 5 for b in range(B)])
        loss_mask = torch.zeros(B, S)
        for b in range(B):
            loss_mask[b, 2 + b % 3 : int(lengths[b])] = 1.0
        ref_lp = _hf_logprobs(model, input_ids).detach()
        advantages = torch.randn(B, generator=gen)
        old = (ref_lp.float() + 0.3 * torch.randn(B, S, generator=gen)) * (loss_mask > 0)
        batch = PolicyBatch(
            input_ids=input_ids,
            loss_mask=loss_mask,
            advantages=advantages,
            old_logprobs=old,
        )
        batch.lengths = lengths
        config = _config(hf_dir, budget=2 * S)
        spec = build_loss_spec(config)
        policy = MegatronPolicy(policy_plan(config, ParallelDims(1, 1, 1, 1, False)))
        try:
            device = str(next(policy._gpt.parameters()).device)
            lp_packed, _ = policy.logprobs(batch, compute_entropy=True)
            packed_ctx = policy.ctx
            policy.ctx = dataclasses.replace(packed_ctx, max_tokens_per_microbatch=None)
            lp_padded, _ = policy.logprobs(batch, compute_entropy=True)
            policy.ctx = packed_ctx
            before = {k: v.detach().double().cpu() for k, v in policy.export_weights()}
            metrics = policy.train_step(batch)
            after = {k: v.detach().double().cpu() for k, v in policy.export_weights()}
        finally:
            policy.shutdown()

        # The float64 reference loss and gradients on the HF model.
        lp64 = _hf_logprobs(model, input_ids)
        norm = loss_denominator(
            loss_mask, spec.loss_agg_mode, loss_scale_length=spec.loss_scale_length
        )
        out = pg_loss(
            LossInputs(lp64, old.double(), advantages.double(), loss_mask, normalizer=norm),
            spec,
            impl="torch",
        )
        out.loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert all(g is not None for g in grads.values())

    valid = torch.arange(S)[None, :] < lengths[:, None]
    valid[:, 0] = False
    packed_err = (lp_packed.double().cpu() - ref_lp).abs()[valid].max().item()
    padded_err = (lp_padded.double().cpu() - ref_lp).abs()[valid].max().item()
    grad_err = max(
        (after[name] - before[name] + grad).abs().max().item()
        for name, grad in grads.items()
        if name in before
    )
    compared = sum(name in before for name in grads)
    figures = {
        "device": device,
        "max_abs_lp_packed_vs_hf64": packed_err,
        "max_abs_lp_padded_vs_hf64": padded_err,
        "loss": metrics["loss"],
        "loss_hf64": out.loss.item(),
        "abs_loss_err": abs(metrics["loss"] - out.loss.item()),
        "max_abs_grad_err": grad_err,
        "tensors_compared": compared,
    }
    # fp32 on the device against float64: accumulation order only, unless a library turned
    # on TF32 matmuls (10-bit mantissa), which the figures then record.
    tf32 = bool(torch.cuda.is_available() and torch.backends.cuda.matmul.allow_tf32)
    figures["tf32_matmul"] = tf32
    tol = 5e-3 if tf32 else 1e-4
    assert compared >= len(grads) - 1, (compared, sorted(grads))  # tied lm_head is one tensor
    assert packed_err <= tol and padded_err <= tol, figures
    assert figures["abs_loss_err"] <= tol and grad_err <= tol, figures
    return figures
