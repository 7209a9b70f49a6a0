"""The shared-buffer (ipc) transport of the refit: buckets shared in memory instead of sent.

For engines on the policy's own nodes (colocated vLLM on GPU above all), sending the bytes is
unnecessary: each exporting policy rank packs a bucket into one buffer that its engine
workers map directly, CUDA IPC on GPU (``torch.multiprocessing.reductions.reduce_tensor``,
the mechanism torch's own multiprocessing uses to share CUDA tensors), a shared-memory file
on CPU. The bucket layout, the packing and the loading are the same as for the broadcast
(``buckets``, ``broadcast``): only the handle exchange differs between GPU and CPU, so the CPU
tests cover everything else.

Pairing: engine worker j (counted over all engines) maps the buffer of policy rank
``j % exporters``; colocated, that is the rank on its own GPU. Every policy rank holds the
full tensors during an export (``export_hf_weights`` yields them on every rank), so no
bytes cross devices.

A transfer opens with the group's handshake (``WeightGroup.begin_transfer``, rank 0
announcing). Then per bucket, over the weight group (gloo: two tiny collectives, the data
never goes through it): exporters pack and reach barrier A; receivers copy the bucket out
of the shared buffer and reach barrier B, then load their copy while the exporters pack
the next bucket.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator

import torch

from dapo_megatron.refit.buckets import BucketLayout, pack, unpack
from dapo_megatron.refit.group import WeightGroup
from dapo_megatron.refit.stats import TransferStats

# Position of the device index in the arguments torch.multiprocessing.reductions
# .reduce_tensor returns for rebuild_cuda_tensor (torch/multiprocessing/reductions.py:
# rebuild_cuda_tensor's 7th parameter, storage_device, the first value of
# storage._share_cuda_()); the same in torch 2.11 and 2.13. tests/unit/
# refit/test_ipc.py fails, naming the parameter, if the installed torch moves it.
_STORAGE_DEVICE_ARG = 6


def _local_device_index(uuid_: str) -> int:
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid_:
            return index
    raise RuntimeError(
        f"the refit buffer lives on GPU {uuid_}, which this process does not see "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): the ipc "
        "transport needs each engine worker on its exporting policy rank's node and devices"
    )


class SharedBuffer:
    """A byte buffer another process on the same node can map (CUDA IPC or a shm file)."""

    def __init__(self, tensor: torch.Tensor, handle: bytes, path: str | None) -> None:
        self.tensor: torch.Tensor | None = tensor
        """The mapped uint8 buffer; None once closed."""
        self.handle = handle
        """Opaque, picklable-safe bytes that ``SharedBuffer.open`` maps in another process."""
        self._path = path

    @classmethod
    def create(cls, nbytes: int, device: torch.device | str) -> SharedBuffer:
        device = torch.device(device)
        if device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
            uuid_ = str(torch.cuda.get_device_properties(tensor.device).uuid)
            return cls(tensor, pickle.dumps(("cuda_ipc", reduce_tensor(tensor), uuid_)), None)
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        path = os.path.join(directory, f"dapo-refit-{uuid.uuid4().hex}")
        tensor = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        return cls(tensor, pickle.dumps(("file", path, nbytes)), path)

    @classmethod
    def open(cls, handle: bytes) -> SharedBuffer:
        kind, *args = pickle.loads(handle)
        if kind == "cuda_ipc":
            (rebuild, rebuild_args), uuid_ = args
            # The handle names the exporter's device by ITS index; a process with other
            # visible devices (a colocated engine worker sees several) finds the same GPU
            # by UUID. Argument 6 of torch's rebuild_cuda_tensor is the storage device.
            rebuild_args = list(rebuild_args)
            rebuild_args[_STORAGE_DEVICE_ARG] = _local_device_index(uuid_)
            return cls(rebuild(*rebuild_args), handle, None)
        path, nbytes = args
        # torch.from_file creates a missing file: a late peer would map fresh zeros.
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"refit buffer {path} no longer exists: its policy rank removed the name "
                f"once its engine workers had mapped it (SharedBuffer.unlink), or died. A "
                f"worker that joins later needs new handles (the weight group is formed again)"
            )
        return cls(torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8), handle, None)

    def mapped(self) -> torch.Tensor:
        """``tensor``, or AttributeError once closed (as using the None left by close did)."""
        if self.tensor is None:
            raise AttributeError("the shared buffer is closed")
        return self.tensor

    def unlink(self) -> None:
        """Creator, CPU: remove the shm file's name once every peer has mapped it. The
        memory lives on in the mappings and is freed with the last of them, so a process
        killed later (SIGKILL runs no cleanup) leaves nothing in /dev/shm; no process can
        ``open`` the handle afterwards. No-op for CUDA IPC, a peer, or a second call."""
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
            self._path = None

    def close(self) -> None:
        """Unmap; the creator also removes the shm file if still named (``unlink``)."""
        self.tensor = None
        self.unlink()


def send_shared(
    weights: Iterable[tuple[str, torch.Tensor]],
    layout: BucketLayout,
    group: WeightGroup,
    buffer: SharedBuffer | None,
) -> TransferStats:
    """Exporter side (every policy rank: ``buffer`` None for a rank with no paired engine
    worker, which still takes part in the barriers)."""
    start = time.perf_counter()
    shared = None if buffer is None else buffer.mapped()
    stats = TransferStats(buffer_bytes=0 if shared is None else shared.numel())
    # Rank 0 announces for every exporter: they leave the train step together.
    group.begin_transfer(0)
    source = iter(weights)
    for bucket in layout.buckets:
        tensors = [next(source) for _ in bucket.slots]
        if shared is not None:
            pack(bucket, tensors, shared)
            if shared.device.type == "cuda":
                torch.cuda.current_stream().synchronize()
        del tensors
        group.barrier()  # A: the bucket is in every exporter's buffer
        group.barrier()  # B: every receiver has its own copy; the buffer may be reused
        stats.buckets += 1
        stats.tensors += len(bucket.slots)
        stats.bytes += bucket.nbytes
    if next(source, None) is not None:
        raise ValueError("the export has more tensors than the bucket layout")
    stats.seconds = time.perf_counter() - start
    return stats


def receive_shared(
    layout: BucketLayout,
    group: WeightGroup,
    buffer: SharedBuffer,
    *,
    device: torch.device | str,
    stats: TransferStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Receiver side: every tensor of the layout, copied out of the exporter's buffer."""
    stats = stats if stats is not None else TransferStats()
    group.begin_transfer(0)  # no barrier is posted before the exporters are ready
    start = time.perf_counter()  # the transfer, not the wait for the exporters' train step
    for bucket in layout.buckets:
        group.barrier()  # A
        own = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
        own.copy_(buffer.mapped()[: bucket.nbytes])
        if own.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        group.barrier()  # B
        stats.buckets += 1
        stats.tensors += len(bucket.slots)
        stats.bytes += bucket.nbytes
        stats.buffer_bytes = max(stats.buffer_bytes, bucket.nbytes)
        for name, tensor in unpack(bucket, own):
            stats.names.append(name)
            yield name, tensor
        del own
    stats.seconds = time.perf_counter() - start


class IpcSender:
    """A policy rank's half (``transport.SenderHalf``): every rank is a group member (the
    per-bucket barriers); ranks paired with engine workers export into a shared buffer."""

    def __init__(self, group: WeightGroup) -> None:
        self.group: WeightGroup | None = group
        """The weight group (every policy rank joins it)."""
        self.buffer: SharedBuffer | None = None
        """This rank's shared bucket buffer (``share``), None for a rank with no engine
        worker paired with it."""

    def share(self, layout: BucketLayout, device: torch.device | str) -> bytes:
        """Allocate the shared bucket buffer (anew: engines restarted map a new one);
        its handle for the paired engine workers."""
        if self.buffer is not None:
            self.buffer.close()
        self.buffer = SharedBuffer.create(layout.max_bucket_bytes, device)
        return self.buffer.handle

    def unlink(self) -> None:
        """Every paired engine worker has mapped the buffer: its shm file needs no name
        any more (nothing left behind if this process dies)."""
        if self.buffer is not None:
            self.buffer.unlink()

    def send(
        self, weights: Iterable[tuple[str, torch.Tensor]], layout: BucketLayout
    ) -> TransferStats | None:
        if self.group is None:
            raise RuntimeError("a refit send after the weight group was closed")
        return send_shared(weights, layout, self.group, self.buffer)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None


class IpcReceiver:
    """An engine worker's half (``transport.ReceiverHalf``): copies each bucket out of the
    mapped buffer of the policy rank it is paired with."""

    def __init__(self, group: WeightGroup, buffer: SharedBuffer, device: torch.device | str):
        self.group: WeightGroup | None = group
        """The weight group this worker joined (None once closed)."""
        self.buffer = buffer
        """The exporter's buffer, mapped."""
        self.device = device
        """Where the copied buckets land: the engine's device."""

    def receive(
        self, layout: BucketLayout, stats: TransferStats
    ) -> Iterator[tuple[str, torch.Tensor]]:
        if self.group is None:
            raise RuntimeError("a refit receive after the weight group was closed")
        return receive_shared(layout, self.group, self.buffer, device=self.device, stats=stats)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
