"""The policy's logprob pass, DAPO train step and SFT step against an HF float64 reference.

A tiny random Qwen2 (tied embeddings, qkv bias) is trained for ONE step with plain SGD
(lr 1, no weight decay, no clipping, momentum buffer = grad on the first step), so the
change of every exported HF tensor is exactly minus its gradient. That gradient must equal
the gradient of the same DAPO loss computed independently on the HF model in float64, at
every layout and micro-batch count (token-mean over the GLOBAL valid-token count).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
from launch import run_distributed

from dapo_megatron.algorithms.loss import loss_denominator, torch_policy_loss
from dapo_megatron.algorithms.loss_inputs import LossInputs
from dapo_megatron.algorithms.loss_spec import LossSpec
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.run_plan import build_loss_spec
from dapo_megatron.shared.batch import PolicyBatch

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
B, S, VOCAB, TEMPERATURE = 8, 12, 90, 0.9
ATOL = 1e-5


def _hf_model(hf_dir: Path) -> transformers.PreTrainedModel:
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(
                1.0 + 0.2 * torch.randn_like(param)
                if name.endswith("norm.weight")
                else 0.1 * torch.randn_like(param)
            )
    model.save_pretrained(hf_dir)
    return model


def _batch(model: transformers.PreTrainedModel) -> PolicyBatch:
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (B, S), generator=gen)
    loss_mask = torch.zeros(B, S)
    for b in range(B):
        prompt = 2 + b % 3
        end = S - b % 4
        loss_mask[b, prompt:end] = 1.0
    loss_mask[5] = 0.0  # an overlong-filtered sample: no valid token
    with torch.no_grad():
        lp = _hf_logprobs(model.double(), input_ids)[0].float()
    model.float()
    old = lp + 0.3 * torch.randn(B, S, generator=gen)  # ratios away from 1: some clipping
    advantages = torch.randn(B, generator=gen)
    return PolicyBatch(
        input_ids=input_ids,
        loss_mask=loss_mask,
        advantages=advantages,
        old_logprobs=old * (loss_mask > 0),
    )


def _hf_logprobs(model, input_ids):
    """Token-aligned logprobs and entropies of the HF model (position 0 is 0)."""
    logits = model(input_ids).logits[:, :-1] / TEMPERATURE
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    zero = torch.zeros(input_ids.shape[0], 1, dtype=lp.dtype)
    return torch.cat([zero, lp], 1), torch.cat([zero, ent], 1)


def _reference(hf_dir: Path, batch: PolicyBatch, spec: LossSpec) -> dict:
    """Float64 DAPO loss and gradients on the HF model, whole batch at once."""
    # Auto: test_qwen3.py reuses this reference for a Qwen3 checkpoint.
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    model = model.double()
    lp, ent = _hf_logprobs(model, batch.input_ids)
    normalizer = loss_denominator(
        batch.loss_mask, spec.loss_agg_mode, loss_scale_length=spec.loss_scale_length
    )
    out = torch_policy_loss(
        LossInputs(
            lp,
            batch.old_logprobs.double(),
            batch.advantages.double(),
            batch.loss_mask,
            normalizer=normalizer,
        ),
        spec,
    )
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return {
        "loss": out.loss.item(),
        "grads": grads,
        "lp": lp.detach(),
        "ent": ent.detach(),
        "clipfrac": out.metrics,
    }


def _config(hf_dir: Path, dims: ParallelDims, micro: int, recompute: str = "none"):
    overrides = [
        f"policy.megatron.recompute_granularity={recompute}",
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
        f"policy.train_micro_batch_size={micro}",
        "policy.logprob_micro_batch_size=3",
        "policy.max_tokens_per_microbatch=null",  # padded micro-batches (packed: test_packed_*)
        f"generation.temperature={TEMPERATURE}",
        "policy.megatron.use_distributed_optimizer=false",
    ]
    return load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", overrides, validate=False).config


def _worker(
    hf_dir: Path, dims: ParallelDims, micro: int, batch: PolicyBatch, recompute: str
) -> dict:
    from megatron.core import parallel_state

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    policy = MegatronPolicy(policy_plan(_config(hf_dir, dims, micro, recompute), dims))
    dp_rank, dp = parallel_state.get_data_parallel_rank(), dims.dp
    shard = batch.select(slice(dp_rank * B // dp, (dp_rank + 1) * B // dp))
    lp, ent = policy.logprobs(shard, compute_entropy=True)
    before = dict(policy.export_weights())
    metrics = policy.train_step(shard)
    after = dict(policy.export_weights())
    sft = policy.sft_step(shard)
    nan_batch = dataclasses.replace(
        shard, advantages=torch.full_like(shard.advantages, float("nan"))
    )
    pre_nan = dict(policy.export_weights())
    nan_metrics = policy.train_step(nan_batch)
    post_nan = dict(policy.export_weights())
    policy.shutdown()
    return {
        "recompute": policy._gpt.config.recompute_granularity,
        "dp_rank": dp_rank,
        "lp": lp,
        "ent": ent,
        "metrics": metrics,
        "sft": sft,
        "delta": {k: after[k] - before[k] for k in before},
        "after": after,
        "nan_skipped": nan_metrics["skipped_nonfinite_step"],
        "nan_unchanged": all(torch.equal(pre_nan[k], post_nan[k]) for k in pre_nan),
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    hf_dir = tmp_path_factory.mktemp("policy") / "qwen2"
    model = _hf_model(hf_dir)
    batch = _batch(model)
    spec = build_loss_spec(_config(hf_dir, ParallelDims(1, 1, 1, 1, False), 8))
    return hf_dir, batch, _reference(hf_dir, batch, spec)


LAYOUTS = {
    # name: (dims, micro-batch size per DP rank, activation recompute)
    "tp1-1micro": (ParallelDims(1, 1, 1, 1, False), 8, "none"),
    "tp1-4micro": (ParallelDims(1, 1, 1, 1, False), 2, "none"),
    "dp2-4micro": (ParallelDims(1, 1, 1, 2, False), 1, "none"),
    "tp2": (ParallelDims(2, 1, 1, 1, False), 4, "none"),
    "tp2-sp": (ParallelDims(2, 1, 1, 1, True), 4, "none"),
    "pp2": (ParallelDims(1, 2, 1, 1, False), 2, "none"),
    "tp2xpp2": (ParallelDims(2, 2, 1, 1, False), 4, "none"),
    "cp2": (ParallelDims(1, 1, 2, 1, False), 4, "none"),
    # Recompute must not change a single gradient (it re-runs the same forward).
    "tp1-selective-recompute": (ParallelDims(1, 1, 1, 1, False), 2, "selective"),
    "tp2-sp-full-recompute": (ParallelDims(2, 1, 1, 1, True), 4, "full"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_policy_steps_match_hf_reference(layout, setup):
    hf_dir, batch, ref = setup
    dims, micro, recompute = LAYOUTS[layout]
    per_rank = run_distributed(
        _worker, dims.world_size, hf_dir, dims, micro, batch, recompute, timeout=300
    )
    per_dp = dims.world_size // dims.dp
    assert per_rank[0]["recompute"] == (None if recompute == "none" else recompute)
    for result in per_rank:
        rows = slice(result["dp_rank"] * B // dims.dp, (result["dp_rank"] + 1) * B // dims.dp)
        lp_diff = (result["lp"].double() - ref["lp"][rows]).abs().max().item()
        ent_diff = (result["ent"].double() - ref["ent"][rows]).abs().max().item()
        assert lp_diff <= ATOL and ent_diff <= ATOL, (layout, lp_diff, ent_diff)
        # Every rank reports the same mini-batch loss: the reference's, whatever the layout.
        assert abs(result["metrics"]["loss"] - ref["loss"]) <= ATOL, (layout, result["metrics"])
        assert result["nan_skipped"] == 1.0 and result["nan_unchanged"]
    worst = {
        name: (per_rank[0]["delta"][name].double() + grad).abs().max().item()
        for name, grad in ref["grads"].items()
        if name in per_rank[0]["delta"]
    }
    grad_diff = max(worst.values())
    print(
        f"[{layout}] max |grad - hf grad| = {grad_diff:.2e}, loss {per_rank[0]['metrics']['loss']:.6f}"
        f" vs {ref['loss']:.6f}, ranks per DP replica {per_dp}"
    )
    bad = {n: f"{d:.1e}" for n, d in worst.items() if d > ATOL}
    assert grad_diff <= ATOL, f"{layout}: gradient differs from the HF reference: {bad}"
    assert set(per_rank[0]["delta"]) <= set(ref["grads"])

    # SFT: the NLL of the masked tokens at the post-step weights, against HF with those weights.
    model = transformers.Qwen2ForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    model.load_state_dict(per_rank[0]["after"], strict=False)
    lp, _ = _hf_logprobs(model.double(), batch.input_ids)
    nll = -(lp * batch.loss_mask).sum() / batch.loss_mask.sum()
    assert abs(per_rank[0]["sft"]["sft/nll"] - nll.item()) <= ATOL


# ---------------------------------------------------------------------------------------
# One update per rollout batch: the training forward supplies the old logprobs


def _reuse_worker(
    hf_dir: Path, dims: ParallelDims, micro: int, batch: PolicyBatch, separate_pass: bool
) -> dict:
    """One train step on a batch without old logprobs (the controller skipped the pass), or
    with them from the separate forward-only pass (what the controller did before)."""
    from megatron.core import parallel_state

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    policy = MegatronPolicy(policy_plan(_config(hf_dir, dims, micro), dims))
    dp_rank, dp = parallel_state.get_data_parallel_rank(), dims.dp
    shard = batch.select(slice(dp_rank * B // dp, (dp_rank + 1) * B // dp))
    lp = None
    if separate_pass:
        lp, _ = policy.logprobs(shard)
        shard = dataclasses.replace(shard, old_logprobs=lp)
    before = dict(policy.export_weights())
    metrics = policy.train_step(shard)
    after = dict(policy.export_weights())
    policy.shutdown()
    return {
        "dp_rank": dp_rank,
        "lp": lp,
        "metrics": metrics,
        "delta": {k: after[k] - before[k] for k in before},
    }


@pytest.mark.parametrize("layout", ["tp1-4micro", "dp2-4micro", "tp2"])
def test_skipped_old_logprob_pass_is_exact(layout, setup):
    """Without old logprobs, train_step gives the loss, gradients and mismatch metrics of the
    separate pass + train step, and both match the float64 HF reference at ratio 1."""
    from dapo_megatron.algorithms.rollout_correction import MISMATCH_METRIC_KEYS, mismatch_metrics

    hf_dir, batch, ref = setup
    gen = torch.Generator().manual_seed(7)
    rollout = (ref["lp"].float() + 0.05 * torch.randn(B, S, generator=gen)) * batch.loss_mask
    batch = dataclasses.replace(batch, old_logprobs=None, rollout_logprobs=rollout)
    dims, micro, _ = LAYOUTS[layout]
    skipped = run_distributed(
        _reuse_worker, dims.world_size, hf_dir, dims, micro, batch, False, timeout=300
    )
    separate = run_distributed(
        _reuse_worker, dims.world_size, hf_dir, dims, micro, batch, True, timeout=300
    )
    # The independent reference: float64 HF loss with old = its own (detached) logprobs.
    spec = build_loss_spec(_config(hf_dir, ParallelDims(1, 1, 1, 1, False), 8))
    ratio_one = _reference(hf_dir, dataclasses.replace(batch, old_logprobs=ref["lp"].float()), spec)
    a, b = skipped[0], separate[0]
    assert abs(a["metrics"]["loss"] - b["metrics"]["loss"]) <= 1e-6
    assert abs(a["metrics"]["loss"] - ratio_one["loss"]) <= ATOL
    assert a["metrics"]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-7)
    for name, grad in ratio_one["grads"].items():
        if name in a["delta"]:
            assert (a["delta"][name] - b["delta"][name]).abs().max() <= 1e-6, name
            assert (a["delta"][name].double() + grad).abs().max() <= ATOL, name
    # Mismatch metrics: what the controller computed from the separate pass's logprobs.
    leaders = sorted({r["dp_rank"]: r for r in separate}.items())
    lp = torch.cat([r["lp"] for _, r in leaders])
    expected = mismatch_metrics(lp, rollout, batch.loss_mask)
    assert expected["mismatch/abs_logprob_diff_mean"] > 0.01  # the check can fail
    for key in MISMATCH_METRIC_KEYS:
        assert a["metrics"][key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
        assert key not in b["metrics"]  # with old logprobs given, the controller reports them
