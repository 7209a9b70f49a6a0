"""The long-response recipe (issue 31) for a few steps: truncation and zero-variance groups
actually occur on its task, so overlong handling and dynamic sampling have work to do."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tiny_job import REPO, run_job

pytestmark = pytest.mark.functional

RECIPE = REPO / "recipes" / "dapo-longcot-cpu.yaml"


def test_longcot_recipe_truncates_and_filters_groups(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config",
        str(RECIPE),
        f"run.output_dir={tmp_path}",
        f"policy.model_name_or_path={tmp_path / 'model'}",
        "logger.progress_bar=false",
        "logger.plots=false",
        "checkpointing.enabled=false",
        "dapo.max_num_steps=3",
        # A shorter warm-up than the recipe's 300 steps: a weaker policy, still partly right
        # (so some groups vary) and more often running into the cap.
        "sft_warmup.num_steps=150",
        "validation.val_at_start=false",
        "validation.val_period=0",
    ]
    out = run_job(cmd)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    # Truncation: responses reach the cap (56 tokens) on this task.
    assert max(r["response_length/max"] for r in steps) == 56
    assert sum(r["response_length/clip_ratio"] for r in steps) > 0
    # Zero-variance groups (always or never solved) exist and dynamic sampling drops them:
    # fewer groups kept than generated, so more samples generated than trained.
    assert min(r["dynamic_sampling/keep_rate"] for r in steps) < 1.0
    generated = sum(r["dynamic_sampling/num_samples_generated"] for r in steps)
    assert generated > 3 * 16 * 8
    # And the soft overlong punishment sees responses inside its buffer.
    assert any(r["reward/overlong_frac"] > 0 for r in steps)
