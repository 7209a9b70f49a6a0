"""dapo_megatron/device/phase_memory.py: per-phase CUDA peaks for bench/gpu_run.py."""

from __future__ import annotations

import torch

from dapo_megatron.device.phase_memory import GIB, PhasePeaks


def test_disabled_measures_nothing():
    peaks = PhasePeaks(enabled=False)
    with peaks.track("train"):
        pass
    assert peaks.metrics() == {}


def test_default_follows_cuda_availability():
    assert PhasePeaks().enabled == torch.cuda.is_available()


def test_running_max_per_phase(monkeypatch):
    allocated = iter([2 * GIB, 1 * GIB, 3 * GIB])
    resets: list[bool] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: resets.append(True))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: next(allocated))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 4 * GIB)
    peaks = PhasePeaks(enabled=True)
    with peaks.track("train"):
        pass
    with peaks.track("train"):  # lower than before: the run's peak stays
        pass
    with peaks.track("generation"):
        pass
    assert len(resets) == 3  # every phase starts from fresh counters
    assert peaks.metrics() == {
        "memory/generation_peak_allocated_gib": 3.0,
        "memory/generation_peak_reserved_gib": 4.0,
        "memory/train_peak_allocated_gib": 2.0,
        "memory/train_peak_reserved_gib": 4.0,
    }


def test_a_failing_phase_is_still_measured(monkeypatch):
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: GIB)
    peaks = PhasePeaks(enabled=True)
    try:
        with peaks.track("logprob"):
            raise RuntimeError("out of memory")
    except RuntimeError:
        pass
    assert peaks.metrics()["memory/logprob_peak_allocated_gib"] == 1.0
