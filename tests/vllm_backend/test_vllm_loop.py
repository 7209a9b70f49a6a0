"""The production rollout path end to end on CPU: DAPO steps with vLLM engines in split mode,
refitted after every step through the collective transfer (gloo here, NCCL on GPU: the same
code), in the one environment that holds vLLM and the package (.venv-vllm).

The tiny recipe's vLLM variant (recipes/dapo-tiny-cpu-vllm.yaml: head size 32, policy TP2).
The SFT warm-up moves the policy far from the checkpoint the engines started from, so fresh
rollouts whose engine logprobs equal the trainer's (fp32 rounding) after every step prove
each refit delivered the trained weights; surplus groups are discarded so that every
trained sample comes from the engine right after the last refit. The engines' own counters
(reported with each refit) show the weights never came through Ray's object store.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_job import REPO, job_env, metrics_by_step

pytestmark = pytest.mark.functional

VLLM_RECIPE = REPO / "recipes" / "dapo-tiny-cpu-vllm.yaml"
STEPS = 4


def _run(run_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> str:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config",
        str(VLLM_RECIPE),
        f"run.output_dir={run_dir}",
        f"policy.model_name_or_path={run_dir.parent / 'model'}",
        f"dapo.max_num_steps={STEPS}",
        "sft_warmup.num_steps=120",
        "dapo.dynamic_sampling.surplus=discard",
        "dapo.dynamic_sampling.max_gen_batches=0",
        "checkpointing.save_period=1",
        "validation.val_period=0",
        "validation.val_at_start=false",
        "logger.progress_bar=false",
        "logger.plots=false",
        *overrides,
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env={**job_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


def _check_refits(run_dir: Path) -> None:
    rows = metrics_by_step(run_dir)
    assert sorted(rows) == list(range(1, STEPS + 1)), "every step logged exactly once"
    for step, row in rows.items():
        assert math.isfinite(row["loss"]), row
        assert row["dynamic_sampling/num_carried_in"] == 0
        # Fresh rollouts of the refitted engines score like the trainer (fp32 rounding).
        assert row["mismatch/abs_logprob_diff_max"] < 1e-3, (step, row)
        assert row["mismatch/token_mult_prob_error"] < 1e-4, (step, row)
        # Every engine worker received every byte through the weight group, never through
        # the object store.
        assert row["refit/engine_object_store_loads"] == 0, (step, row)
        assert row["refit/engine_collective_loads"] > 0
        assert row["refit/engine_bytes_received"] > 0


def test_engine_tp2_loop_through_collective_refit_survives_a_death_mid_refit(tmp_path):
    """Engine TP2 (both vLLM workers in the weight group); one vLLM worker process exits in
    the middle of the 3rd refit (after step 2, before step 2's checkpoint is written): the
    run restarts from the step-1 checkpoint, redoes step 2 and finishes."""
    run_dir = tmp_path / "run"
    marker = tmp_path / "fault-fired"
    output = _run(run_dir, env={"DAPO_FAULT_EXIT_IN_REFIT": f"3:{marker}"})
    assert marker.exists(), "the fault hook never fired"
    # The restart line blames the death, not the collective error it caused in the
    # survivors: either the dead engine itself or, when a survivor's error came first,
    # the refit member whose death explains it.
    restart = re.search(r"\[restart 1/2\] (.*)", output)
    assert restart, output[-4000:]
    line = restart.group(1)
    assert "generation engine 0 (vllm) died" in line or "a refit member died" in line, line
    assert "restarting from the last checkpoint" in line, line
    assert "[resume]" in output
    _check_refits(run_dir)
    # Refits per engine: after the warm-up and after step 1 (row 1: 2); the one after step 2
    # died, so step 2 was redone by new engines: the resume refit and step 2's (row 2: 2).
    rows = metrics_by_step(run_dir)
    assert [rows[s]["refit/engine_collective_loads"] for s in (1, 2, 3, 4)] == [2, 2, 3, 4]


def test_two_tp1_engines_loop_through_collective_refit(tmp_path):
    run_dir = tmp_path / "run"
    _run(
        run_dir,
        "generation.engine.tensor_parallel_size=1",
        "generation.engine.num_engines=2",
        "policy.megatron.tensor_model_parallel_size=1",
    )
    _check_refits(run_dir)
    rows = metrics_by_step(run_dir)
    # One refit after the warm-up, then one per step, each into both engines.
    assert rows[STEPS]["refit/engine_collective_loads"] == 2 * (STEPS + 1)


def test_engine_tp2_loop_through_shared_memory_handles(tmp_path):
    """The handle transport (CUDA IPC on GPU) through its CPU twin: both policy ranks share a
    bucket buffer with the engine worker paired with them (shared-memory files)."""
    run_dir = tmp_path / "run"
    _run(run_dir, "generation.refit_transport=ipc")
    _check_refits(run_dir)
