"""The tiny model (data/tiny_model.py): built from its preset, loaded back by
transformers, created once, and its command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dapo_megatron.config.model_arch import PRESETS, arch_from_hf_config
from dapo_megatron.data import tiny_model as tiny_model_module
from dapo_megatron.data.tiny_model import create_tiny_model, main

# ----------------------------------------------------------------------------- tiny model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def test_tiny_model_loads_and_matches_the_preset(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    arch = PRESETS["tiny-qwen2"]
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert arch_from_hf_config(config, "config.json") == arch
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert isinstance(model, Qwen2ForCausalLM)
    assert sum(p.numel() for p in model.parameters()) == arch.num_parameters()
    assert model.config.vocab_size >= len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id
    input_ids = torch.tensor([tokenizer("3+5=")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids).logits
    assert logits.shape == (1, 5, arch.vocab_size) and torch.isfinite(logits).all()
    # The seed fixes the weights.
    other = create_tiny_model(tiny_model_dir.parent / "again", seed=0)
    again = AutoModelForCausalLM.from_pretrained(other)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    ("preset", "model_class"),
    [("tiny-qwen3", "Qwen3ForCausalLM"), ("tiny-qwen3-moe", "Qwen3MoeForCausalLM")],
)
def test_tiny_model_of_other_families(preset: str, model_class: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    arch = PRESETS[preset]
    out = create_tiny_model(tmp_path / preset, arch=arch, seed=0)
    config = json.loads((out / "config.json").read_text())
    assert arch_from_hf_config(config, "config.json") == arch
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == model_class
    # Exact parameter counts: q/k norms, head_dim != hidden / heads, the experts.
    assert sum(p.numel() for p in model.parameters()) == arch.num_parameters()


def test_tiny_model_is_idempotent(tiny_model_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()}
    assert create_tiny_model(tiny_model_dir, seed=123) == tiny_model_dir
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()} == before
    smaller = dataclasses.replace(PRESETS["tiny-qwen2"], num_layers=1)
    with pytest.raises(ValueError, match="another architecture"):
        create_tiny_model(tiny_model_dir, arch=smaller, seed=0)


def test_tiny_model_failure_leaves_no_partial_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny_model_module, "save_char_tokenizer", fail)  # after the weights
    with pytest.raises(RuntimeError, match="disk full"):
        create_tiny_model(tmp_path / "m", seed=0)
    assert list(tmp_path.iterdir()) == []


def test_tiny_model_existing_directories(tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    with pytest.raises(
        FileExistsError, match=r"not a complete checkpoint \(missing model\.safetensors"
    ):
        create_tiny_model(partial, seed=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (create_tiny_model(empty, seed=0) / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "partial"]


def test_tiny_model_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nested" / "cli-model"
    assert main(["--out", str(out), "--seed", "5"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert (out / "tokenizer.json").is_file()
