"""The one-GPU recipes: dapo-plan says they fit their card with the safety margin, and
`dapo-train --dry-run` passes every pre-flight check of a CUDA run.

The dry run happens on this (CPU) machine: only the machine's facts are patched (a CUDA
device is visible, Transformer Engine is installed); every other check stays real. As in
migrate/test_import_config.py's dry runs of GPU recipes, the model is one the run would create
(policy.init_model_if_missing, under tmp_path: the recipes' models/ directories are not in
the checkout) and the data synthetic (the DAPO-Math parquet files are not either).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.cli import plan_main, train_main
from dapo_megatron.config import run_plan
from dapo_megatron.config.loader import load_config
from dapo_megatron.planning.capacity import default_margin_gib, parse_gpu_mem
from dapo_megatron.planning.memory import memory_inputs, plan_memory

REPO = Path(__file__).resolve().parents[2]
RECIPES = {
    # recipe: the card it is written for (the smallest of its class: L4 / A10G report less
    # than an RTX 4090).
    "dapo-qwen3-1.7b-1n1g-tp1pp1cp1.yaml": "h100-80gb",
    "dapo-qwen3-0.6b-1n1g-tp1pp1cp1.yaml": "l4",
}
SYNTHETIC_DATA = [
    "data.format=arithmetic",
    "data.train_path=null",
    "data.val_path=null",
    "data.arithmetic.difficulty=3",
    "reward.verifier=arithmetic",
]


@pytest.mark.parametrize("name,card", RECIPES.items())
def test_recipe_fits_its_card_with_the_margin(name, card, capsys):
    recipe = REPO / "recipes" / name
    assert plan_main(["--config", str(recipe), "--gpu-mem", card]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    gib, _ = parse_gpu_mem(card)
    margin = default_margin_gib(gib)
    assert f"safety margin {margin:.1f} GiB" in out
    assert "memory: fits with" in out and "within the" not in out
    # Every phase leaves at least the margin free, the KV cache holds full sequences.
    report = plan_memory(memory_inputs(load_config(recipe).require_plan(), gib))
    assert report.fits
    assert {ph.name for ph in report.phases} == {
        "train",
        "logprob",
        "engine start",
        "generation",
        "refit",
    }
    for phase in report.phases:
        assert phase.peak <= gib - margin, phase.name
    assert report.engine is not None and report.engine.full_sequences >= 4


def test_recipes_are_one_gpu_colocated_vllm():
    for name in RECIPES:
        cfg = load_config(REPO / "recipes" / name).config
        assert (cfg.cluster.num_nodes, cfg.cluster.gpus_per_node) == (1, 1)
        assert cfg.cluster.device == "cuda" and cfg.cluster.colocated
        assert cfg.generation.backend == "vllm"
        assert cfg.generation.engine.tensor_parallel_size == 1
        # The paper's algorithm, unscaled.
        loss = cfg.dapo.loss
        assert (loss.clip_ratio_low, loss.clip_ratio_high) == (0.2, 0.28)
        assert loss.loss_agg_mode == "token-mean" and loss.kl_coef == 0
        assert cfg.dapo.dynamic_sampling.enabled and cfg.dapo.overlong_buffer.enabled
        assert cfg.policy.optimizer.lr == 1e-6
        # A packed micro-batch holds the longest sequence.
        assert cfg.policy.max_tokens_per_microbatch is not None
        assert cfg.policy.max_tokens_per_microbatch >= cfg.policy.max_total_sequence_length
        text = (REPO / "recipes" / name).read_text()
        assert f"# Launch: .venv/bin/dapo-train --config recipes/{name}\n" in text
        assert f"# Check it fits first: .venv/bin/dapo-plan --config recipes/{name}" in text


@pytest.fixture
def cuda_machine(monkeypatch):
    """This machine, as a one-GPU CUDA node with Transformer Engine and vLLM installed."""
    import torch

    from dapo_megatron.planning import preflight

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(run_plan, "te_installed", lambda: True)
    monkeypatch.setattr(preflight, "package_installed", lambda name: True)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_dry_runs_on_a_cuda_node(name, tmp_path, cuda_machine, capsys):
    args = [
        "--config",
        str(REPO / "recipes" / name),
        "--dry-run",
        "cluster.device=cuda",
        f"run.output_dir={tmp_path / 'run'}",
        f"policy.model_name_or_path={tmp_path / 'model'}",
        "policy.init_model_if_missing=true",
        *SYNTHETIC_DATA,
    ]
    assert train_main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "1 node(s) x 1 devices (cuda), colocated" in out
    assert "dry run: configuration, data, model, tokenizer and devices are valid" in out
    assert not (tmp_path / "run").exists() and not (tmp_path / "model").exists()


def test_dry_run_without_a_gpu_still_fails_the_device_check(tmp_path, monkeypatch, capsys):
    # The patch above is the only thing standing in for the GPU: without it the same dry
    # run is refused by the device check.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(run_plan, "te_installed", lambda: True)
    args = [
        "--config",
        str(REPO / "recipes" / "dapo-qwen3-0.6b-1n1g-tp1pp1cp1.yaml"),
        "--dry-run",
        f"run.output_dir={tmp_path / 'run'}",
        f"policy.model_name_or_path={tmp_path / 'model'}",
        "policy.init_model_if_missing=true",
        *SYNTHETIC_DATA,
    ]
    assert train_main(args) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err
