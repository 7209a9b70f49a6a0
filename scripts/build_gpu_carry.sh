#!/usr/bin/env bash
# Build the carry of scripts/gpu_run.sh: what a one-GPU test machine (Python 3.12, torch,
# triton, transformers, no network) lacks to run dapo-train, as ONE xz tarball of an
# installed site directory plus a manifest, in .gpu_carry/pack/ (git-ignored). Name
# `.gpu_carry/pack` in the device call's carry; gpu_run.sh unpacks it there.
#
# Wheels (bench/gpu_run_carry.py WHEELS): Ray 2.60.0 (its java jars, dashboard web app and
# rllib/serve/tune/data/train/air libraries dropped), its jsonschema stack, megatron-core
# 0.16.1, math-verify with its LaTeX parser, tensorboardX: cp312 manylinux x86_64, fetched
# here with pip (PyPI) into .gpu_carry/cache/. Fails when the carry plus the tracked tree
# exceed the 64 MiB that one device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
CARRY=.gpu_carry
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
          --platform manylinux1_x86_64)
mapfile -t WHEELS < <("$PY" bench/gpu_run_carry.py wheels)
mkdir -p "$CARRY/cache"
echo "[carry] downloading ${#WHEELS[@]} wheels into $CARRY/cache"
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$CARRY/cache" "${WHEELS[@]}"

build=$(mktemp -d "$CARRY/build.XXXXXX")
trap 'rm -rf "$build"' EXIT
wheels=()
for req in "${WHEELS[@]}"; do
    # The cached wheel of exactly this pin (the cache may hold older pins too).
    name=${req%%==*}; version=${req##*==}
    norm=$(echo "$name" | tr '-' '_' | tr '[:upper:]' '[:lower:]')
    found=$(find "$CARRY/cache" -maxdepth 1 -iname "${norm}-${version}-*.whl" | head -n1)
    [ -n "$found" ] || { echo "[carry] no wheel for $req in $CARRY/cache" >&2; exit 1; }
    wheels+=("$found")
done
# pip installs for the device's interpreter (cp312) from here: --target with the same
# platform flags; nothing is resolved (--no-deps), nothing is fetched (--no-index).
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-warn-script-location \
    "${PLATFORM[@]}" --target "$build/site" "${wheels[@]}"
mapfile -t DROPPED < <("$PY" -c "import sys; sys.path.insert(0, 'bench'); import gpu_run_carry as c; print('\n'.join(c.RAY_DROPPED))")
for part in "${DROPPED[@]}"; do rm -rf "${build:?}/site/$part"; done
rm -rf "$build/site/bin"  # console scripts with this machine's interpreter in their shebang

rm -rf "$CARRY/pack"
mkdir -p "$CARRY/pack"
echo "[carry] packing $(du -sh "$build/site" | cut -f1) of installed packages (xz -9)"
XZ_OPT=-9T0 tar -cJf "$CARRY/pack/site.tar.xz" -C "$build" site
{
    echo "# the carry of scripts/gpu_run.sh, built $(date -u +%FT%TZ) by scripts/build_gpu_carry.sh"
    echo "# unpacked into a temporary directory on the device and put on PYTHONPATH"
    for w in "${wheels[@]}"; do echo "$(basename "$w")  $(stat -c %s "$w")"; done
    echo "dropped: ${DROPPED[*]}"
    echo "site.tar.xz  $(stat -c %s "$CARRY/pack/site.tar.xz")"
} > "$CARRY/pack/MANIFEST.txt"
"$PY" bench/gpu_run_carry.py budget "$CARRY/pack"
