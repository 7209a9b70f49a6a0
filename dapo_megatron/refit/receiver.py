"""An engine worker's end of the refit: its receiver half of the run's transport.

One ``EngineReceiver`` per engine worker process: the Megatron engine holds one, and so
does each vLLM worker process (``generation/vllm_worker.py``'s extension), so both engines
receive through the same code. The fault hook of the restart tests (``faults.py``) and the
check that the engine consumed every tensor sit here, once.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dapo_megatron.refit.broadcast import BroadcastReceiver
from dapo_megatron.refit.buckets import RefitPlan
from dapo_megatron.refit.faults import exit_midway_if_asked
from dapo_megatron.refit.group import GroupAddress, WeightGroup
from dapo_megatron.refit.ipc import IpcReceiver, SharedBuffer
from dapo_megatron.refit.stats import TransferStats
from dapo_megatron.refit.transport import ReceiverHalf


class EngineReceiver:
    """The weight group an engine worker joined and the buffer it mapped (ipc)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = device
        """Where received buckets land: the engine's device."""
        self.group: WeightGroup | None = None
        """The weight group, from ``join`` until ``close``."""
        self.buffer: SharedBuffer | None = None
        """ipc: the paired policy rank's buffer, mapped (``attach``)."""
        self.refits = 0
        """Collective refits started here (the fault hook's counter)."""

    def join(self, address: GroupAddress, rank: int) -> None:
        """Join the weight group as ``rank`` (a collective rendezvous)."""
        self.close()
        self.group = WeightGroup(address, rank)

    def attach(self, handle: bytes) -> None:
        """ipc: map the buffer of the policy rank this worker is paired with."""
        self.buffer = SharedBuffer.open(handle)

    def receive(
        self, plan: RefitPlan, stats: TransferStats, *, shared: bool
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The plan's tensors as they arrive (``shared``: from the mapped buffer, else
        broadcast), for the engine's in-place loader; ``stats`` fills in meanwhile."""
        if self.group is None:
            raise RuntimeError("receive_weights before join_weight_group")
        half: ReceiverHalf
        if shared:
            if self.buffer is None:
                raise RuntimeError("a shared-buffer refit before attach_shared")
            half = IpcReceiver(self.group, self.buffer, self.device)
        else:
            half = BroadcastReceiver(self.group, self.device)
        self.refits += 1
        return exit_midway_if_asked(half.receive(plan, stats), self.refits)

    @staticmethod
    def check_complete(plan: RefitPlan, stats: TransferStats) -> None:
        """Raise when the engine's loader stopped before the plan's last tensor (the
        rest would never be received, and the sender would wait for it)."""
        if stats.tensors != plan.num_tensors:
            raise RuntimeError(
                f"the engine's reload consumed {stats.tensors} of the refit's "
                f"{plan.num_tensors} tensors; the rest were never received"
            )

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
