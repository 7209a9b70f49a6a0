"""refit/ipc.py's rewrite of the CUDA IPC rebuild arguments, pinned on the installed torch.

``SharedBuffer.open`` replaces argument ``_STORAGE_DEVICE_ARG`` (6) of the
``(rebuild_cuda_tensor, args)`` pair that ``torch.multiprocessing.reductions.reduce_tensor``
returns for a CUDA tensor by the local index of the exporter's GPU. That position is
torch's: ``rebuild_cuda_tensor(tensor_cls, tensor_size, tensor_stride, tensor_offset,
storage_cls, dtype, storage_device, ...)`` and the tuple ``reduce_tensor`` builds from
``storage._share_cuda_()`` (torch/multiprocessing/reductions.py, checked on torch 2.11 and
2.13). Without a GPU, ``reduce_tensor`` runs its CUDA branch on a CPU tensor whose storage
says it is on CUDA and shares a fake allocation.
"""

from __future__ import annotations

import inspect
import pickle
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.multiprocessing import reductions

from dapo_megatron.refit import ipc

EXPORTER_DEVICE = 2
LOCAL_DEVICE = 5


def test_rebuild_cuda_tensor_takes_the_storage_device_at_the_rewritten_position() -> None:
    names = list(inspect.signature(reductions.rebuild_cuda_tensor).parameters)
    position = ipc._STORAGE_DEVICE_ARG
    found = names[position] if position < len(names) else None
    assert found == "storage_device", (
        f"torch {torch.__version__}: refit/ipc.py rewrites argument {position} of "
        f"rebuild_cuda_tensor as 'storage_device', but its parameters are now {names}; "
        f"update _STORAGE_DEVICE_ARG"
    )


class _CudaLookingStorage:
    """What reduce_tensor's CUDA branch reads from ``tensor._typed_storage()``."""

    _untyped_storage = SimpleNamespace(device=SimpleNamespace(type="cuda"))

    def _share_cuda_(self) -> tuple[Any, ...]:
        # (device, handle, size, offset, ref counter handle, ref counter offset, event, sync)
        return (EXPORTER_DEVICE, b"handle", 64, 0, b"refcount", 0, b"event", True)


def _reduced(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, tuple[Any, ...]]:
    """``reduce_tensor`` of a tensor whose storage shares a (fake) CUDA allocation."""
    monkeypatch.setattr(reductions, "shared_cache", {})
    monkeypatch.setattr(reductions, "StorageWeakRef", lambda storage: None)
    tensor = torch.empty(64, dtype=torch.uint8)
    monkeypatch.setattr(tensor, "_typed_storage", _CudaLookingStorage, raising=False)
    rebuild, args = reductions.reduce_tensor(tensor)
    return rebuild, args


def test_reduce_tensor_puts_the_exporters_device_at_the_rewritten_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rebuild, args = _reduced(monkeypatch)
    assert rebuild is reductions.rebuild_cuda_tensor
    bound = inspect.signature(rebuild).bind(*args)
    assert bound.arguments["storage_device"] == EXPORTER_DEVICE
    assert args[ipc._STORAGE_DEVICE_ARG] == EXPORTER_DEVICE, (
        f"torch {torch.__version__}: reduce_tensor's CUDA args no longer hold the storage "
        f"device at position {ipc._STORAGE_DEVICE_ARG}: {args!r}"
    )


def test_shared_buffer_open_rebuilds_on_the_local_index_of_the_same_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole path: the handle ipc.SharedBuffer.create would pickle, opened in a process
    that sees the exporter's GPU under another index; every other argument unchanged."""
    rebuild, args = _reduced(monkeypatch)
    args = (*args[:4], torch.UntypedStorage, *args[5:])  # picklable stand-in storage class
    handle = pickle.dumps(("cuda_ipc", (rebuild, args), "GPU-fake-uuid"))
    seen: dict[str, Any] = {}
    real = reductions.rebuild_cuda_tensor

    def rebuilt(*call: Any) -> torch.Tensor:
        seen.update(inspect.signature(real).bind(*call).arguments)
        return torch.empty(64, dtype=torch.uint8)

    # The pickled pair names torch's function by reference: unpickling finds this one.
    monkeypatch.setattr(reductions, "rebuild_cuda_tensor", rebuilt)
    monkeypatch.setattr(ipc, "_local_device_index", lambda uuid_: LOCAL_DEVICE)
    ipc.SharedBuffer.open(handle)
    expected = dict(inspect.signature(real).bind(*args).arguments, storage_device=LOCAL_DEVICE)
    assert seen == expected
