#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite: lint, type check, then pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
# pytest's own exit status is returned unchanged: 5 ("no tests collected") fails too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff check"
.venv/bin/ruff check dapo_megatron tests bench
echo "[test] mypy"
# pyproject.toml [tool.mypy] says what is checked and how strictly. A type error fails the run, like ruff.
if ! mypy_out=$(.venv/bin/mypy 2>&1); then
    printf '%s\n' "$mypy_out"
    echo "[types] mypy: FAILED"
    exit 1
fi
echo "[types] mypy: ok (${mypy_out##*$'\n'})"
echo "[test] pytest"
exec .venv/bin/python -m pytest "$@"
