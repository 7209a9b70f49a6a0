"""Where each actor runs: the Ray options of policy ranks and generation engines.

One function per kind, used by the worker groups AND by the CPU tests that check the GPU
bookkeeping against Ray clusters with declared GPUs (``ray.init(num_gpus=8)``, and
``ray.cluster_utils.Cluster`` with several 8-GPU nodes, on machines without any), so the
placement that only a GPU cluster runs is still scheduled, and its device visibility
checked, in CI.

Ranks go to SLOTS, not bundle indices: slot r is the r-th bundle in (node, GPU id) order
(cluster.Reservation; Ray's bundle index says nothing about the node).

* policy rank r: slot r of the policy's reservation, ``device_share`` of its GPU (0.5 when
  a vLLM engine shares the device, else 1), 1 CPU on GPU clusters. Ranks follow Megatron's
  default order (``tp-cp-ep-dp-pp``, TP fastest, EP 1), so a TP group is a run of TP
  consecutive slots, hence on one node; ``check_policy_nodes`` verifies it (and that a CP
  group spans no more nodes than TP x CP needs) against where Ray actually put them. MoE
  layouts (EP > 1) have expert groups too (Megatron's expert RankGenerator, expert TP =
  TP: config/rank_groups.py): the EP group of the token all-to-all and the expert TP x EP
  group must span no more nodes than the layout itself implies (an error, like TP/CP, when
  the placement spreads them further); when the layout itself puts an EP group on several
  nodes (TP x EP not a divisor of gpus_per_node) that is a slowdown the config chose, and
  a warning naming the keys is returned and printed instead.
* colocated engine e (TP t): the bundle of slot e*t of the POLICY's reservation with the
  other half of that GPU; it must see the devices of policy ranks e*t .. e*t+t-1 (checked
  to be on its node), which Ray cannot express (an actor gets devices only from its own
  bundle), so the engine actor sets ``CUDA_VISIBLE_DEVICES`` itself before CUDA starts,
  and vLLM's multiprocessing workers (children of the actor) inherit it (vllm_backend:
  explicit ``mp`` executor for TP > 1).
* split engine e: slot e of a reservation of its own, each bundle holding all t GPUs of
  the engine (``{"GPU": t}``, one node by construction), so Ray's own
  ``CUDA_VISIBLE_DEVICES`` already lists them.

The node checks apply to GPU bundles only: on CPU, gloo ranks talk across nodes as well as
within one, and Ray packs CPU shares wherever they fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.rank_groups import (
    expert_groups,
    expert_layout_warning,
    nodes_spanned,
    packed_nodes,
)
from dapo_megatron.config.run_plan import COLOCATED_SHARE, Device, RunPlan
from dapo_megatron.config.schema import ClusterConfig
from dapo_megatron.controller.actors.cluster import (
    RankResources,
    Reservation,
    cluster_cpus,
    rank_resources,
    reserve_ranks,
)

# How many offending groups an error lists before "and N more".
_SHOWN = 4


class PlacementError(RuntimeError):
    """Ray put ranks that must share a node on different nodes."""


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


def tp_groups(dims: ParallelDims) -> list[list[int]]:
    """Ranks of each tensor-parallel group in Megatron's default order: TP consecutive."""
    return [list(range(s, s + dims.tp)) for s in range(0, dims.world_size, dims.tp)]


def cp_groups(dims: ParallelDims) -> list[list[int]]:
    """Ranks of each context-parallel group in Megatron's default order: CP comes right
    after TP, so a CP group strides by TP inside a block of TP x CP consecutive ranks."""
    block = dims.tp * dims.cp
    return [
        [start + t + dims.tp * c for c in range(dims.cp)]
        for start in range(0, dims.world_size, block)
        for t in range(dims.tp)
    ]


def _spread(ranks: Sequence[int], nodes: Sequence[str]) -> str:
    """ "ranks 0-1 on A, ranks 2-3 on B": which of ``ranks`` sit on which node."""
    by_node: dict[str, list[int]] = {}
    for r in ranks:
        by_node.setdefault(nodes[r], []).append(r)
    return ", ".join(
        f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} on {node}"
        for node, rs in by_node.items()
    )


def _expert_problems(nodes: Sequence[str], dims: ParallelDims, gpus_per_node: int) -> list[str]:
    """EP and expert TP x EP groups that Ray spread over more nodes than the layout on
    whole nodes puts them (config/rank_groups.py mirrors Megatron's expert RankGenerator)."""
    if dims.ep == 1:
        return []
    packed = packed_nodes(dims.world_size, gpus_per_node)
    problems = []
    for token, label in (("ep", "EP group"), ("tp-ep", "expert TP x EP group")):
        for g in expert_groups(dims, token):
            allowed = nodes_spanned(g, packed)
            if nodes_spanned(g, nodes) > allowed:
                plural = "s" if allowed > 1 else ""
                problems.append(f"{label} {_spread(g, nodes)} (at most {allowed} node{plural})")
    return problems


def check_policy_nodes(
    nodes: Sequence[str], dims: ParallelDims, *, gpus_per_node: int, name: str
) -> list[str]:
    """Raise PlacementError unless every TP group sits on one node and every CP group on
    as few nodes as TP x CP allows (one when it fits a node), and (MoE) every EP and expert
    TP x EP group on no more nodes than the layout implies; ``nodes[r]``: rank r's node.
    Returns the warnings of the layout itself (an EP group that must cross nodes).

    TP exchanges activations every layer (NVLink speed needed); CP rings KV blocks every
    attention layer; EP exchanges every token twice per MoE layer (all-to-all). DP and PP
    cross nodes by design and are not checked.
    """
    if len(nodes) != dims.world_size:
        raise ValueError(f"{len(nodes)} nodes given for a policy of {dims.world_size} ranks")
    cp_nodes = max(1, math.ceil(dims.tp * dims.cp / gpus_per_node))
    problems = [
        f"TP group {_spread(g, nodes)}" for g in tp_groups(dims) if len({nodes[r] for r in g}) > 1
    ]
    if dims.cp > 1:
        problems += [
            f"CP group {_spread(g, nodes)} (at most {cp_nodes} node{'s' if cp_nodes > 1 else ''})"
            for g in cp_groups(dims)
            if len({nodes[r] for r in g}) > cp_nodes
        ]
    problems += _expert_problems(nodes, dims, gpus_per_node)
    if not problems:
        warning = expert_layout_warning(dims, gpus_per_node)
        return [f"{name}: {warning}"] if warning else []
    more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
    raise PlacementError(
        f"{name}: policy layout TP{dims.tp} CP{dims.cp} PP{dims.pp} DP{dims.dp}"
        f"{f' EP{dims.ep}' if dims.ep > 1 else ''} on "
        f"{gpus_per_node} GPUs per node: ranks that must share a node do not: "
        f"{'; '.join(problems[:_SHOWN])}{more}. Fix: each node must hold whole TP groups "
        f"(whole TP x CP blocks when they fit a node, whole TP x EP blocks for MoE): keep "
        f"policy.megatron.tensor_model_parallel_size (times context_parallel_size, and "
        f"times expert_model_parallel_size) a divisor of "
        f"cluster.gpus_per_node, give the run whole nodes (no other job holding some of a "
        f"node's GPUs), and in split mode make cluster.generation_num_devices leave the "
        f"policy a multiple of TP x CP on every node"
    )


def policy_placements(
    reservation: Reservation, plan: RunPlan, resources: RankResources
) -> list[ActorPlacement]:
    """One placement per policy rank, rank r on slot r; on GPUs, the TP/CP groups are first
    checked to share nodes (``check_policy_nodes``)."""
    world = plan.policy_world_size
    if len(reservation.order) != world:
        raise ValueError(f"a reservation of {len(reservation.order)} bundles for {world} ranks")
    if reservation.has_gpus:
        for warning in check_policy_nodes(
            reservation.node_labels(),
            plan.dims,
            gpus_per_node=plan.config.cluster.gpus_per_node,
            name=plan.config.run.name,
        ):
            print(f"[placement] warning: {warning}", flush=True)
    threads = max(1, int(resources.num_cpus))
    if not resources.num_gpus:
        # On CPU the ranks share the machine's cores with the split engines' processes
        # (one each): an equal share of intra-op threads each (one thread per process when
        # processes >= cores avoids oversubscription; a single rank on a 2-core machine
        # gets both cores, but only one when an engine generates on the other, overlapped
        # or not).
        split_engines = 0 if plan.config.cluster.colocated else plan.generation_devices
        threads = max(1, int(cluster_cpus()) // max(1, world + split_engines))
    return [
        ActorPlacement(
            _options(
                resources.num_cpus, resources.num_gpus, reservation.group, reservation.bundle(r)
            ),
            threads,
            None,
        )
        for r in range(world)
    ]


def colocated_engine_placements(
    policy: Reservation, policy_device_ids: list[str], count: int, tp: int
) -> list[ActorPlacement]:
    """Engines sharing the policy's GPUs (module docstring); ``policy_device_ids[r]`` is the
    device id Ray gave policy rank r. Each engine's ranks must share its node: its
    CUDA_VISIBLE_DEVICES names their GPUs, which mean something on that node only."""
    if count * tp > len(policy_device_ids):
        raise ValueError(
            f"{count} colocated engines of TP{tp} need {count * tp} policy devices, the "
            f"policy has {len(policy_device_ids)}"
        )
    nodes = policy.node_labels()
    split = [e for e in range(count) if len(set(nodes[e * tp : (e + 1) * tp])) > 1]
    if split:
        shown = "; ".join(
            f"engine {e}: {_spread(range(e * tp, (e + 1) * tp), nodes)}" for e in split[:_SHOWN]
        )
        raise PlacementError(
            f"colocated vLLM engines of TP{tp} span nodes ({shown}). Fix: make "
            f"generation.engine.tensor_parallel_size a divisor of the policy ranks on each "
            f"node (cluster.gpus_per_node), and give the run whole nodes"
        )
    return [
        ActorPlacement(
            _options(0.0, COLOCATED_SHARE, policy.group, policy.bundle(e * tp)),
            1,
            ",".join(policy_device_ids[e * tp : (e + 1) * tp]),
        )
        for e in range(count)
    ]


def split_engine_placements(
    cluster: ClusterConfig, count: int, tp: int, *, device: Device
) -> tuple[PlacementGroup, list[ActorPlacement]]:
    """Reserve a placement group for ``count`` engines of TP ``tp``; their placements,
    engine e on slot e (its bundle holds all its GPUs, so it is on one node)."""
    cuda = device == "cuda"
    resources = rank_resources(cluster, device=device)
    reservation = reserve_ranks(count, resources, what="generation engines", devices_per_bundle=tp)
    num_gpus = tp if resources.num_gpus else 0
    threads = max(1, int(resources.num_cpus)) if cuda else 1
    return reservation.group, [
        ActorPlacement(
            _options(resources.num_cpus, num_gpus, reservation.group, reservation.bundle(e)),
            threads,
            None,
        )
        for e in range(count)
    ]
