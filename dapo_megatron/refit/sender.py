"""A policy rank's end of the refit: its sender half of the run's transport.

``PolicyWorker`` holds one ``PolicySender``; the controller forms the weight group
(``join``), has the exporting ranks share their buffers (``share``, ipc only) and starts each
transfer (``send``) through the worker's typed methods (``controller/actors/refitter.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dapo_megatron.config.refit_transport import RefitTransport
from dapo_megatron.refit.buckets import BucketLayout
from dapo_megatron.refit.group import GroupAddress
from dapo_megatron.refit.halves import halves_of
from dapo_megatron.refit.ipc import IpcSender
from dapo_megatron.refit.stats import TransferStats
from dapo_megatron.refit.transport import SenderHalf


class PolicySender:
    """The sender half of one policy rank, once it has joined the weight group."""

    def __init__(self, rank: int, device: str) -> None:
        self.rank = rank
        """This rank in the policy's world (its rank in the weight group too)."""
        self.device = device
        """The run plan's device: where bucket buffers live."""
        self.half: SenderHalf | None = None
        """The transport's sender half; None until ``join`` (and after ``close``)."""

    def join(self, address: GroupAddress, transport: RefitTransport) -> None:
        """Join the weight group as the transport needs (``halves.py``: rank 0 only for
        the broadcast, every rank for the shared buffer's barriers). A collective
        rendezvous with the engine workers."""
        self.close()
        self.half = halves_of(transport).sender(address, self.rank, self.device)

    def share(self, layout: BucketLayout, exporters: int) -> bytes | None:
        """ipc: ranks below ``exporters`` allocate a shareable bucket buffer (CUDA IPC on
        GPU, shared memory on CPU) and return its handle; the others None."""
        if self.rank >= exporters:
            return None
        if not isinstance(self.half, IpcSender):
            raise RuntimeError("share_buffer needs the ipc transport's weight group")
        return self.half.share(layout, self.device)

    def unlink(self) -> None:
        """ipc: the paired engine workers have mapped the buffer; its file name can go."""
        if isinstance(self.half, IpcSender):
            self.half.unlink()

    def send(
        self, weights: Iterable[tuple[str, torch.Tensor]], layout: BucketLayout
    ) -> TransferStats | None:
        """One transfer of the export (module docstring); this rank's stats or None."""
        if self.half is None:
            raise RuntimeError("send_weights before join_weight_group")
        return self.half.send(weights, layout)

    def close(self) -> None:
        if self.half is not None:
            self.half.close()
            self.half = None
