"""A run killed with SIGKILL and resumed reaches the same metrics as an uninterrupted run."""

from __future__ import annotations

import os
import signal

import pytest
from tiny_job import (
    actor_pids,
    finish,
    metrics_by_step,
    run_job,
    start_and_wait_for,
    train_command,
)

pytestmark = pytest.mark.functional

COMMON = [
    "dapo.max_num_steps=4",
    "sft_warmup.num_steps=30",
    "checkpointing.save_period=2",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "logger.progress_bar=false",
    "logger.plots=false",
]
# Compared exactly: everything computed from the rollouts and the update, not wall time.
KEYS = (
    "loss",
    "grad_norm",
    "reward/acc",
    "reward/shaped_mean",
    "policy/entropy",
    "dynamic_sampling/keep_rate",
    "dynamic_sampling/num_gen_batches",
    "response_length/mean",
    "clipfrac/upper",
)


# Pre-rollout skipping over a training set small enough that every step revisits its
# prompts: from step 2 on prompts are skipped, so the resumed steps depend on the history
# the checkpoint kept (and on the decision counter).
SKIPPING = [
    "data.arithmetic.num_train=48",
    "dapo.dynamic_sampling.skip_predicted.enabled=true",
    "dapo.dynamic_sampling.skip_predicted.initial_strength=0.8",
]
# The tail cut with partial rollouts: from step 2 on rounds are cut and their aborted
# samples continued by the next round, so a checkpoint holds pending partial groups.
CUTTING = ["rollout.abort_tail=true", "rollout.partial_rollouts=true"]
CUT_KEYS = ("rollout/num_aborted_groups", "num_generated_tokens")
SKIP_KEYS = (
    "dynamic_sampling/num_skipped",
    "dynamic_sampling/num_audited",
    "dynamic_sampling/skip_strength",
    "dynamic_sampling/num_prompts_generated",
)


def _command(run_dir, *extra):
    return train_command(run_dir, run_dir.parent / "model", *COMMON, *extra)


# One run covers both: skipping decides what is drawn, the cut and its continuations what
# is generated of it; both states are in the checkpoint.
VARIANTS = {"plain": ([], ()), "skip_cut": (SKIPPING + CUTTING, SKIP_KEYS + CUT_KEYS)}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, variant):
    extra, more_keys = VARIANTS[variant]
    keys = KEYS + more_keys
    straight = tmp_path / "straight"
    out = run_job(_command(straight, *extra))
    assert out.returncode == 0, out.stderr[-3000:]

    killed = tmp_path / "killed"
    marker = killed / "checkpoints" / "step_000002" / "complete.json"
    proc = start_and_wait_for(_command(killed, *extra), marker, capture=False)
    assert marker.exists(), "the run never wrote its step-2 checkpoint"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Ray workers, mid-run
    proc.wait()
    assert not (killed / "checkpoints" / "step_000004").exists(), "killed too late"
    out = run_job(_command(killed, *extra))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[resume]" in out.stdout

    want, got = metrics_by_step(straight), metrics_by_step(killed)
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]  # no duplicated or lost step
    for step in (3, 4):
        for key in keys:
            assert got[step][key] == want[step][key], (step, key, got[step][key], want[step][key])
    if variant == "skip_cut":
        assert sum(want[s]["dynamic_sampling/num_skipped"] for s in (3, 4)) > 0, "nothing skipped"
        assert sum(want[s]["rollout/num_aborted_groups"] for s in (2, 3)) > 0, "nothing cut"
        continued = [want[s].get("rollout/num_partial_groups_continued", 0) for s in (3, 4)]
        assert sum(continued) > 0, "nothing continued after the resume point"


def test_worker_death_restarts_from_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [*_command(run_dir), "dapo.max_num_steps=6"]
    marker = run_dir / "checkpoints" / "step_000002" / "complete.json"
    proc = start_and_wait_for(cmd, marker, capture=True)
    pids = actor_pids("PolicyWorker", proc.pid)
    assert marker.exists() and pids, "no checkpoint or no worker to kill"
    os.kill(pids[-1], signal.SIGKILL)
    output = finish(proc)
    assert proc.returncode == 0, output[-3000:]
    assert "[restart 1/2] policy rank" in output and "died" in output
    assert "[resume]" in output and "step_000002" in output
    assert sorted(metrics_by_step(run_dir)) == [1, 2, 3, 4, 5, 6]
