"""Live device bytes by category while a traced step runs, and their peak.

A TorchDispatchMode sees every op's outputs; each new device storage (fake or real) is
counted once, under the label current at its creation, until Python frees it (a weakref
callback on the storage). Storages that exist when a phase starts are labelled by what owns
them (``label_resident``: the model's parameters, DDP's grad buffers, the optimizer's
master weights and states); everything a phase creates is its "activations" (saved
tensors, temporaries, gradients of activations, the logprob head's buffers).

torch's MemTracker (torch/distributed/_tools/mem_tracker.py) does the same with per-module
bookkeeping that costs ~10x on a Megatron step and refuses several forwards per step (the
micro-batches of a pipeline schedule); only the global peak by category is needed here.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ACTIVATIONS = "activations"


class StorageCensus(TorchDispatchMode):
    """Counts device storages by label; see the module docstring."""

    def __init__(self, device_type: str = "cuda") -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self.device_type = device_type
        self._live: dict[int, tuple[int, str]] = {}
        self._refs: dict[int, Any] = {}
        self.by_label: dict[str, int] = {}
        self.total = 0
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        self.label = ACTIVATIONS

    # ------------------------------------------------------------------------------
    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        self._refs.pop(key, None)
        if entry is None:
            return
        nbytes, label = entry
        self.total -= nbytes
        self.by_label[label] -= nbytes

    def _release(self, key: int, _ref: object) -> None:
        self._free(key)

    def _add(self, t: torch.Tensor, label: str) -> None:
        if t.device.type != self.device_type:
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        nbytes = storage.nbytes()
        self._live[key] = (nbytes, label)
        self._refs[key] = weakref.ref(storage, functools.partial(self._release, key))
        self.total += nbytes
        self.by_label[label] = self.by_label.get(label, 0) + nbytes
        if self.total > self.peak:
            self.peak = self.total
            self.at_peak = dict(self.by_label)

    def relabel(self, tensors: Iterable[torch.Tensor], label: str) -> None:
        """Count ``tensors``' storages under ``label`` (adding them if not yet seen)."""
        for t in tensors:
            if t is None or t.device.type != self.device_type:
                continue
            key = id(t.untyped_storage())
            entry = self._live.get(key)
            if entry is not None and entry[1] != label:
                self.by_label[entry[1]] -= entry[0]
                self.by_label[label] = self.by_label.get(label, 0) + entry[0]
                self._live[key] = (entry[0], label)
            elif entry is None:
                self._add(t, label)

    def reset_peak(self) -> None:
        """Start a new phase: the peak restarts from what is live now."""
        self.peak = self.total
        self.at_peak = dict(self.by_label)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t, self.label)
        return out


def gib(n_bytes: float) -> float:
    return n_bytes / 2**30
