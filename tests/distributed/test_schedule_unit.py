"""policy.scheduler.unit through the real MegatronPolicy: the lr each optimizer step trains
at (its `lr` metric) over two trainer steps of k = 4 optimizer steps each, against the
hand-derived schedule of a linear warm-up from 0 over 2 schedule steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import run_distributed
from test_policy_step import _batch, _config, _hf_model

from dapo_megatron.config.parallel import ParallelDims

pytestmark = pytest.mark.distributed

LR, WARMUP, K, TRAINER_STEPS = 0.5, 2, 4, 2


def _worker(hf_dir: Path, unit: str, batch) -> list[float]:
    import dataclasses

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    dims = ParallelDims(1, 1, 1, 1, False)
    config = _config(hf_dir, dims, 8)
    policy_cfg = dataclasses.replace(
        config.policy,
        optimizer=dataclasses.replace(config.policy.optimizer, lr=LR),
        scheduler=dataclasses.replace(
            config.policy.scheduler, lr_warmup_steps=WARMUP, lr_warmup_init=0.0, unit=unit
        ),
        # One trainer step (num_prompts x n samples) is K optimizer steps.
        train_global_batch_size=config.dapo.num_prompts_per_step
        * config.dapo.num_generations_per_prompt
        // K,
    )
    plan = policy_plan(dataclasses.replace(config, policy=policy_cfg), dims)
    assert plan.optimizer_steps_per_train_step == K
    policy = MegatronPolicy(plan)
    lrs = [policy.train_step(batch)["lr"] for _ in range(K * TRAINER_STEPS)]
    policy.shutdown()
    return lrs


@pytest.fixture(scope="module")
def hf_batch(tmp_path_factory):
    hf_dir = tmp_path_factory.mktemp("schedule") / "qwen2"
    return hf_dir, _batch(_hf_model(hf_dir))


@pytest.mark.parametrize("unit", ["optimizer_step", "train_step"])
def test_lr_of_each_optimizer_step(hf_batch, unit):
    hf_dir, batch = hf_batch
    (lrs,) = run_distributed(_worker, 1, hf_dir, unit, batch, timeout=240)
    if unit == "train_step":  # verl / NeMo RL: lr(t) for all K mini-batches of trainer step t
        expected = [LR * min(1.0, t / WARMUP) for t in range(TRAINER_STEPS) for _ in range(K)]
    else:
        expected = [LR * min(1.0, i / WARMUP) for i in range(K * TRAINER_STEPS)]
    assert lrs == pytest.approx(expected, abs=1e-12), lrs
