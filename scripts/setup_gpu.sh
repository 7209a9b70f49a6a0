#!/usr/bin/env bash
# Install the GPU stack into .venv (or $VENV) in the one order that yields a working
# Transformer Engine: torch 2.13.0 (CUDA build) first, then vLLM 0.32.0 (which requires
# exactly that torch), then Transformer Engine 2.11.0 compiled against THAT torch.
#
# Why not `pip install -e '.[gpu]'` alone: transformer_engine_torch 2.11.0 is an sdist whose
# pyproject.toml asks for `torch>=2.1` at build time (transformer_engine_torch-2.11.0.tar.gz,
# [build-system] requires), so pip's default isolated build installs the newest torch into a
# throw-away environment and compiles the extension against it. Imported next to torch 2.13
# it then fails with `ImportError: ...transformer_engine_torch...so: undefined symbol: ...`
# (transformer_engine/common/__init__.py, load_framework_extension), which dapo-train
# --dry-run reports in one line. --no-build-isolation compiles against the installed torch.
#
# Needs: a CUDA toolkit (nvcc, CUDA_HOME) matching the torch build, for TE's extension.
# Usage: bash scripts/setup_gpu.sh            (creates .venv with python3 if missing)
#        VENV=/path/to/venv bash scripts/setup_gpu.sh
#        TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 bash scripts/setup_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
TE_VERSION=2.11.0
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}

log() { echo "[setup-gpu] $*"; }

if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }
export PIP_DISABLE_PIP_VERSION_CHECK=1

# 1. torch, pinned (the default PyPI wheel for Linux x86_64 is a CUDA build).
#    A CPU build already here (the .venv of scripts/setup.sh holds torch 2.13.0+cpu) is
#    removed first: pip counts 2.13.0+cpu as satisfying torch==2.13.0 and would keep it.
installed=$("$VENV/bin/python" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null || true)
if [ -n "$installed" ] && [ "${installed##* }" = "None" ]; then
    log "replacing torch ${installed% *} (a CPU build) in $VENV with the CUDA wheel"
    pip uninstall -q -y torch
fi
# Without an index of its own, `===` asks for exactly "2.13.0": pip may not take a +cpu wheel
# of that version from a find-links directory (which it ranks above the plain one).
torch_spec="torch==$TORCH_VERSION"
[ -n "$TORCH_INDEX_URL" ] || torch_spec="torch===$TORCH_VERSION"
log "installing $torch_spec${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
pip install -q "$torch_spec" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
if [ "$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda is not None)' 2>/dev/null)" != "True" ]; then
    log "ERROR: torch $TORCH_VERSION in $VENV is still not a CUDA build (a CPU wheel from a find-links or index?): set TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130, or use a fresh VENV=" >&2
    exit 1
fi

# 2. vLLM, pinned; it requires exactly torch==2.13.0, so torch stays as installed.
log "installing vllm==$VLLM_VERSION"
pip install -q "vllm==$VLLM_VERSION" "torch==$TORCH_VERSION"

# 3. Transformer Engine against the installed torch: its build requirements by hand, then
#    --no-build-isolation (see the header).
if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDA_HOME:-}" ]; then
    log "WARNING: no nvcc on PATH and CUDA_HOME unset: building transformer_engine_torch will fail" >&2
fi
log "installing transformer-engine[pytorch]==$TE_VERSION (--no-build-isolation)"
pip install -q setuptools wheel packaging ninja pybind11
pip install -q --no-build-isolation "transformer-engine[pytorch]==$TE_VERSION" "torch==$TORCH_VERSION"

# 4. The package itself; the gpu extra's pins are all satisfied now, so nothing is rebuilt.
log "installing dapo-megatron[gpu,test]"
pip install -q -e ".[gpu,test]" "torch==$TORCH_VERSION"

# 5. The check that matters: TE's torch extension loads against this torch.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
import transformer_engine.pytorch  # noqa: F401  (raises on an ABI mismatch)
print(f"[setup-gpu] torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformer-engine {md.version('transformer-engine')}, vllm {md.version('vllm')}: ok")
PY
log "done"
