#!/usr/bin/env bash
# Set up .venv (if needed) and run the main job: the tiny CPU recipe.
# Extra arguments go to dapo-train (e.g. `bash scripts/train_tiny.sh dapo.max_num_steps=5`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/dapo-train --config recipes/dapo-tiny-cpu.yaml "$@"
