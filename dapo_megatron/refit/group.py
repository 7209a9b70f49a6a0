"""A weight-update process group: the exporting policy rank plus every engine worker.

The members already belong to other torch.distributed worlds (the policy's Megatron world,
each vLLM engine's tensor-parallel world), and a process has only one default group. So
this group is a standalone backend object built from its own TCPStore, never registered as
the default group and invisible to Megatron's and vLLM's collectives: NCCL
(``ProcessGroupNCCL``) on GPU, gloo (``ProcessGroupGloo``) on CPU, constructed the way
torch's own ``_new_process_group_helper`` builds them (torch/distributed/distributed_c10d.py)
and used through the same two calls, so the CPU tests run the GPU code path.

Rank 0 hosts the store; its address is a free port on its node, handed to the others by
the controller. Creating the group is a rendezvous: every member must construct it
concurrently (the controller starts all joins before waiting for any).

Every transfer opens with a host-side handshake on that store (``begin_transfer``): the
sending rank sets a per-transfer key, the others wait for it before posting any collective.
With overlapped rollouts (``rollout.max_staleness >= 1``) the engines reach their receive
while the policy still trains its step; a broadcast posted then would be pending for the
whole train step, and NCCL's watchdog aborts a collective pending longer than the group
timeout (gloo's collective times out the same way). A store wait has no watchdog, and a
dead store host (the sender) ends it at once with a connection error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol, cast

import torch
import torch.distributed as dist

Backend = Literal["nccl", "gloo"]

# Store keys of the handshake; the prefix keeps them apart from the backend's own keys.
_READY_KEY = "dapo_refit_sender_ready/"


@dataclass(frozen=True)
class GroupAddress:
    """Where and how to join one weight-update group."""

    host: str
    """Node IP of rank 0 (the store host)."""
    port: int
    """Free TCP port on that node for the store."""
    world_size: int
    """Members: 1 exporter + all engine workers."""
    backend: Backend
    """nccl on GPU, gloo on CPU (the same code either way)."""
    timeout_s: float
    """Collective timeout: a dead member fails the refit after this long instead of hanging."""
    sender_wait_s: float = 24 * 3600.0
    """How long a receiver waits (host-side, ``begin_transfer``) for the sender to start a
    transfer: the sender's whole train step at K >= 1, so far above any step."""


def backend_for(device: torch.device | str) -> Backend:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


class _Backend(Protocol):
    """The calls made on ``ProcessGroupNCCL``/``ProcessGroupGloo``. They have them at runtime,
    but torch's stubs declare the collectives on ``ProcessGroup`` only, not on ``Backend``."""

    def broadcast(self, tensor: torch.Tensor, root: int) -> dist.Work: ...

    def allreduce(self, tensors: list[torch.Tensor]) -> dist.Work: ...

    def shutdown(self) -> None: ...


class WeightGroup:
    """One member's handle on the group (see the module docstring)."""

    _pg: _Backend | None
    """None once closed."""
    _store: dist.TCPStore | None

    def __init__(self, address: GroupAddress, rank: int) -> None:
        if not 0 <= rank < address.world_size:
            raise ValueError(f"rank {rank} outside the weight group of {address.world_size}")
        timeout = timedelta(seconds=address.timeout_s)
        self.rank = rank
        self.world_size = address.world_size
        self.backend = address.backend
        self._sender_wait = timedelta(seconds=address.sender_wait_s)
        # Transfers begun; every member begins every transfer, so the counts agree.
        self._transfers = 0
        self._store = dist.TCPStore(
            address.host,
            address.port,
            address.world_size,
            is_master=rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
        pg: dist.ProcessGroupNCCL | dist.ProcessGroupGloo
        if address.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            pg = dist.ProcessGroupNCCL(self._store, rank, address.world_size, options)
        else:
            pg = dist.ProcessGroupGloo(self._store, rank, address.world_size, timeout)
        self._pg = cast(_Backend, pg)  # see _Backend

    def begin_transfer(self, sender: int) -> None:
        """Every member, before the first collective of every transfer: rank ``sender``
        announces that it is ready; the others wait for that on the store (module doc).

        Raises ``dist.DistError`` if the sender does not start within ``sender_wait_s`` or
        its store is gone (the sender's process died).
        """
        if self._store is None:
            raise AttributeError("the weight group is closed")
        # Keys are never deleted: a sender cannot tell when the last receiver has read one,
        # and a refit adds a few bytes to the store.
        key = f"{_READY_KEY}{self._transfers}"
        self._transfers += 1
        if self.rank == sender:
            self._store.set(key, "1")
        else:
            self._store.wait([key], self._sender_wait)

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> dist.Work:
        """Start a broadcast of ``tensor`` from ``root``; ``.wait()`` the returned work."""
        return self._backend().broadcast(tensor, root)

    def barrier(self) -> None:
        """Wait until every member reached this point (a one-element broadcast round)."""
        flag = torch.zeros(1, dtype=torch.uint8, device=self._device())
        self._backend().allreduce([flag]).wait()

    def _backend(self) -> _Backend:
        if self._pg is None:
            # An AttributeError, as calling a collective on None raised before this check.
            raise AttributeError("the weight group is closed")
        return self._pg

    def _device(self) -> torch.device:
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def close(self) -> None:
        """Release the backend (its sockets / communicators) and the store."""
        pg, self._pg = self._pg, None
        if pg is not None and self.backend == "nccl":
            pg.shutdown()
        del pg
        self._store = None
