"""The checkout's run directories as a test session sees them (imported by tests/conftest.py
and tests/unit/test_checkout_guard.py as `checkout_guard`, like shm_hygiene: a module named
conftest would be ambiguous, tests/kernels has one too)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKOUT_RUNS = REPO / "runs"


def runs_snapshot(root: Path = CHECKOUT_RUNS) -> dict[str, tuple[int, int]]:
    """(size, mtime in ns) of every file and directory under ``root``, by relative path."""
    if not root.exists():
        return {}
    seen: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except FileNotFoundError:  # removed while walking: counted by the comparison
                continue
            seen[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return seen


def runs_changes(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> list[str]:
    """The paths created, removed or changed between two snapshots (sorted)."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
