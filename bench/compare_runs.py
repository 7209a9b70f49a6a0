"""Compare two runs' metrics exactly, wall-clock keys left out: a refactor check.

    python bench/compare_runs.py RUN_DIR_A RUN_DIR_B [RUN_DIR_A2 RUN_DIR_B2 ...]

Each pair is two run directories (or two metrics.jsonl files) of the same seeded recipe,
e.g. one run on the commit before a change and one after. Every value computed from the
rollouts and the update (losses, rewards, keep rates, lengths, validation accuracy,
counters) must be equal bit for bit; timings, rates, idle fractions and refit transfer
statistics are skipped (they are wall-clock). Exit status 1 on any difference, printing
the first ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# Keys measured in wall-clock time (or derived from it): never equal across two runs.
_WALL_CLOCK_PARTS = ("timing/", "seconds", "_per_s", "idle", "refit/")


def _is_wall_clock(key: str) -> bool:
    return key == "time" or any(part in key for part in _WALL_CLOCK_PARTS)


def _records(path: Path) -> list[dict[str, Any]]:
    file = path / "metrics.jsonl" if path.is_dir() else path
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def compare(a: Path, b: Path) -> tuple[int, list[str]]:
    """(values compared, differences) of two runs' metrics."""
    left, right = _records(a), _records(b)
    if len(left) != len(right):
        return 0, [f"{len(left)} records vs {len(right)}"]
    compared, diffs = 0, []
    for ra, rb in zip(left, right, strict=True):
        keys_a = {k for k in ra if not _is_wall_clock(k)}
        keys_b = {k for k in rb if not _is_wall_clock(k)}
        if keys_a != keys_b:
            diffs.append(f"step {ra.get('step')}: keys differ: {sorted(keys_a ^ keys_b)}")
        for key in sorted(keys_a & keys_b):
            compared += 1
            if ra[key] != rb[key]:
                diffs.append(f"step {ra.get('step')}: {key} {ra[key]!r} != {rb[key]!r}")
    return compared, diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="pairs of run directories")
    args = parser.parse_args(argv)
    if len(args.runs) % 2:
        parser.error("give the runs in pairs: A B [A2 B2 ...]")
    failed = False
    for a, b in zip(args.runs[::2], args.runs[1::2], strict=True):
        compared, diffs = compare(a, b)
        print(f"{a} vs {b}: {compared} values compared, {len(diffs)} differ")
        for line in diffs[:8]:
            print(f"  {line}")
        failed |= bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
