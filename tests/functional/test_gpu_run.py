"""scripts/gpu_run.sh on a CPU (CI): the one-GPU end-to-end run with the tiny tiny-qwen3.

The same command that gives the GPU figures (bench/gpu_run.py) runs here with the CPU
defaults: dapo-train for three steps (two timed), the resume from step 1 that must match
steps 2 and 3 bit-exactly,
dapo-export loaded back by transformers, the transformers generate baseline. The JSON has
exactly the per-model keys of bench/gpu_run_figures.MODEL_KEYS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gpu_run_figures as figures  # noqa: E402


def test_gpu_run_script_on_cpu(tmp_path):
    out = tmp_path / "gpu_run.json"
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [
            "bash",
            str(REPO / "scripts/gpu_run.sh"),
            "--out",
            str(out),
            "--steps",
            "3",
            "--work-dir",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["spec"] == "local spec, no Transformer Engine"
    assert result["mfu_peak"] is None and result["mfu_note"]
    assert list(result["models"]) == ["tiny-qwen3"]
    entry = result["models"]["tiny-qwen3"]
    assert list(entry) == list(figures.MODEL_KEYS)
    assert entry["model"] == "tiny-qwen3" and entry["params"] > 0
    assert entry["resume_bit_exact"] is True, result["details"]
    assert entry["export_ok"] is True, result["details"]
    for key in (
        "step_s",
        "generation_s",
        "logprob_s",
        "train_s",
        "generated_tokens_per_s",
        "train_tokens_per_s",
        "hf_generate_tokens_per_s",
    ):
        assert entry[key] > 0, (key, entry[key])
    assert entry["train_mfu"] is None and entry["logprob_mfu"] is None  # no CPU peak
    assert entry["peak_gib_measured"] is None  # no CUDA allocator
    planned = entry["peak_gib_planned"]
    assert planned["train"] > 0 and planned["logprob"] > 0, planned
    assert "tiny-qwen3" in proc.stdout and "resume_bit_exact" in proc.stdout  # the table
