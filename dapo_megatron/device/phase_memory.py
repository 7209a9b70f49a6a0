"""Per-phase peak CUDA memory of a policy rank, for comparison with the memory plan.

The planner (planning/memory.py) models the peak of each phase (generation, logprob,
train) on a GPU; only the process that ran the phase can measure it. ``PhasePeaks`` resets
PyTorch's peak counters when a phase starts and keeps, per phase, the largest
``max_memory_allocated`` / ``max_memory_reserved`` seen at its end over the whole run.
The policy worker reports them with every train step's metrics
(``memory/<phase>_peak_allocated_gib`` and ``..._reserved_gib``), so a run's
metrics.jsonl carries them. Without CUDA it measures nothing and reports nothing: the CPU
allocator has no such counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

GIB = float(2**30)


class PhasePeaks:
    """Running per-phase peaks of this process's CUDA allocator (module docstring)."""

    def __init__(self, enabled: bool | None = None) -> None:
        """``enabled``: measure (default: when CUDA is available in this process)."""
        self.enabled = torch.cuda.is_available() if enabled is None else enabled
        self._peaks: dict[str, tuple[int, int]] = {}

    @contextmanager
    def track(self, phase: str) -> Iterator[None]:
        """Measure the peak of the code in the block as ``phase``."""
        if not self.enabled:
            yield
            return
        # Counters start at what is allocated now: the phase's peak includes the resident
        # states (weights, optimizer), as the plan's does.
        torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            got = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
            old = self._peaks.get(phase, (0, 0))
            self._peaks[phase] = (max(old[0], got[0]), max(old[1], got[1]))

    def metrics(self) -> dict[str, float]:
        """The peaks so far in GiB, two keys per phase seen; empty when not measuring."""
        out: dict[str, float] = {}
        for phase, (allocated, reserved) in sorted(self._peaks.items()):
            out[f"memory/{phase}_peak_allocated_gib"] = allocated / GIB
            out[f"memory/{phase}_peak_reserved_gib"] = reserved / GIB
        return out
