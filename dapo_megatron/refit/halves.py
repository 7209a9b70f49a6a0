"""Which sender and receiver halves move the bytes of a collective refit transport.

The transport is chosen once (``config/refit_transport.py``, ``RunPlan.refit_transport``);
this table maps it to the classes of its two halves, so neither end of the refit compares
transport names. The object store has no halves here: it needs no weight group
(``object_store.py``'s two functions, called by the controller's ``Refitter``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dapo_megatron.config.refit_transport import RefitTransport
from dapo_megatron.refit.broadcast import BroadcastReceiver, BroadcastSender
from dapo_megatron.refit.group import GroupAddress, WeightGroup
from dapo_megatron.refit.ipc import IpcReceiver, IpcSender, SharedBuffer
from dapo_megatron.refit.transport import ReceiverHalf, SenderHalf


def _broadcast_sender(address: GroupAddress, rank: int, device: str) -> SenderHalf:
    # Rank 0 hosts the store and sends; the others only take part in the export's gathers.
    return BroadcastSender(WeightGroup(address, rank) if rank == 0 else None, device)


def _ipc_sender(address: GroupAddress, rank: int, device: str) -> SenderHalf:
    # Every policy rank is a member: all take part in the per-bucket barriers.
    return IpcSender(WeightGroup(address, rank))


def _broadcast_receiver(
    group: WeightGroup, buffer: SharedBuffer | None, device: torch.device | str
) -> ReceiverHalf:
    return BroadcastReceiver(group, device)


def _ipc_receiver(
    group: WeightGroup, buffer: SharedBuffer | None, device: torch.device | str
) -> ReceiverHalf:
    if buffer is None:
        raise RuntimeError("a shared-buffer refit before attach_shared")
    return IpcReceiver(group, buffer, device)


@dataclass(frozen=True)
class Halves:
    """How one collective transport's two ends are built."""

    sender: Callable[[GroupAddress, int, str], SenderHalf]
    """(weight group address, policy rank, device) -> the rank's half; joins the group."""
    receiver: Callable[[WeightGroup, SharedBuffer | None, torch.device | str], ReceiverHalf]
    """(the joined group, the mapped buffer if any, the engine's device) -> the half."""


_HALVES: dict[RefitTransport, Halves] = {
    RefitTransport.BROADCAST: Halves(_broadcast_sender, _broadcast_receiver),
    RefitTransport.IPC: Halves(_ipc_sender, _ipc_receiver),
}


def halves_of(transport: RefitTransport | str) -> Halves:
    """The halves of a collective transport (its name is accepted too: it may have
    crossed a process boundary as a plain string); ValueError for the object store."""
    halves = _HALVES.get(RefitTransport(transport))
    if halves is None:
        raise ValueError(f"{transport!r} is not a collective refit transport")
    return halves
