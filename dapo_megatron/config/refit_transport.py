"""The refit transport, chosen once: its name, what it needs, its memory terms, its checks.

``generation.refit_transport`` is resolved once, by ``choose_refit_transport`` (the one
factory; ``RunPlan.refit_transport`` holds its result), into a ``RefitTransport``. Every
other module asks the transport what it needs instead of comparing its name: the
controller's ``Refitter`` (whether a weight group is needed, who joins it, over which
backend), config validation (``cluster_problems``: its constraints on the cluster), the memory
plan (its buffer terms), the engines (``refit/halves.py`` maps it to its sender and
receiver halves). A ``RefitTransport`` is a ``str``, so it crosses Ray and vLLM's
``collective_rpc`` as its name and compares equal to it.

This module is pure configuration (no torch): the halves that move the bytes live in
``dapo_megatron/refit/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from dapo_megatron.config.schema import ClusterConfig
    from dapo_megatron.config.schema_policy import GenerationConfig

WeightGroupBackend = Literal["nccl", "gloo"]


@dataclass(frozen=True)
class _Traits:
    """What one transport needs and costs (the table below)."""

    collective: bool
    """A weight group and a bucket layout: ``Refitter.start`` only submits calls."""
    shared_buffer: bool
    """Engine workers map the exporting policy ranks' bucket buffers (same node only);
    every policy rank joins the weight group for the per-bucket barriers."""
    receive_buffers: int
    """Bucket buffers alive at once in an engine worker: the broadcast posts the next
    bucket's receive while the current one loads."""


class RefitTransport(StrEnum):
    """A resolved ``generation.refit_transport`` (module docstring)."""

    BROADCAST = "broadcast"
    """Policy rank 0 broadcasts each bucket over the weight group (NCCL on GPU, gloo on CPU)."""
    IPC = "ipc"
    """Each exporting policy rank packs a bucket into a buffer its engine workers map (CUDA
    IPC on GPU, shared memory on CPU); gloo carries only the barriers."""
    OBJECT_STORE = "object_store"
    """The whole model through Ray's object store (the fallback: no group, no buckets)."""

    @property
    def _traits(self) -> _Traits:
        return _TRAITS[self]

    def needs_group(self) -> bool:
        """Whether it moves buckets over a weight group (broadcast, ipc), which the
        controller joins once, so that a refit is submitted without waiting for the policy;
        the object store exports first, into engines that are awake."""
        return self._traits.collective

    @property
    def shared_buffer(self) -> bool:
        """Whether engine workers map the exporting ranks' buffers (ipc)."""
        return self._traits.shared_buffer

    @property
    def receive_buffers(self) -> int:
        """Bucket buffers alive at once in an engine worker during a refit (memory plan)."""
        return self._traits.receive_buffers

    def group_senders(self, policy_ranks: int) -> int:
        """Policy ranks in the weight group: every rank for the shared buffer's barriers,
        else rank 0, the one that broadcasts."""
        return policy_ranks if self.shared_buffer else 1

    def group_backend(self, device: str) -> WeightGroupBackend:
        """The weight group's backend: gloo for the shared buffer's barriers (the bytes go
        through the buffer), else the device's collective backend (NCCL on GPU)."""
        return "gloo" if self.shared_buffer or device != "cuda" else "nccl"

    def bucket_exporters(self, policy_ranks: int, engine_workers: int) -> int:
        """Policy ranks 0..n-1 that own a bucket buffer: one per engine worker up to the
        policy's ranks (shared buffer: engine worker j maps rank j % n), else rank 0."""
        return min(policy_ranks, engine_workers) if self.shared_buffer else 1

    def cluster_problems(
        self, generation: GenerationConfig, cluster: ClusterConfig, colocated_from: str
    ) -> list[str]:
        """This transport's constraints on the cluster, one message each (empty when they
        hold); ``colocated_from``: where ``cluster.colocated`` was set, for the message."""
        problems: list[str] = []
        if self.shared_buffer and cluster.num_nodes > 1 and not cluster.colocated:
            problems.append(
                "ipc shares memory between processes of one node; split engines on a "
                "multi-node cluster need generation.refit_transport=broadcast (or auto)"
            )
        # A weight group over NCCL on GPU puts policy rank 0 and the engine worker on its GPU
        # into one communicator, and NCCL refuses two ranks of a communicator on one device
        # (gloo on CPU would not, but a colocated vLLM engine runs on GPUs only: cuda, or auto).
        nccl_group = self.needs_group() and self.group_backend("cuda") == "nccl"
        if nccl_group and generation.backend == "vllm" and cluster.colocated:
            problems.append(
                f"{self} cannot reach colocated engines (cluster.colocated = true, set in "
                f"{colocated_from}): NCCL cannot hold two ranks of one communicator (a policy "
                f"rank and the engine worker beside it) on one GPU; use "
                f"generation.refit_transport=ipc (or auto: ipc colocated on GPU), or "
                f"cluster.colocated=false with cluster.generation_num_devices"
            )
        return problems


_TRAITS: dict[RefitTransport, _Traits] = {
    RefitTransport.BROADCAST: _Traits(collective=True, shared_buffer=False, receive_buffers=2),
    RefitTransport.IPC: _Traits(collective=True, shared_buffer=True, receive_buffers=1),
    RefitTransport.OBJECT_STORE: _Traits(collective=False, shared_buffer=False, receive_buffers=0),
}


def choose_refit_transport(
    generation: GenerationConfig, cluster: ClusterConfig, device: str
) -> RefitTransport:
    """The factory: ``generation.refit_transport`` with ``auto`` resolved (ipc colocated on
    GPU, where NCCL cannot put a policy rank and its neighbour engine in one
    communicator; broadcast otherwise)."""
    named = _named(generation)
    if named is not None:
        return named
    shares_gpus = cluster.colocated and device == "cuda"
    return RefitTransport.IPC if shares_gpus else RefitTransport.BROADCAST


def _named(generation: GenerationConfig) -> RefitTransport | None:
    """The transport the config names; None for ``auto`` (resolved with the device)."""
    value = generation.refit_transport
    return None if value == "auto" else RefitTransport(value)


def refit_transport_problems(
    generation: GenerationConfig, cluster: ClusterConfig, colocated_from: str
) -> list[str]:
    """The transport's constraints on the cluster, as ``validate_config`` reports them for
    ``generation.refit_transport`` (empty when they hold; ``auto`` always fits).
    ``colocated_from``: where ``cluster.colocated`` was set, for the message."""
    transport = _named(generation)
    if transport is None:
        return []
    return transport.cluster_problems(generation, cluster, colocated_from)
