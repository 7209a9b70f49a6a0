"""Where each actor runs: the Ray options of policy ranks and generation engines.

One function per kind, used by the worker groups AND by the CPU test that checks the GPU
bookkeeping against a Ray cluster started with declared GPUs (``ray.init(num_gpus=8)`` on a
machine without any), so the colocated placement that only a GPU cluster runs is still
scheduled, and its device visibility checked, in CI.

* policy rank r: bundle r of the policy's placement group, ``device_share`` of its GPU
  (0.5 when a vLLM engine shares the device, else 1), 1 CPU on GPU clusters.
* colocated engine e (TP t): bundle e*t of the POLICY's placement group with the other half
  of that GPU; it must see the devices of policy ranks e*t .. e*t+t-1, which Ray cannot
  express (an actor gets devices only from its own bundle), so the engine actor sets
  ``CUDA_VISIBLE_DEVICES`` itself before CUDA starts, and vLLM's multiprocessing workers
  (children of the actor) inherit it (vllm_backend: explicit ``mp`` executor for TP > 1).
* split engine e: bundle e of a placement group of its own, each bundle holding all t GPUs
  of the engine (``{"GPU": t}``), so Ray's own ``CUDA_VISIBLE_DEVICES`` already lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dapo_megatron.config.run_plan import COLOCATED_SHARE, Device
from dapo_megatron.config.schema import ClusterConfig
from dapo_megatron.controller.cluster import (
    RankResources,
    cluster_cpus,
    rank_resources,
    reserve_ranks,
)


@dataclass(frozen=True)
class ActorPlacement:
    """How to start one actor."""

    options: dict[str, Any]
    """Keyword arguments of ``ray.remote(cls).options(...)``."""
    num_threads: int
    """torch intra-op threads of the actor."""
    visible_devices: str | None
    """CUDA_VISIBLE_DEVICES the actor sets for itself (colocated engines), else None."""


def _options(
    num_cpus: float, num_gpus: float, group: PlacementGroup, bundle: int
) -> dict[str, Any]:
    return {
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=bundle
        ),
    }


def policy_placements(
    group: PlacementGroup, world_size: int, resources: RankResources, split_engines: int = 0
) -> list[ActorPlacement]:
    """One placement per policy rank, rank r on bundle r; ``split_engines``: the devices
    (processes, on CPU) of split-mode engines running beside the ranks."""
    threads = max(1, int(resources.num_cpus))
    if not resources.num_gpus:
        # On CPU the ranks share the machine's cores with the split engines' processes: an
        # equal share of intra-op threads each (one thread per process when processes >=
        # cores avoids oversubscription; a single rank on a 2-core machine gets both cores,
        # but only one when an engine generates on the other, overlapped or not).
        threads = max(1, int(cluster_cpus()) // max(1, world_size + split_engines))
    return [
        ActorPlacement(_options(resources.num_cpus, resources.num_gpus, group, r), threads, None)
        for r in range(world_size)
    ]


def colocated_engine_placements(
    policy_group: PlacementGroup, policy_device_ids: list[str], count: int, tp: int
) -> list[ActorPlacement]:
    """Engines sharing the policy's GPUs (module docstring); ``policy_device_ids[r]`` is the
    device id Ray gave policy rank r."""
    if count * tp > len(policy_device_ids):
        raise ValueError(
            f"{count} colocated engines of TP{tp} need {count * tp} policy devices, the "
            f"policy has {len(policy_device_ids)}"
        )
    return [
        ActorPlacement(
            _options(0.0, COLOCATED_SHARE, policy_group, e * tp),
            1,
            ",".join(policy_device_ids[e * tp : (e + 1) * tp]),
        )
        for e in range(count)
    ]


def split_engine_placements(
    cluster: ClusterConfig, count: int, tp: int, *, device: Device
) -> tuple[PlacementGroup, list[ActorPlacement]]:
    """Reserve a placement group for ``count`` engines of TP ``tp``; their placements."""
    cuda = device == "cuda"
    resources = rank_resources(cluster, device=device)
    group = reserve_ranks(count, resources, what="generation engines", devices_per_bundle=tp)
    num_gpus = tp if resources.num_gpus else 0
    threads = max(1, int(resources.num_cpus)) if cuda else 1
    return group, [
        ActorPlacement(_options(resources.num_cpus, num_gpus, group, e), threads, None)
        for e in range(count)
    ]
