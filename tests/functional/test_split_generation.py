"""Split mode end to end: generation engines in Ray actors of their own, refitted each step.

The tiny recipe on 3 CPU "devices": 2 policy ranks (DP2) and 1 Megatron generation engine
with a model of its own, refitted through the handle transport (shared-memory bucket
buffers, the CPU twin of CUDA IPC; the broadcast transport is the default of the
overlapped-rollout tests). The engine starts from the HF checkpoint; the SFT warm-up then
changes the policy a lot, so fresh rollouts agreeing with the trainer's logprobs to fp32
rounding proves that the refits (after warm-up, after every step and after a restart)
delivered the trained weights.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest
from tiny_job import REPO, actor_pids, finish, metrics_by_step, start_and_wait_for, train_command

pytestmark = pytest.mark.functional

SPLIT = [
    "cluster.gpus_per_node=3",
    "cluster.colocated=false",
    "cluster.generation_num_devices=1",
    "generation.backend=megatron",
]


def _refit_files() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("dapo-refit-*")} if shm.is_dir() else set()


def test_split_engines_refit_and_survive_an_engine_death(tmp_path):
    run_dir = tmp_path / "run"
    before = _refit_files()
    cmd = train_command(
        run_dir,
        tmp_path / "model",
        "dapo.max_num_steps=8",
        "sft_warmup.num_steps=40",
        "checkpointing.save_period=2",
        "validation.val_period=0",
        "validation.val_at_start=false",
        "logger.progress_bar=false",
        "logger.plots=false",
        "generation.refit_transport=ipc",
        *SPLIT,
    )
    marker = run_dir / "checkpoints" / "step_000002" / "complete.json"
    proc = start_and_wait_for(cmd, marker, capture=True)
    pids = actor_pids("GenerationWorker", proc.pid)
    assert marker.exists() and len(pids) == 1, "no checkpoint, or not exactly one engine"
    # The engine mapped the policy's buffer at the first refit; from then on the file has
    # no name, so the SIGKILL below (or of any process) cannot leave it behind.
    assert _refit_files() - before == set()
    os.kill(pids[0], signal.SIGKILL)
    output = finish(proc)
    assert proc.returncode == 0, output[-3000:]
    assert "[restart 1/2] generation engine 0 (megatron) died" in output, output[-3000:]
    assert "[resume]" in output
    assert _refit_files() - before == set()
    rows = metrics_by_step(run_dir)
    assert sorted(rows) == list(range(1, 9))
    for step, row in rows.items():
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]), row
        assert row["timing/refit_s"] > 0
        if row["dynamic_sampling/num_carried_in"] == 0:
            # Rollouts of this step come from the engine alone: same weights, same fp32 math.
            assert row["mismatch/token_mult_prob_error"] < 1e-5, (step, row)


def test_split_megatron_engine_must_be_tp1():
    from dapo_megatron.config.errors import ConfigError
    from dapo_megatron.config.loader import load_config

    with pytest.raises(ConfigError, match="generation.engine.tensor_parallel_size.*split mode"):
        load_config(
            REPO / "recipes" / "dapo-tiny-cpu.yaml",
            [
                "cluster.gpus_per_node=4",
                "cluster.colocated=false",
                "cluster.generation_num_devices=2",
                "generation.backend=megatron",
                "generation.engine.tensor_parallel_size=2",
            ],
        )


def test_colocated_vllm_on_cpu_is_refused_before_anything_starts():
    from dapo_megatron.config.errors import ConfigError
    from dapo_megatron.config.loader import load_config

    with pytest.raises(ConfigError, match="generation.backend.*colocated"):
        load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", ["generation.backend=vllm"])
