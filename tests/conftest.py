"""Shared pytest set-up: GPU-only tests are skipped (and counted) without CUDA; shared-memory
files left in /dev/shm by processes the tests killed are removed at the end (shm_hygiene)."""

from __future__ import annotations

import pytest
import shm_hygiene
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_shm_before: set[str] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    _shm_before.update(shm_hygiene.ours())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    removed = shm_hygiene.remove_leftovers(_shm_before)
    if removed:
        print(f"\n[shm] removed {len(removed)} shared-memory file(s) left by killed processes")
