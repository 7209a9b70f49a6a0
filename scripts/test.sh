#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite: lint, type check, then pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`); without any, the
# whole suite runs on two workers (pytest-xdist).
# pytest's own exit status is returned unchanged: 5 ("no tests collected") fails too.
# `--slurm-long` instead runs the real-Slurm tests with their longer set (time limits, a dead
# slurmd): scripts/test_slurm.sh --long, which brings up and stops its own Slurm.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--slurm-long" ]; then
    shift
    exec bash scripts/test_slurm.sh --long "$@"
fi
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
if [ $# -eq 0 ]; then
    # The whole suite on two workers, a test file each at a time (--dist loadfile: a file's
    # module-scoped fixtures are built once). Many tests wait (Ray's health checks, timeouts,
    # process start-up) while others compute; two workers fill those waits on a 2-core
    # machine. DAPO_TEST_WORKERS=0 runs it in one process.
    workers=${DAPO_TEST_WORKERS:-2}
    if [ "$workers" != 0 ]; then
        set -- -n "$workers" --dist loadfile
    fi
fi
exec .venv/bin/python -m pytest "$@"
