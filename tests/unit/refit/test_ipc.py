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
import os
import pickle
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.multiprocessing import reductions

from dapo_megatron.refit import ipc
from dapo_megatron.refit.buckets import plan_buckets
from dapo_megatron.refit.group import WeightGroup
from dapo_megatron.refit.ipc import SharedBuffer, receive_shared, send_shared
from unit.refit.weight_groups import _run_members

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


# ---------------------------------------------------------------------------------------
# The handle transport (refit/ipc.py's SharedBuffer, the CPU twin of CUDA IPC): every
# tensor delivered to every paired receiver; an unlinked buffer stays mapped.


def test_shared_buffers_deliver_every_tensor_to_every_paired_receiver() -> None:
    """Handle transport, CPU twin of CUDA IPC: 2 exporters (one without a paired worker
    would pass None) and 3 receivers, worker j mapping exporter j % 2's buffer."""
    torch.manual_seed(2)
    shapes = [(33, 7), (5,), (128, 3), (2, 2)]
    sent = [(f"w{i}", torch.randn(*s)) for i, s in enumerate(shapes)]
    layout = plan_buckets([(n, t.shape) for n, t in sent], torch.bfloat16, 600)
    assert len(layout.buckets) > 2
    exporters = [SharedBuffer.create(layout.max_bucket_bytes, "cpu") for _ in range(2)]
    handles = [b.handle for b in exporters]

    def role(rank: int, group: WeightGroup):
        if rank < 2:
            return send_shared(iter(sent), layout, group, exporters[rank])
        buffer = SharedBuffer.open(handles[(rank - 2) % 2])
        got = [(n, t.clone()) for n, t in receive_shared(layout, group, buffer, device="cpu")]
        buffer.close()
        return got

    try:
        results = _run_members(2 + 3, role)
    finally:
        for buffer in exporters:
            buffer.close()
    assert results[0].buckets == len(layout.buckets)
    for got in results[2:]:
        assert [n for n, _ in got] == [n for n, _ in sent]
        for (_, want), (_, have) in zip(sent, got, strict=True):
            assert torch.equal(have, want.to(torch.bfloat16))


def test_an_unlinked_shared_buffer_stays_mapped_and_leaves_no_file() -> None:
    """After the peers map it, the creator removes the shm file's name: the memory is still
    shared both ways, /dev/shm holds nothing a killed process could leak, and a late
    ``open`` fails clearly instead of mapping a fresh file of zeros."""
    creator = SharedBuffer.create(64, "cpu")
    _, path, _ = pickle.loads(creator.handle)
    peer = SharedBuffer.open(creator.handle)
    creator.mapped()[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    creator.unlink()
    assert not os.path.exists(path)
    creator.mapped()[4:8] = torch.tensor([5, 6, 7, 8], dtype=torch.uint8)  # after the unlink
    assert peer.mapped()[:8].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    peer.mapped()[8] = 9
    assert int(creator.mapped()[8]) == 9
    with pytest.raises(FileNotFoundError, match="no longer exists"):
        SharedBuffer.open(creator.handle)
    assert not os.path.exists(path)  # the failed open created nothing
    creator.unlink()  # idempotent
    creator.close()
    peer.close()
