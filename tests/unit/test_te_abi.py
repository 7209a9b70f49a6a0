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
import subprocess
import sys
import tomllib
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
    torch_at = script.index('pip install -q "$torch_spec"')
    vllm_at = script.index('pip install -q "vllm==$VLLM_VERSION"')
    te_at = script.index(
        'pip install -q --no-build-isolation "transformer-engine[pytorch]==$TE_VERSION"'
    )
    assert torch_at < vllm_at < te_at
    assert "TORCH_VERSION=2.13.0" in script and "VLLM_VERSION=0.32.0" in script
    assert f"TE_VERSION={run_plan.TE_VERSION}" in script
    packaging = (REPO / "pyproject.toml").read_text()
    gpu = tomllib.loads(packaging)["project"]["optional-dependencies"]["gpu"]
    assert f"transformer-engine[pytorch]=={run_plan.TE_VERSION}" in gpu
    assert "scripts/setup_gpu.sh" in packaging  # the extra's comment names the script


# --- setup_gpu.sh into the CPU .venv of scripts/setup.sh ---------------------------------

# A stand-in for $VENV/bin/python: it answers the script's torch queries from a state file
# and records every `-m pip` call, with pip's own rule that torch 2.13.0+cpu satisfies
# torch==2.13.0 (only `===2.13.0`, or no torch at all, installs the CUDA wheel).
FAKE_PYTHON = r"""#!/usr/bin/env bash
state=$(dirname "$0")/../torch-state
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    shift 2
    echo "$*" >> "$(dirname "$0")/../pip-calls"
    case "$*" in
        "uninstall -q -y torch") echo none > "$state" ;;
        *"torch==="*) if [ -n "$STUB_CPU_ONLY" ]; then echo cpu; else echo cuda; fi > "$state" ;;
        *"torch=="*) [ "$(cat "$state")" = none ] && echo cuda > "$state" ;;
    esac
    exit 0
fi
if [ "$1" = "-" ]; then cat > /dev/null; echo "[setup-gpu] torch 2.13.0 (CUDA 13.0): ok"; exit 0; fi
case "$(cat "$state")" in
    none) echo "ModuleNotFoundError: No module named 'torch'" >&2; exit 1 ;;
    cpu) case "$2" in *"is not None"*) echo False ;; *) echo "2.13.0+cpu None" ;; esac ;;
    cuda) case "$2" in *"is not None"*) echo True ;; *) echo "2.13.0 13.0" ;; esac ;;
esac
"""


def _fake_cpu_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    (venv / "torch-state").write_text("cpu\n")
    return venv


def _setup_gpu(venv: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX_URL", "VENV")}
    environ.update(VENV=str(venv), CUDA_HOME="/usr/local/cuda", **env)
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "setup_gpu.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
    )


def test_setup_gpu_replaces_the_cpu_torch_of_an_existing_venv(tmp_path: Path) -> None:
    # Before: `pip install torch==2.13.0` kept 2.13.0+cpu (it satisfies the pin) and the
    # script stopped with "not a CUDA build (a CPU wheel?); set TORCH_INDEX_URL".
    venv = _fake_cpu_venv(tmp_path)
    done = _setup_gpu(venv)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (venv / "pip-calls").read_text().splitlines()
    assert calls[:2] == ["uninstall -q -y torch", "install -q torch===2.13.0"], calls
    assert (venv / "torch-state").read_text().strip() == "cuda"
    assert (
        f"[setup-gpu] replacing torch 2.13.0+cpu (a CPU build) in {venv} with the CUDA wheel"
        in done.stdout.splitlines()
    )


def test_setup_gpu_stops_in_one_line_when_the_cuda_wheel_does_not_come(tmp_path: Path) -> None:
    venv = _fake_cpu_venv(tmp_path)
    done = _setup_gpu(venv, STUB_CPU_ONLY="1")  # an index that serves only CPU builds
    assert done.returncode == 1
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(
        f"[setup-gpu] ERROR: torch 2.13.0 in {venv} is still not a CUDA build"
    )
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130" in errors[0]
    assert not any("vllm" in c for c in (venv / "pip-calls").read_text().splitlines())
