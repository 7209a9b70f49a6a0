#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite: lint, then pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
# pytest's own exit status is returned unchanged: 5 ("no tests collected") fails too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff check"
.venv/bin/ruff check dapo_megatron tests bench
echo "[test] pytest"
exec .venv/bin/python -m pytest "$@"
