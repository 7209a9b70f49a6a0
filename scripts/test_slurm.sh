#!/usr/bin/env bash
# The real-Slurm tests (tests/slurm): bring up a Slurm with two nodes on this machine
# (scripts/slurm_local.sh: Debian's slurm-wlm and munge, installed when missing), run
# `sbatch slurm/ray.sub` cases against it, and stop every daemon it started, whatever the
# outcome. `--long` adds the longer set (time limits, a dead slurmd); extra arguments go to
# pytest. CI runs it after scripts/test.sh (.ci/run); `bash scripts/test.sh --slurm-long`
# runs it with --long.
#
#   bash scripts/test_slurm.sh            # the CI set, about 5 minutes on 2 cores
#   bash scripts/test_slurm.sh --long     # and the longer set, about 6 more minutes
set -euo pipefail
cd "$(dirname "$0")/.."

long=0
if [[ "${1:-}" == "--long" ]]; then
    long=1
    shift
fi

bash scripts/setup.sh
# One Slurm per run: `down` stops what `up` started (the pids it recorded), on any exit.
trap 'bash scripts/slurm_local.sh down' EXIT
bash scripts/slurm_local.sh up
eval "$(bash scripts/slurm_local.sh env)"
export DAPO_SLURM_TESTS=1 DAPO_SLURM_LONG=$long
if [ $# -eq 0 ]; then
    # -v --durations=0: each case with its result and its time (CI time is a budget).
    set -- tests/slurm -v --durations=0
    if ((!long)); then set -- "$@" -m "slurm and not slurm_long"; fi
fi
echo "[test_slurm] pytest $*"
.venv/bin/python -m pytest -p no:cacheprovider "$@"
