"""End to end: dapo.max_num_epochs ends a tiny CPU run after its passes over the data, and a
resumed run stops at the same step (controller/loop.py, data/sampler.py epochs_exhausted)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tiny_job import run_job, train_command

pytestmark = pytest.mark.functional

# 7 training prompts, 4 per step, no dynamic sampling, 2 passes: 14 prompts. Steps draw
# prompts 0-3, 4-6 + 0 (the passes run into each other), 1-4; the 2 left (5, 6) are fewer
# than a step: dropped. floor(2 x 7 / 4) = 3 steps.
EPOCH_RUN = (
    "logger.progress_bar=false",
    "data.arithmetic.num_train=7",
    "data.arithmetic.num_val=8",
    "dapo.num_prompts_per_step=4",
    "policy.train_global_batch_size=32",  # 4 prompts x 8 samples: one optimizer step
    "dapo.dynamic_sampling.enabled=false",
    "dapo.max_num_epochs=2",
    "sft_warmup.num_steps=0",
    "validation.val_at_start=false",
    "validation.val_period=0",
    "checkpointing.save_period=100",  # only the last step's checkpoint
)


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = train_command(run_dir, run_dir / "model", *EPOCH_RUN, *overrides)
    return run_job(cmd)


def _steps(run_dir: Path) -> list[int]:
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in rows]


def test_max_num_epochs_ends_the_run_and_a_resume_stops_at_the_same_step(tmp_path):
    # Cut at step 2 by the step cap (its checkpoint), then resumed without it: the epochs
    # end the run after step 3, as an uninterrupted run would.
    first = _train(tmp_path, "dapo.max_num_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert _steps(tmp_path) == [1, 2]
    resumed = _train(tmp_path, "dapo.max_num_steps=100")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _steps(tmp_path) == [1, 2, 3]
    assert "step 3/3" in resumed.stderr  # the progress total counts the epochs' steps
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert checkpoints[-1] == "step_000003"  # the epochs' last step is checkpointed
    assert (tmp_path / "hf" / "step_000003").is_dir()  # and exported (the recipe's export_hf)
    assert f"Hugging Face export  {tmp_path / 'hf' / 'step_000003'}" in resumed.stdout
