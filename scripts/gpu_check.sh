#!/usr/bin/env bash
# The GPU first-contact check (dapo_megatron/gpu_check): every GPU-only path once, in under
# 8 minutes on ONE GPU, writing bench/results/gpu_check_<gpu>.json. On a machine without
# CUDA it runs the CPU twins and lists each skipped part with its reason.
#
# It needs only torch, triton, transformers, numpy and pyyaml beside this checkout, plus
# megatron-core: where `import megatron.core` fails, a megatron-core wheel in .whl/ (e.g.
# fetched beforehand with `python3 -m pip download --no-deps --only-binary=:all:
# --python-version 3.12 -d .whl megatron-core==0.16.1`) is installed into a temporary
# directory, never into the system Python. Interpreter: .venv/bin/python when present,
# else python3. Extra arguments go to the check (e.g. --sections kernels,pg_loss --out X).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c "import megatron.core" 2>/dev/null; then
    wheel=$(ls .whl/megatron_core-*.whl 2>/dev/null | head -n1 || true)
    if [ -z "$wheel" ]; then
        echo "[gpu-check] megatron-core does not import and no .whl/megatron_core-*.whl was found" >&2
        exit 2
    fi
    site=$(mktemp -d /tmp/gpu-check-site.XXXXXX)
    echo "[gpu-check] installing $(basename "$wheel") into $site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheel"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m dapo_megatron.gpu_check "$@"
