"""A Transformer Engine compiled against another torch is reported in one line.

TE 2.11.0's ``transformer_engine/pytorch/__init__.py`` loads its torch extension with
``load_framework_extension`` (transformer_engine/common/__init__.py), which raises
``ImportError: ...transformer_engine_torch...so: undefined symbol: ...`` when the extension
was built against another torch (pip's isolated build of the sdist). A fake TE package
whose ``transformer_engine.pytorch`` raises exactly that stands in for it, on sys.path for
in-process imports and on PYTHONPATH for the child process the dry run imports it in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from dapo_megatron.config import run_plan
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.run_plan import RunPlan, runtime_problems, te_abi_message

REPO = Path(__file__).resolve().parents[2]
GPU_RECIPE = REPO / "recipes" / "dapo-qwen3-8b-1n8g-tp4pp1cp1.yaml"
SYMBOL = "_ZN3c1017RegisterOperatorsD1Ev"
ABI_ERROR = (
    "/venv/lib/python3.11/site-packages/transformer_engine_torch.cpython-311-x86_64-linux-gnu"
    f".so: undefined symbol: {SYMBOL}"
)

# Like TE 2.11.0's top-level __init__: it swallows the ImportError of its pytorch
# subpackage, which `import transformer_engine.pytorch` then raises again.
TOP_LEVEL = """
try:
    from . import pytorch
except ImportError:
    pass
"""


def _fake_te(root: Path, error: str, monkeypatch: pytest.MonkeyPatch) -> None:
    package = root / "transformer_engine"
    (package / "pytorch").mkdir(parents=True)
    (package / "__init__.py").write_text(TOP_LEVEL)
    (package / "pytorch" / "__init__.py").write_text(f"raise ImportError({error!r})\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(autouse=True)
def _forget_te() -> Iterator[None]:
    """No fake TE module outlives a test."""
    yield
    for name in [n for n in sys.modules if n.split(".")[0] == "transformer_engine"]:
        del sys.modules[name]


def _plan(*overrides: str) -> RunPlan:
    plan = load_config(GPU_RECIPE, list(overrides)).require_plan()
    assert plan.device == "cuda"
    return plan


def test_dry_run_names_the_abi_mismatch_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_te(tmp_path, ABI_ERROR, monkeypatch)
    assert run_plan.te_installed()
    (problem,) = runtime_problems(_plan())
    assert "\n" not in problem
    for part in (
        "policy.allow_local_spec",
        f"installed torch {metadata.version('torch')}",
        f"undefined symbol {SYMBOL}",
        "bash scripts/setup_gpu.sh",
        "--no-build-isolation",
        "transformer-engine-torch==2.11.0",
    ):
        assert part in problem, (part, problem)


def test_local_spec_opt_in_skips_the_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_te(tmp_path, ABI_ERROR, monkeypatch)
    assert runtime_problems(_plan("policy.allow_local_spec=true")) == []


def test_other_import_failures_are_left_to_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_te(tmp_path, "libcudnn.so.9: cannot open shared object file", monkeypatch)
    assert runtime_problems(_plan()) == []


def test_the_worker_reports_the_same_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = pytest.importorskip("dapo_megatron.megatron.model")
    _fake_te(tmp_path, ABI_ERROR, monkeypatch)
    assert model.transformer_engine_error() == te_abi_message(ABI_ERROR)


def test_the_worker_passes_other_errors_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = pytest.importorskip("dapo_megatron.megatron.model")
    _fake_te(tmp_path, "libcudnn.so.9: cannot open shared object file", monkeypatch)
    assert model.transformer_engine_error() == (
        "ImportError: libcudnn.so.9: cannot open shared object file"
    )


def test_setup_gpu_installs_torch_then_vllm_then_te_without_build_isolation() -> None:
    script = (REPO / "scripts" / "setup_gpu.sh").read_text()
    torch_at = script.index('pip install -q "torch==$TORCH_VERSION"')
    vllm_at = script.index('pip install -q "vllm==$VLLM_VERSION"')
    te_at = script.index(
        'pip install -q --no-build-isolation "transformer-engine[pytorch]==$TE_VERSION"'
    )
    assert torch_at < vllm_at < te_at
    assert "TORCH_VERSION=2.13.0" in script and "VLLM_VERSION=0.32.0" in script
    assert f"TE_VERSION={run_plan.TE_VERSION}" in script
    setup = (REPO / "setup.py").read_text()
    assert f'"transformer-engine[pytorch]=={run_plan.TE_VERSION}"' in setup
    assert "scripts/setup_gpu.sh" in setup
