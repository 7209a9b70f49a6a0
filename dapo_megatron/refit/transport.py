"""The transport interface of the refit: a sender half and a receiver half per transport.

A transport (``RunPlan.refit_transport``) moves the policy's HF-named tensors, in the order
of the bucket layout, from the policy ranks (sender halves) into the engine workers (receiver
halves):

* ``broadcast`` (``broadcast.py``): policy rank 0 broadcasts each bucket over the weight
  group (NCCL on GPU, gloo on CPU);
* ``ipc`` (``ipc.py``): each exporting policy rank packs a bucket into a buffer its engine
  workers have mapped (CUDA IPC on GPU, shared memory on CPU);
* ``object_store`` (``object_store.py``): the whole model through Ray's object store, the
  fallback; it needs no weight group and no bucket layout, so its two halves are functions.

The collective halves are built (``halves.py``) by the process's end of the refit
(``sender.PolicySender`` on a policy rank, ``receiver.EngineReceiver`` in an engine worker)
once the weight group has formed for the run's transport; the controller drives both ends
(``controller/actors/refitter.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from dapo_megatron.refit.buckets import BucketLayout
    from dapo_megatron.refit.stats import TransferStats


class SenderHalf(Protocol):
    """A policy rank's half of a collective transport."""

    def send(
        self, weights: Iterable[tuple[str, torch.Tensor]], layout: BucketLayout
    ) -> TransferStats | None:
        """Move the export (consumed completely on every rank: its gathers are collective);
        this rank's stats, or None for a rank that only takes part in the export."""
        ...

    def close(self) -> None:
        """Release the group and any buffer (the weight group is formed again later)."""
        ...


class ReceiverHalf(Protocol):
    """An engine worker's half of a collective transport."""

    def receive(
        self, layout: BucketLayout, stats: TransferStats
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the layout as it arrives, for the engine's in-place loader;
        ``stats`` is filled in while the iterator is consumed."""
        ...

    def close(self) -> None:
        """Release the group and any mapped buffer."""
        ...
