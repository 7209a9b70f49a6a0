"""Packed micro-batches (policy.max_tokens_per_microbatch) against the HF float64 reference.

The same tiny Qwen2, batch and one-step SGD check as test_policy_step.py, with each row cut
to its real length and packed to a token budget: logprobs, entropies, the loss and every
gradient must equal the unpacked reference at every layout (packing moves tokens, it does
not change what is computed). Rows are dealt to DP ranks by tokens, as the controller does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from launch import run_distributed
from test_policy_step import B, S, _batch, _config, _hf_model, _reference

from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.run_plan import build_loss_spec
from dapo_megatron.data.pack_plan import balance_by_tokens
from dapo_megatron.shared.batch import PolicyBatch

pytestmark = pytest.mark.distributed

ATOL = 1e-5  # against the float64 reference (as test_policy_step.py)
SAME = 1e-6  # packed vs padded, both fp32
# Real length of row b: its loss mask ends at S - b % 4 (test_policy_step._batch); the
# tokens after it are noise that packing drops and causal attention never lets through.
LENGTHS = [S - b % 4 for b in range(B)]


def _packed_config(hf_dir: Path, dims: ParallelDims, budget: int):
    config = _config(hf_dir, dims, 8)
    config.policy.max_tokens_per_microbatch = budget
    return config


def _worker(hf_dir: Path, dims: ParallelDims, budget: int, batch: PolicyBatch) -> dict:
    from megatron.core import parallel_state

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    policy = MegatronPolicy(policy_plan(_packed_config(hf_dir, dims, budget), dims))
    dp_rank = parallel_state.get_data_parallel_rank()
    rows = balance_by_tokens(LENGTHS, dims.dp)[dp_rank]
    shard = batch.select(torch.tensor(rows))
    lp, ent = policy.logprobs(shard, compute_entropy=True)
    # The padded path on the same weights (a packed model also runs padded batches).
    packed_ctx = policy.ctx
    policy.ctx = dataclasses.replace(packed_ctx, max_tokens_per_microbatch=None)
    lp_pad, ent_pad = policy.logprobs(shard, compute_entropy=True)
    policy.ctx = packed_ctx
    before = dict(policy.export_weights())
    metrics = policy.train_step(shard)
    after = dict(policy.export_weights())
    policy.shutdown()
    return {
        "rows": rows,
        "lp": lp,
        "ent": ent,
        "lp_pad": lp_pad,
        "ent_pad": ent_pad,
        "metrics": metrics,
        "delta": {k: after[k] - before[k] for k in before},
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    hf_dir = tmp_path_factory.mktemp("packed") / "qwen2"
    model = _hf_model(hf_dir)
    batch = _batch(model)
    batch.lengths = torch.tensor(LENGTHS)
    spec = build_loss_spec(_config(hf_dir, ParallelDims(1, 1, 1, 1, False), 8))
    return hf_dir, batch, _reference(hf_dir, batch, spec)


LAYOUTS = {
    # name: (dims, token budget). 24 tokens: two rows of 9-12 per pack, several packs.
    "tp1": (ParallelDims(1, 1, 1, 1, False), 24),
    "dp2": (ParallelDims(1, 1, 1, 2, False), 24),
    "tp2-sp": (ParallelDims(2, 1, 1, 1, True), 24),
    "pp2": (ParallelDims(1, 2, 1, 1, False), 24),
    "cp2": (ParallelDims(1, 1, 2, 1, False), 24),
    "tp2xcp2": (ParallelDims(2, 1, 2, 1, False), 24),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_packed_steps_match_hf_reference(layout, setup):
    hf_dir, batch, ref = setup
    dims, budget = LAYOUTS[layout]
    per_rank = run_distributed(_worker, dims.world_size, hf_dir, dims, budget, batch, timeout=300)
    valid = torch.arange(S)[None, :] < torch.tensor(LENGTHS)[:, None]
    for result in per_rank:
        rows = torch.tensor(result["rows"])
        keep = valid[rows]
        lp_diff = (result["lp"].double() - ref["lp"][rows]).abs()[keep].max().item()
        ent_diff = (result["ent"].double() - ref["ent"][rows]).abs()[keep].max().item()
        assert lp_diff <= ATOL and ent_diff <= ATOL, (layout, lp_diff, ent_diff)
        same_lp = (result["lp"] - result["lp_pad"]).abs()[keep].max().item()
        same_ent = (result["ent"] - result["ent_pad"]).abs()[keep].max().item()
        print(
            f"[packed {layout}] max |packed - padded|: logprob {same_lp:.1e}, entropy {same_ent:.1e}"
        )
        assert same_lp <= SAME and same_ent <= SAME, (layout, same_lp, same_ent)
        # Packing outputs nothing for the dropped tokens.
        assert (result["lp"][~keep] == 0).all()
        assert abs(result["metrics"]["loss"] - ref["loss"]) <= ATOL, (layout, result["metrics"])
    worst = {
        name: (per_rank[0]["delta"][name].double() + grad).abs().max().item()
        for name, grad in ref["grads"].items()
        if name in per_rank[0]["delta"]
    }
    print(f"[packed {layout}] max |grad - hf grad| = {max(worst.values()):.2e}")
    assert max(worst.values()) <= ATOL, {n: f"{d:.1e}" for n, d in worst.items() if d > ATOL}
