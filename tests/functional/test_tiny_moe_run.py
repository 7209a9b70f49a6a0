"""End to end: the tiny MoE recipe (Qwen3-MoE, DP2 x EP2) through real Ray workers.

Three short runs of recipes/dapo-tiny-moe-cpu.yaml share one random model: 4 steps
straight, and 2 steps then 2 more resumed from the step-2 checkpoint. Resuming must give
the straight run's metrics and its final HF export byte for byte (the expert weights and
their Adam states are saved as EP shards and read back by the rank that owns them); the
export must load in transformers' Qwen3MoeForCausalLM with per-expert tensors and decode
the run's own greedy validation accuracy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_job import REPO, metrics_by_step, run_job

pytestmark = pytest.mark.functional

RECIPE = REPO / "recipes" / "dapo-tiny-moe-cpu.yaml"
VAL_PROMPTS = 48
COMMON = [
    "sft_warmup.num_steps=40",
    "checkpointing.save_period=2",
    "validation.val_period=2",
    "validation.val_at_start=false",
    f"validation.max_prompts={VAL_PROMPTS}",
    # The schedule's length fixed: a 2-step run then decays like the first half of 4 steps.
    "policy.scheduler.lr_decay_steps=4",
    "logger.progress_bar=false",
    "logger.plots=false",
]
# Compared exactly: everything computed from the rollouts and the update, not wall time.
KEYS = (
    "loss",
    "grad_norm",
    "reward/acc",
    "policy/entropy",
    "dynamic_sampling/keep_rate",
    "response_length/mean",
)


def _train(run_dir: Path, model_dir: Path, steps: int) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config",
        str(RECIPE),
        f"run.output_dir={run_dir}",
        f"policy.model_name_or_path={model_dir}",
        f"dapo.max_num_steps={steps}",
        *COMMON,
    ]
    out = run_job(cmd)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def _hf_greedy_accuracy(export: Path, run_dir: Path) -> float:
    """Greedy accuracy of the exported model, decoded by transformers, on the run's first
    VAL_PROMPTS validation problems (the same prompts, tokens and cap as the run's engine)."""
    import torch
    import transformers

    from dapo_megatron.config.loader import load_config
    from dapo_megatron.data.datasets import build_datasets
    from dapo_megatron.rewards.arithmetic import score

    config = load_config(run_dir / "config.yaml", validate=False).config
    splits = build_datasets(config.data, seed=config.run.seed)
    assert splits.val is not None
    model = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    records = splits.val.records[:VAL_PROMPTS]
    correct = 0
    with torch.no_grad():
        for record in records:
            ids = tokenizer(record.text, return_tensors="pt")["input_ids"]
            out = model.generate(
                ids,
                max_new_tokens=config.generation.max_response_length,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            correct += score(text, record.ground_truth) > 0
    return correct / len(records)


def test_moe_run_resumes_exactly_and_exports_experts(tmp_path):
    model_dir = tmp_path / "model"
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _train(straight, model_dir, 4)
    _train(resumed, model_dir, 2)
    out = _train(resumed, model_dir, 4)
    assert "[resume]" in out.stdout and "step_000002" in out.stdout

    want, got = metrics_by_step(straight), metrics_by_step(resumed)
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]  # no duplicated or lost step
    for step in (3, 4):
        for key in KEYS:
            assert got[step][key] == want[step][key], (step, key, got[step][key], want[step][key])
    assert got[4]["val/acc"] == want[4]["val/acc"]

    import safetensors.torch

    export = straight / "hf" / "step_000004"
    exported = safetensors.torch.load_file(export / "model.safetensors")
    resumed_export = safetensors.torch.load_file(
        resumed / "hf" / "step_000004" / "model.safetensors"
    )
    assert sorted(exported) == sorted(resumed_export)
    for name, tensor in exported.items():
        assert tensor.equal(resumed_export[name]), name
    # One HF tensor per expert (4 per layer, 2 from each EP rank), all trained.
    initial = safetensors.torch.load_file(model_dir / "model.safetensors")
    for layer in (0, 1):
        for expert in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                assert exported[name].shape == initial[name].shape, name
                assert not exported[name].equal(initial[name]), name
    assert _hf_greedy_accuracy(export, straight) == want[4]["val/acc"]
