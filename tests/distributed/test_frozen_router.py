"""policy.moe.freeze_router through the real MegatronPolicy on a tiny Qwen3-MoE: one train
step with SGD at lr 1 changes every weight by minus its gradient (test_qwen3_moe.py's float64
HF reference) except the routers, which keep their checkpoint weights bit for bit."""

from __future__ import annotations

import pytest
import torch
from launch import run_distributed
from test_policy_step import B
from test_qwen3_moe import ATOL, Setup, setups  # noqa: F401  (the module-scoped fixture)

from dapo_megatron.config.parallel import ParallelDims

pytestmark = pytest.mark.distributed

ROUTER = "mlp.gate.weight"  # HF's name of a Qwen3-MoE layer's router


def _worker(setup: Setup, freeze: bool) -> dict[str, torch.Tensor]:
    from test_policy_step import _config

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    dims = ParallelDims(1, 1, 1, 1, False, ep=1)
    config = _config(setup.hf_dir, dims, 2)
    config.policy.moe.freeze_router = freeze
    policy = MegatronPolicy(policy_plan(config, dims))
    before = dict(policy.export_weights())
    policy.train_step(setup.batch.select(slice(0, B)))
    after = dict(policy.export_weights())
    policy.shutdown()
    return {n: after[n] - t for n, t in before.items()}


def test_a_frozen_router_keeps_its_weights_and_the_rest_trains(setups):  # noqa: F811
    setup = setups[True]
    (delta,) = run_distributed(_worker, 1, setup, True, timeout=240)
    grads = setup.ref["grads"]
    routers = [n for n in delta if n.endswith(ROUTER)]
    assert routers and all(torch.count_nonzero(delta[n]) == 0 for n in routers)
    # The router's own gradient is not zero: freezing it is what kept it.
    assert all(grads[n].abs().max() > 0 for n in routers)
    others = {
        n: (delta[n].double() + grads[n]).abs().max().item() for n in delta if n not in routers
    }
    assert max(others.values()) <= ATOL, {n: d for n, d in others.items() if d > ATOL}
    assert any(".experts." in n for n in others)
