"""The frozen KL reference (dapo.loss.kl_coef > 0) of MegatronPolicy.

A tiny random Qwen2 takes one SFT step (the warm-up: the reference must be what comes
AFTER it), then two DAPO steps with the KL penalty. The reference's logprobs must stay the
policy's logprobs from before the first DAPO update while the policy's own change, and a
checkpoint must bring the same reference back (also into another layout), not the resumed
weights nor the HF checkpoint the run started from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
from launch import run_distributed

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.shared.batch import PolicyBatch

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
B, S, VOCAB = 8, 12, 90
DP2 = ParallelDims(1, 1, 1, 2, False)
TP2 = ParallelDims(2, 1, 1, 1, False)
PP2 = ParallelDims(1, 2, 1, 1, False)


def _hf_model(hf_dir: Path) -> None:
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(hf_dir)


def _batch() -> PolicyBatch:
    gen = torch.Generator().manual_seed(1)
    mask = torch.zeros(B, S)
    for b in range(B):
        mask[b, 2 + b % 3 : S - b % 4] = 1.0
    return PolicyBatch(
        input_ids=torch.randint(0, VOCAB, (B, S), generator=gen),
        loss_mask=mask,
        advantages=torch.randn(B, generator=gen),
    )


def _config(hf_dir: Path):
    overrides = [
        f"policy.model_name_or_path={hf_dir}",
        "policy.model_arch=null",
        "policy.init_model_if_missing=false",
        "policy.precision=fp32",
        "policy.optimizer.name=adam",
        "policy.optimizer.lr=0.01",
        "policy.optimizer.min_lr=0.0",
        "policy.optimizer.weight_decay=0.0",
        "policy.optimizer.clip_grad=0.0",
        "policy.scheduler.lr_warmup_steps=0",
        "policy.scheduler.lr_decay_style=constant",
        "policy.train_micro_batch_size=2",
        "policy.logprob_micro_batch_size=3",
        "policy.megatron.use_distributed_optimizer=false",
        "dapo.loss.kl_coef=0.05",
    ]
    return load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", overrides, validate=False).config


def _train_worker(hf_dir: Path, ckpt_dir: Path, dims: ParallelDims, batch: PolicyBatch) -> dict:
    """SFT step, then two DAPO steps with the KL penalty; saves a checkpoint."""
    from megatron.core import parallel_state

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    policy = MegatronPolicy(policy_plan(_config(hf_dir), dims))
    dp_rank = parallel_state.get_data_parallel_rank()
    rows = slice(dp_rank * B // dims.dp, (dp_rank + 1) * B // dims.dp)
    shard = batch.select(rows)
    hf_lp, _ = policy.logprobs(batch)  # logprobs are forward-only: every rank takes all rows
    policy.sft_step(shard)  # the "warm-up": the reference is taken after it
    start_lp, _ = policy.logprobs(batch)
    kl = []
    for _ in range(2):
        ref = policy.ref_logprobs(batch)
        shard_with_ref = dataclasses.replace(shard, ref_logprobs=ref[rows])
        kl.append(policy.train_step(shard_with_ref)["kl/ref_kl"])
    end_lp, _ = policy.logprobs(batch)
    end_ref = policy.ref_logprobs(batch)
    policy.save(ckpt_dir, step=2, extra_state={})
    policy.shutdown()
    return {
        "hf_lp": hf_lp,
        "start_lp": start_lp,
        "first_ref": ref,
        "end_lp": end_lp,
        "end_ref": end_ref,
        "kl": kl,
    }


def _resume_worker(hf_dir: Path, ckpt_dir: Path, dims: ParallelDims, batch: PolicyBatch) -> dict:
    """A fresh policy (from the HF checkpoint) resumed from the saved checkpoint."""
    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    policy = MegatronPolicy(policy_plan(_config(hf_dir), dims))
    policy.load(ckpt_dir / "step_000002")
    lp, _ = policy.logprobs(batch)
    ref = policy.ref_logprobs(batch)
    policy.shutdown()
    return {"resumed_lp": lp, "resumed_ref": ref}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("reference") / "qwen2"
    _hf_model(path)
    return path


@pytest.mark.parametrize(
    ("train_dims", "load_dims"),
    [(DP2, DP2), (TP2, TP2), (DP2, TP2), (PP2, PP2)],
    ids=["dp2", "tp2", "dp2-to-tp2", "pp2"],
)
def test_reference_stays_the_start_of_training_policy(hf_dir, tmp_path, train_dims, load_dims):
    batch = _batch()
    mask = batch.loss_mask > 0
    same_layout = train_dims == load_dims
    ckpt = tmp_path / "ckpt"
    trained = run_distributed(_train_worker, 2, hf_dir, ckpt, train_dims, batch, timeout=300)
    resumed = run_distributed(_resume_worker, 2, hf_dir, ckpt, load_dims, batch, timeout=300)
    for a, b in zip(trained, resumed, strict=True):
        r = {**a, **b}

        def diff(a, b):
            return (a - b)[mask].abs().max().item()

        assert diff(r["start_lp"], r["hf_lp"]) > 1e-3  # the warm-up moved the policy
        # Taken before the first DAPO update: the same forward on the same weights.
        assert diff(r["first_ref"], r["start_lp"]) <= 1e-6
        assert r["kl"][0] <= 1e-6 < r["kl"][1], r["kl"]
        assert diff(r["end_lp"], r["start_lp"]) > 1e-3  # the policy trained ...
        assert diff(r["end_ref"], r["start_lp"]) <= 1e-6  # ... its reference did not
        # The checkpoint brings back the trained weights AND the start-of-training reference
        # (bit-exact at the same layout; another TP layout rounds differently).
        tol = 0.0 if same_layout else 1e-5
        assert diff(r["resumed_lp"], r["end_lp"]) <= tol
        assert diff(r["resumed_ref"], r["end_ref"]) <= tol
