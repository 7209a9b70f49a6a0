"""Start or join the Ray cluster and reserve devices for the policy ranks.

A local cluster binds to loopback and keeps Ray's token authentication as configured by
the environment (Ray >= 2.60 enables it by default). Under slurm/ray.sub, RAY_ADDRESS
points at the head node and we join it. One placement group holds one bundle per policy
rank (PACK: ranks of a model-parallel group land on the same node when they fit).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from dapo_megatron.config.run_plan import Device
from dapo_megatron.config.schema import ClusterConfig


@dataclass(frozen=True)
class RankResources:
    """What one policy rank asks of Ray."""

    num_cpus: float
    """CPUs per rank (on CPU machines this is also the rank's torch thread count)."""
    num_gpus: float
    """GPUs per rank (1 on GPU clusters, 0 on CPU)."""


# ray.cluster_resources() is unannotated (and wrapped by Ray's client-mode decorator): typed
# here once, as Ray documents it: resource name -> total quantity in the cluster.
_cluster_resources = cast(Callable[[], dict[str, float]], ray.cluster_resources)


def cluster_resources() -> dict[str, float]:
    """Total resources of the running Ray cluster ("CPU", "GPU", "memory", ...)."""
    return dict(_cluster_resources())


def cluster_cpus() -> float:
    """CPUs of the running Ray cluster (1 when it reports none)."""
    return float(cluster_resources().get("CPU", 1))


def start_ray(cluster: ClusterConfig, *, device: Device, num_cpus: int | None = None) -> None:
    """Join RAY_ADDRESS / cluster.ray_address, or start a small local cluster on loopback
    (``device``: the run plan's resolved device kind)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = cluster.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
        return
    ray.init(
        address="local",  # never a stale cluster file from an earlier session
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=256 * 1024 * 1024 if device == "cpu" else None,
        _node_ip_address="127.0.0.1",
        # Ray starts workers at nice 15 by default, below the driver: on a machine with
        # few cores every moment the controller computes (batching, scoring, logging) then
        # preempts a policy rank, and the ranks wait for each other in every collective.
        # The ranks do the run's work; they get the driver's priority.
        _system_config={"worker_niceness": 0},
    )


def rank_resources(
    cluster: ClusterConfig, *, device: Device, device_share: float = 1.0
) -> RankResources:
    """One device per rank on GPU; on CPU, a share of the machine's cores.

    ``device_share`` < 1 leaves the rest of each GPU bundle to a colocated engine actor
    (Ray counts GPUs logically: both processes then see the same device).
    """
    if device == "cuda":
        return RankResources(num_cpus=1, num_gpus=device_share)
    available = cluster_cpus()
    ranks = cluster.num_nodes * cluster.gpus_per_node
    return RankResources(num_cpus=max(0.01, min(1.0, available / ranks)), num_gpus=0)


def reserve_ranks(
    world_size: int,
    resources: RankResources,
    *,
    timeout_s: float = 120.0,
    what: str = "policy ranks",
    devices_per_bundle: int = 1,
) -> PlacementGroup:
    """A placement group with one bundle per rank; a clear error if the cluster cannot fit it.

    A bundle holds ``devices_per_bundle`` whole GPUs when ranks use GPUs (a generation
    engine holds all devices of its tensor-parallel group).
    """
    bundle = {"CPU": resources.num_cpus}
    if resources.num_gpus:
        bundle["GPU"] = float(devices_per_bundle)
    group: PlacementGroup = placement_group(
        [dict(bundle) for _ in range(world_size)], strategy="PACK"
    )
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise RuntimeError(
            f"the Ray cluster cannot place {world_size} {what} of {bundle} within "
            f"{timeout_s:.0f} s (cluster resources: {cluster_resources()}); check "
            f"cluster.num_nodes, cluster.gpus_per_node and cluster.generation_num_devices"
        )
    return group
