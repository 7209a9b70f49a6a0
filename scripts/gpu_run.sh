#!/usr/bin/env bash
# End to end on one device, in ONE command: per model a random-weight checkpoint of a real
# shape, dapo-train (timed steps), a resume that must match bit-exactly, dapo-export loaded
# back by transformers, and transformers' generate for comparison; writes
# bench/results/gpu_run_<gpu>.json (bench/gpu_run.py says what and how). On a GPU the
# defaults are qwen3-0.6b and qwen3-1.7b; without CUDA (CI) the tiny tiny-qwen3.
#
#   bash scripts/gpu_run.sh [--out FILE] [--models a,b] [--steps N] [--prompts N]
#                           [--samples N] [--response-length N] [KEY=VALUE ...]
#
# The one-GPU test machine lacks Ray, megatron-core, math-verify and tensorboardX: where
# `import ray, megatron.core, math_verify` fails, the carry that scripts/build_gpu_carry.sh
# built here
# (.gpu_carry/pack/site.tar.xz; name `.gpu_carry/pack` in the device call's carry) is
# unpacked (by Python's tarfile: no xz binary needed) into a temporary directory put on
# PYTHONPATH, never into the system Python.
# Interpreter: $PYTHON, else .venv/bin/python when present, else python3.
#
# On the lent one-GPU machine (device tool), after `bash scripts/build_gpu_carry.sh` here:
#   run(carry=[".gpu_carry/pack"], timeout_s=600, command="set -o pipefail; bash
#       scripts/gpu_run.sh --out $OUT/gpu_run.json 2>&1 | tee $OUT/gpu_run.log")
# It ends by itself before the call's 600 s (--hard-stop-s, default 560 from this script's
# start): the running phase is stopped and $OUT/gpu_run.json is written, as it is at the
# start and after every phase (every model's timed run first, then resume, export and HF
# per model; `phases_done`/`partial` per model), with $OUT/gpu_run_logs.txt (the tails of
# every child's and worker's log, and each error's traceback). Exit 0 when a model has its
# timed figures. Copy the JSON to bench/results/ after.
set -euo pipefail
# The hard stop counts from here (bench/gpu_run.py): the carry's unpacking is in the call.
export GPU_RUN_STARTED=${GPU_RUN_STARTED:-$(date +%s.%N)}
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
site=""
cleanup() { if [ -n "$site" ]; then rm -rf "$site"; fi; }
trap cleanup EXIT
if ! "$PY" -c "import ray, megatron.core, math_verify" 2>/dev/null; then
    carry=.gpu_carry/pack/site.tar.xz
    if [ ! -f "$carry" ]; then
        echo "[gpu-run] ray / megatron-core / math-verify do not import and $carry is missing:" \
             "run scripts/build_gpu_carry.sh here and carry .gpu_carry/pack" >&2
        exit 2
    fi
    site=$(mktemp -d /tmp/gpu-run-site.XXXXXX)
    echo "[gpu-run] unpacking $carry ($(du -h "$carry" | cut -f1)) into $site"
    "$PY" bench/gpu_run_guard.py unpack "$carry" "$site"
    export PYTHONPATH="$site/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# The checkout's package, also in the Ray workers (they inherit the environment).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAY_USAGE_STATS_ENABLED=0
# Not exec: the trap removes the unpacked carry when the run ends.
"$PY" bench/gpu_run.py "$@"
