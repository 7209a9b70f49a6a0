"""Fixtures shared by unit tests of several packages."""

from __future__ import annotations

import pytest
import torch

from dapo_megatron.device import memory_release


@pytest.fixture
def cuda_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """torch.cuda on a GPU machine, recording every call that does work; CUDA state
    initialised unless a test patches ``is_initialized`` again (device/memory_release.py,
    and the generation worker that releases an engine's memory through it)."""
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 << 30)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(memory_release.gc, "collect", lambda *a: calls.append("gc") or 0)
    return calls
