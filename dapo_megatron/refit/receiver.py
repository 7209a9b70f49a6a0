"""An engine worker's end of the refit: its receiver half of the run's transport.

One ``EngineReceiver`` per engine worker process: the Megatron engine holds one, and so
does each vLLM worker process (``generation/vllm_worker.py``'s extension), so both engines
receive through the same code. The fault hook of the restart tests (``faults.py``) and the
check that the engine consumed every tensor sit here, once.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dapo_megatron.config.refit_transport import RefitTransport
from dapo_megatron.refit.buckets import BucketLayout
from dapo_megatron.refit.faults import exit_midway_if_asked
from dapo_megatron.refit.group import GroupAddress, WeightGroup
from dapo_megatron.refit.halves import Halves, halves_of
from dapo_megatron.refit.ipc import SharedBuffer
from dapo_megatron.refit.stats import TransferStats


class EngineReceiver:
    """The weight group an engine worker joined and the buffer it mapped (ipc)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = device
        """Where received buckets land: the engine's device."""
        self.group: WeightGroup | None = None
        """The weight group, from ``join`` until ``close``."""
        self.halves: Halves | None = None
        """The joined transport's halves (``join``)."""
        self.buffer: SharedBuffer | None = None
        """ipc: the paired policy rank's buffer, mapped (``attach``)."""
        self.refits = 0
        """Collective refits started here (the fault hook's counter)."""

    def join(self, address: GroupAddress, rank: int, transport: RefitTransport | str) -> None:
        """Join the weight group as ``rank`` (a collective rendezvous) for the run's
        ``transport``, which decides how every later ``receive`` gets its bytes."""
        self.close()
        self.halves = halves_of(transport)
        self.group = WeightGroup(address, rank)

    def attach(self, handle: bytes) -> None:
        """Shared-buffer transport: map the buffer of the policy rank this worker is
        paired with."""
        self.buffer = SharedBuffer.open(handle)

    def receive(
        self, layout: BucketLayout, stats: TransferStats
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The layout's tensors as they arrive through the joined transport, for the
        engine's in-place loader; ``stats`` fills in meanwhile."""
        if self.group is None or self.halves is None:
            raise RuntimeError("receive_weights before join_weight_group")
        half = self.halves.receiver(self.group, self.buffer, self.device)
        self.refits += 1
        return exit_midway_if_asked(half.receive(layout, stats), self.refits)

    @staticmethod
    def check_complete(layout: BucketLayout, stats: TransferStats) -> None:
        """Raise when the engine's loader stopped before the layout's last tensor (the
        rest would never be received, and the sender would wait for it)."""
        if stats.tensors != layout.num_tensors:
            raise RuntimeError(
                f"the engine's reload consumed {stats.tensors} of the refit's "
                f"{layout.num_tensors} tensors; the rest were never received"
            )

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
