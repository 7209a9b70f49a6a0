"""The broadcast transport of the refit: a layout's buckets streamed to every engine worker.

Sender (policy rank 0): packs the exported tensors into ONE bucket buffer and broadcasts it
over the weight group, so the sender holds at most that buffer plus the one tensor the
exporter is producing (together <= 2 buckets when no tensor exceeds the bucket size), never
the whole model. (Two alternating buffers would let packing overlap the transfer, at the
cost of a third bucket of memory; measured on CPU the pack is ~10% of a refit, so memory wins.)

Both sides open a transfer with the group's handshake (``WeightGroup.begin_transfer``), so a
receiver that arrives early waits host-side instead of in a collective.

Receiver (each engine worker): an iterator of ``(name, tensor)`` that receives bucket k + 1
in the background while the consumer loads bucket k. It is handed straight to the
engine's loader (vLLM's ``reload_weights(weights_iterator=...)`` inside each TP worker,
``load_hf_tensors`` for a Megatron engine), so the weights land in place bucket by bucket.
A fresh buffer per bucket: vLLM's layerwise reload may keep references to a layer's
tensors until the layer is complete, so a received buffer is never overwritten.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from dapo_megatron.refit.buckets import BucketLayout, pack, unpack
from dapo_megatron.refit.group import WeightGroup
from dapo_megatron.refit.stats import TransferStats


def send_buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
    layout: BucketLayout,
    group: WeightGroup,
    *,
    device: torch.device | str,
    root: int = 0,
) -> TransferStats:
    """Broadcast ``weights`` (the export, in layout order) bucket by bucket from ``root``.

    Consumes the iterator completely. Raises ValueError when the export and the layout
    disagree (name, shape, or count).
    """
    start = time.perf_counter()
    stats = TransferStats()
    group.begin_transfer(root)  # the receivers may post their broadcasts now
    source = iter(weights)
    size = layout.max_bucket_bytes
    buffers = [
        torch.empty(size, dtype=torch.uint8, device=device)
        for _ in range(min(1, len(layout.buckets)))
    ]
    stats.buffer_bytes = size * len(buffers)
    pending: list[dist.Work | None] = [None] * len(buffers)
    for k, bucket in enumerate(layout.buckets):
        slot = k % len(buffers)
        previous = pending[slot]
        if previous is not None:
            previous.wait()  # the buffer's previous bucket has left
        tensors: list[tuple[str, torch.Tensor]] = []
        for _ in bucket.slots:
            item = next(source, None)
            if item is None:
                raise ValueError(
                    f"the export ended after {stats.tensors + len(tensors)} tensors; the bucket "
                    f"layout has {layout.num_tensors}"
                )
            tensors.append(item)
        pack(bucket, tensors, buffers[slot])
        del tensors
        if buffers[slot].device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        pending[slot] = group.broadcast(buffers[slot][: bucket.nbytes], root)
        stats.buckets += 1
        stats.tensors += len(bucket.slots)
        stats.bytes += bucket.nbytes
    for work in pending:
        if work is not None:
            work.wait()
    extra = next(source, None)
    if extra is not None:
        raise ValueError(
            f"the export has more tensors than the bucket layout ({extra[0]} is extra)"
        )
    stats.seconds = time.perf_counter() - start
    return stats


def receive_buckets(
    layout: BucketLayout,
    group: WeightGroup,
    *,
    device: torch.device | str,
    root: int = 0,
    stats: TransferStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every tensor of the layout as it arrives (see the module docstring).

    The next bucket's broadcast is posted before the current one's tensors are yielded, so
    the transfer overlaps the consumer's loading. ``stats`` (optional) is filled in.
    """
    stats = stats if stats is not None else TransferStats()

    def post(k: int) -> tuple[torch.Tensor, dist.Work]:
        buffer = torch.empty(layout.buckets[k].nbytes, dtype=torch.uint8, device=device)
        return buffer, group.broadcast(buffer, root)

    # Nothing is posted before the sender is ready (it may still be training: group.py).
    group.begin_transfer(root)
    start = time.perf_counter()  # the transfer, not the wait for the sender's train step
    ahead = post(0) if layout.buckets else None
    for k, bucket in enumerate(layout.buckets):
        assert ahead is not None  # posted for every bucket, k = 0 before the loop
        buffer, work = ahead
        work.wait()
        ahead = post(k + 1) if k + 1 < len(layout.buckets) else None
        stats.buckets += 1
        stats.bytes += bucket.nbytes
        stats.tensors += len(bucket.slots)
        stats.buffer_bytes = max(
            stats.buffer_bytes, bucket.nbytes + (0 if ahead is None else ahead[0].numel())
        )
        for name, tensor in unpack(bucket, buffer):
            stats.names.append(name)
            yield name, tensor
        del buffer
    stats.seconds = time.perf_counter() - start


class BroadcastSender:
    """A policy rank's half (``transport.SenderHalf``): rank 0, the group's only policy
    member, broadcasts; the other ranks take part in the export's gathers only."""

    def __init__(self, group: WeightGroup | None, device: torch.device | str) -> None:
        self.group = group
        """The weight group (rank 0), or None (every other policy rank)."""
        self.device = device
        """Where the bucket buffer lives: the run plan's device."""

    def send(
        self, weights: Iterable[tuple[str, torch.Tensor]], layout: BucketLayout
    ) -> TransferStats | None:
        if self.group is None:
            for _ in weights:  # the export's collectives need every rank
                pass
            return None
        return send_buckets(weights, layout, self.group, device=self.device)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


class BroadcastReceiver:
    """An engine worker's half (``transport.ReceiverHalf``): receives every bucket."""

    def __init__(self, group: WeightGroup, device: torch.device | str) -> None:
        self.group: WeightGroup | None = group
        """The weight group this worker joined (None once closed)."""
        self.device = device
        """Where the received buckets land: the engine's device."""

    def receive(
        self, layout: BucketLayout, stats: TransferStats
    ) -> Iterator[tuple[str, torch.Tensor]]:
        if self.group is None:
            raise RuntimeError("a refit receive after the weight group was closed")
        return receive_buckets(layout, self.group, device=self.device, stats=stats)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
