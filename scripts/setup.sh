#!/usr/bin/env bash
# Create (or reuse) the project-local virtual environment .venv and install the package.
# Never touches the system Python. Re-running is cheap: pip is skipped while pyproject.toml and
# this script are unchanged since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi

stamp=.venv/.dapo-setup-stamp
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "[setup] .venv is up to date"
    exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned: the CPU wheel lies on disk; an unpinned torch requested by another
# package would pull a multi-GB CUDA build.
echo "[setup] installing torch==2.13.0"
.venv/bin/pip install -q "torch==2.13.0" 2> >(grep -v "is ignored: it is neither" >&2)
echo "[setup] installing dapo-megatron and test dependencies"
.venv/bin/pip install -q -e ".[test]" 2> >(grep -v "is ignored: it is neither" >&2)
# dapo-plan --trace preloads a small C++ library built against this torch (g++, ~2 s);
# without a compiler only the tracer is unavailable, and it says so in one line.
.venv/bin/python -m dapo_megatron.planning.trace.shim || true
echo "$want" > "$stamp"
echo "[setup] done"
