"""The cached-memory release (device/memory_release.py) never opens a CUDA context.

torch 2.13's ``torch.cuda.synchronize`` calls ``_lazy_init()`` (torch/cuda/__init__.py):
in a process without CUDA state it would create a context (~0.3-0.6 GiB) on its first
visible GPU and free nothing. The colocated vLLM engine actor is such a process on GPU
(vLLM's engine core runs in child processes). The GPU facts are patched in: CUDA
available, and initialised or not."""

from __future__ import annotations

import inspect

import pytest
import torch

from dapo_megatron.device import memory_release

ZERO = {"reserved_before": 0, "reserved_after": 0, "released": 0}


def test_a_process_without_cuda_state_calls_nothing(
    cuda_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert memory_release.release_cached_memory("engine actor") == ZERO
    assert cuda_calls == []


def test_a_process_with_cuda_state_releases_in_order(cuda_calls: list[str]) -> None:
    memory_release.release_cached_memory("policy")
    assert cuda_calls == ["sync", "gc", "empty_cache"]


def test_upstream_synchronize_initialises_cuda_and_empty_cache_does_not() -> None:
    """Why the guard is needed: pinned on torch's own source (torch/cuda)."""
    assert "_lazy_init()" in inspect.getsource(torch.cuda.synchronize)
    empty_cache = inspect.getsource(torch.cuda.empty_cache)
    assert "if is_initialized():" in empty_cache and "_lazy_init" not in empty_cache


# ---------------------------------------------------------------------------------------
# What the release reports, and that it does nothing without CUDA.


def test_release_is_a_no_op_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    result = memory_release.release_cached_memory("test")
    assert result == {"reserved_before": 0, "reserved_after": 0, "released": 0} and not calls


def test_release_reports_reserved_bytes_before_and_after(monkeypatch: pytest.MonkeyPatch) -> None:
    reserved = [5 << 30]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved[0])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: reserved.__setitem__(0, 2 << 30))
    result = memory_release.release_cached_memory("test")
    assert result == {"reserved_before": 5 << 30, "reserved_after": 2 << 30, "released": 3 << 30}
