"""A vLLM recipe's dry run fails where vllm is not installed, naming the key and the fix.

Before, ``dapo-train --dry-run`` passed such a recipe and the run failed ~40 s later, once
Ray and the policy ranks had started and the first engine actor imported vllm. Whether
vllm is installed is patched (``preflight.package_installed``), so the tests say the same
in the main .venv (no vllm) and in .venv-vllm.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.cli import train_main
from dapo_megatron.config.loader import load_config
from dapo_megatron.planning import preflight

REPO = Path(__file__).resolve().parents[2]
VLLM_RECIPE = REPO / "recipes" / "dapo-tiny-cpu-vllm.yaml"
MEGATRON_RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"


@pytest.fixture
def without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = preflight.package_installed
    monkeypatch.setattr(preflight, "package_installed", lambda name: name != "vllm" and real(name))


def test_vllm_backend_without_vllm_on_cpu_names_the_cpu_setup(without_vllm: None) -> None:
    config = load_config(VLLM_RECIPE).config
    (problem,) = preflight.check_generation_backend(config, "cpu")
    assert problem.startswith("generation.backend = vllm, but the vllm package is not installed")
    assert "bash scripts/setup_vllm_cpu.sh" in problem and ".venv-vllm/bin/dapo-train" in problem
    assert "generation.backend=megatron" in problem and "\n" not in problem


def test_on_cuda_the_fix_is_the_gpu_setup(without_vllm: None) -> None:
    config = load_config(VLLM_RECIPE).config
    (problem,) = preflight.check_generation_backend(config, "cuda")
    assert "bash scripts/setup_gpu.sh" in problem and "setup_vllm_cpu" not in problem


def test_megatron_backend_and_installed_vllm_pass(
    without_vllm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert preflight.check_generation_backend(load_config(MEGATRON_RECIPE).config, "cpu") == []
    monkeypatch.setattr(preflight, "package_installed", lambda name: True)
    assert preflight.check_generation_backend(load_config(VLLM_RECIPE).config, "cpu") == []


def test_package_installed_finds_without_importing() -> None:
    assert preflight.package_installed("json")
    assert not preflight.package_installed("no_such_package_dapo")


def test_dry_run_refuses_the_vllm_recipe(
    without_vllm: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "--config",
        str(VLLM_RECIPE),
        "--dry-run",
        f"run.output_dir={tmp_path / 'run'}",
        f"policy.model_name_or_path={tmp_path / 'model'}",
        "policy.init_model_if_missing=true",
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "generation.backend = vllm, but the vllm package is not installed" in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "model").exists()
