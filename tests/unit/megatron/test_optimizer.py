"""policy.scheduler.unit: the lr schedule counted in optimizer steps or in trainer steps.

Reference: verl's and NeMo RL's workers step their scheduler once per training call, after
all of the trainer step's mini-batches, so each mini-batch of trainer step t trains at the
schedule's lr(t). Written here as a float64 formula of a linear warm-up from 0."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from dapo_megatron.config.schema_policy import OptimizerConfig, SchedulerConfig  # noqa: E402
from dapo_megatron.megatron.optimizer import ScheduleClock, build_scheduler  # noqa: E402

LR = 1.0e-6


def _lrs(unit: str, warmup: int, k: int, trainer_steps: int) -> list[float]:
    """Our lr at each optimizer step, the scheduler advanced as MegatronPolicy.train_step
    and megatron/optimizer.py optimizer_step do (increment 1 when the clock ticks, else 0)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    o = OptimizerConfig("adam", LR, 0.0, 0.0, 0.9, 0.999, 1e-8, 1.0)
    s = SchedulerConfig(warmup, 0.0, "constant", None, unit)
    sched = build_scheduler(
        opt, o, s, total_optimizer_steps=trainer_steps * k, optimizer_steps_per_train_step=k
    )
    clock = ScheduleClock(unit, k)
    out = []
    for _ in range(trainer_steps * k):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step(increment=1 if clock.tick() else 0)
    return out


def _reference(warmup: int, k: int, trainer_steps: int, per_trainer_step: bool) -> list[float]:
    lrs = []
    for t in range(trainer_steps):
        for i in range(k):
            n = t if per_trainer_step else t * k + i
            lrs.append(LR * min(1.0, n / warmup))
    return lrs


@pytest.mark.parametrize("warmup,k", [(10, 16), (3, 4), (2, 1)])
def test_train_step_unit_holds_the_lr_over_a_trainer_steps_mini_batches(warmup, k):
    steps = warmup + 3
    got = _lrs("train_step", warmup, k, steps)
    assert got == pytest.approx(_reference(warmup, k, steps, per_trainer_step=True), rel=1e-12)
    # Each trainer step: one lr for all its k mini-batches, rising until the warm-up ends.
    per_step = [got[t * k : (t + 1) * k] for t in range(steps)]
    assert all(len(set(chunk)) == 1 for chunk in per_step)
    assert per_step[1][0] > per_step[0][0] and per_step[warmup][0] == pytest.approx(LR)


def test_optimizer_step_unit_ramps_at_every_optimizer_step():
    got = _lrs("optimizer_step", 8, 4, 3)
    assert got == pytest.approx(_reference(8, 4, 3, per_trainer_step=False), rel=1e-12)
    assert len(set(got[:4])) == 4


def test_train_step_decay_horizon_counts_trainer_steps():
    """lr_decay_steps null: the run's total steps in the schedule's unit (here 5 trainer
    steps of 4 optimizer steps, linear decay to 0 after no warm-up)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    o = OptimizerConfig("adam", LR, 0.0, 0.0, 0.9, 0.999, 1e-8, 1.0)
    s = SchedulerConfig(0, 0.0, "linear", None, "train_step")
    sched = build_scheduler(opt, o, s, total_optimizer_steps=20, optimizer_steps_per_train_step=4)
    assert sched.lr_decay_steps == 5
