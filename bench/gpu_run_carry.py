"""The carry of scripts/gpu_run.sh: what a one-GPU test machine lacks, and its size budget.

The device machine has torch, triton, transformers and most small packages, but no Ray,
megatron-core, math-verify or tensorboardX, and no network: they travel beside the git
tree as one xz tarball of an installed site directory (scripts/build_gpu_carry.sh builds
it here). Everything that travels (tracked tree + carry) must stay under 64 MiB.

CLI (used by build_gpu_carry.sh): ``python bench/gpu_run_carry.py wheels`` prints the
pinned requirements, one a line; ``python bench/gpu_run_carry.py budget CARRY_DIR`` prints
the sizes and exits 1 when the carry does not fit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAVEL_LIMIT_BYTES = 64 * 2**20
"""What travels to the device machine in one call: tracked tree + carried paths."""

# Missing on the device image (/work/.library/device/KINDS.md, "Python packages already
# there"): Ray and its jsonschema stack, megatron-core, math-verify and its LaTeX parser,
# tensorboardX. Ray's other needs (click, filelock, msgpack, packaging, protobuf, pyyaml,
# requests, attrs) and sympy/numpy are there already.
WHEELS: tuple[str, ...] = (
    "ray==2.60.0",
    "jsonschema==4.23.0",
    "referencing==0.35.1",  # 0.37 fails to import on the device's Python 3.12 stack
    "jsonschema-specifications==2024.10.1",
    "rpds-py==0.22.3",
    "megatron-core==0.16.1",
    "math-verify==0.9.0",
    "latex2sympy2_extended==1.11.0",
    "antlr4-python3-runtime==4.13.2",
    "tensorboardX==2.6.2.2",
)
"""Pinned wheels of the carry (one version each: two would stop the install)."""

RAY_DROPPED: tuple[str, ...] = (
    "ray/jars",
    "ray/dashboard/client",
    "ray/rllib",
    "ray/serve",
    "ray/tune",
    "ray/data",
    "ray/train",
    "ray/air",
)
"""Parts of Ray a local cluster of actors never imports (java, the dashboard's web app,
the libraries): dropped so the carry fits the budget."""


def tracked_bytes(repo: Path = REPO) -> int:
    """Bytes of the files git tracks (what travels besides the carry)."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=repo, check=True, capture_output=True
    ).stdout.split(b"\0")
    total = 0
    for name in names:
        path = repo / name.decode()
        if name and path.is_file():  # a deleted, not yet committed file is listed too
            total += path.stat().st_size
    return total


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def carry_budget(tracked: int, limit: int = TRAVEL_LIMIT_BYTES) -> int:
    """Bytes left for the carry once the tracked tree is counted (never negative)."""
    return max(0, limit - tracked)


def fits(carry: int, tracked: int, limit: int = TRAVEL_LIMIT_BYTES) -> bool:
    """Whether a carry of ``carry`` bytes travels beside a tree of ``tracked`` bytes."""
    return carry <= carry_budget(tracked, limit)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv: list[str]) -> int:
    """CLI: ``wheels`` or ``budget CARRY_DIR`` (module docstring)."""
    if argv[:1] == ["wheels"]:
        print("\n".join(WHEELS))
        return 0
    if argv[:1] == ["budget"] and len(argv) == 2:
        carry = dir_bytes(Path(argv[1]))
        tracked = tracked_bytes()
        budget = carry_budget(tracked)
        verdict = "fits" if fits(carry, tracked) else "DOES NOT FIT"
        print(
            f"[carry] {argv[1]}: {_mib(carry)} ({carry} bytes); tracked tree {_mib(tracked)}; "
            f"budget {_mib(budget)} of {_mib(TRAVEL_LIMIT_BYTES)}: {verdict}"
        )
        return 0 if fits(carry, tracked) else 1
    print("usage: gpu_run_carry.py wheels | budget CARRY_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
