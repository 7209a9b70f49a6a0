"""End to end with the KL penalty (dapo.loss.kl_coef > 0): the tiny recipe through Ray.

The reference is the policy at the start of DAPO training (after the SFT warm-up), so the
KL is 0 at step 1 (before the first update) and grows as the policy moves away; a run
stopped after step 2 and resumed must keep that reference (its step 3 equals the
uninterrupted run's, not a KL reset to 0).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tiny_job import metrics_by_step, run_job, train_command

pytestmark = pytest.mark.functional

COMMON = [
    "dapo.loss.kl_coef=0.05",
    "sft_warmup.num_steps=40",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "checkpointing.save_period=2",
    # No warm-up (its first step has lr 0: the policy would not move at step 1); a fixed
    # lr horizon: a 2-step run then resumed to 3 follows the 3-step run's schedule.
    "policy.scheduler.lr_warmup_steps=0",
    "policy.scheduler.lr_decay_steps=10",
    "logger.progress_bar=false",
    "logger.plots=false",
]


def _train(run_dir: Path, steps: int) -> subprocess.CompletedProcess:
    cmd = train_command(run_dir, run_dir.parent / "model", *COMMON, f"dapo.max_num_steps={steps}")
    out = run_job(cmd)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[int, dict]:
    run_dir = tmp_path_factory.mktemp("kl") / "straight"
    _train(run_dir, 3)
    return metrics_by_step(run_dir)


def test_kl_is_zero_at_the_start_and_grows(straight):
    assert [s for s in sorted(straight) if s > 0] == [1, 2, 3]
    kl = [straight[s]["kl/ref_kl"] for s in (1, 2, 3)]
    assert abs(kl[0]) < 1e-6, kl  # the first update starts from the reference itself
    assert 0 < kl[1] < kl[2], kl
    assert all(straight[s]["timing/ref_logprob_s"] > 0 for s in (1, 2, 3))


def test_resume_keeps_the_start_of_training_reference(straight, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("kl") / "resumed"
    _train(run_dir, 2)
    out = _train(run_dir, 3)
    assert "[resume]" in out.stdout and "step_000002" in out.stdout
    resumed = metrics_by_step(run_dir)
    assert sorted(resumed) == sorted(straight)
    for key in ("kl/ref_kl", "loss", "grad_norm", "reward/acc"):
        assert resumed[3][key] == straight[3][key], (key, resumed[3][key], straight[3][key])
