"""Policy ranks and vLLM engines placed on a multi-node Ray cluster, on one CPU machine.

``ray.cluster_utils.Cluster`` starts 4 raylets, each declaring 8 GPUs (about 200 MB of Ray
processes per node; ~10 s to start), shared by every case. Every shipped recipe's layout
(recipes/*.yaml, loaded with the project's loader) is reserved colocated and split with the
production code (cluster.reserve_ranks, placement.*_placements); then one short task runs
with each placement's exact Ray options and reports the node and GPU ids Ray really gave
it, and the test checks against that ground truth: ranks of a TP group share a node, a CP
group spans no more nodes than TP x CP needs, each engine sits on its ranks' node and its
visible devices are GPUs of that node.

Recipes of more than 4 nodes keep their TP, CP, GPUs per node and engine TP, on 4 nodes:
PP shrinks to what 32 (split: 16) devices hold and DP follows; the checked groups (TP, CP,
engine) are the recipe's own.

Ray 2.60 does not keep bundle index and node together (cluster.py's docstring):
``test_bundle_index_does_not_follow_the_node`` shows the old mapping (rank r on bundle r)
splitting TP groups and pointing an engine at another node's GPUs on this cluster.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import waits
from ray.cluster_utils import Cluster
from ray.util.placement_group import remove_placement_group
from shipped_recipes import shipped_recipes
from tiny_job import REPO

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors.cluster import Reservation, rank_resources, reserve_ranks
from dapo_megatron.controller.actors.placement import (
    ActorPlacement,
    PlacementError,
    check_policy_nodes,
    colocated_engine_placements,
    policy_placements,
    split_engine_placements,
)

pytestmark = pytest.mark.functional

NODES = 4
GPUS_PER_NODE = 8
# Logical CPUs per fake node: 8 policy ranks (1 CPU each on GPU clusters) plus split engines.
CPUS_PER_NODE = 10
TIMEOUT_S = 60  # Ray's scheduling: seconds when quiet; scaled by the machine's speed at use
RECIPES = shipped_recipes()


@ray.remote(max_calls=0)
def _where() -> tuple[str, list[str]]:
    """The node and GPU ids Ray gave this task (run with a placement's options)."""
    return ray.get_runtime_context().get_node_id(), [str(i) for i in ray.get_gpu_ids()]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    node = {
        "num_cpus": CPUS_PER_NODE,
        "num_gpus": GPUS_PER_NODE,
        "object_store_memory": 80 * 1024 * 1024,
    }
    fake = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        for _ in range(NODES - 1):
            # Not Ray's own 30 s wait per node: a busy machine starts a raylet slower.
            fake.add_node(wait=False, **node)
        ray.init(address=fake.address, log_to_driver=False)
        fake.wait_for_nodes(timeout=waits.scaled(60))
        yield fake
    finally:
        ray.shutdown()
        fake.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _overrides(recipe: Path, split: bool) -> list[str]:
    """The recipe on cuda, at most NODES nodes, colocated or split (module docstring)."""
    config = load_config(recipe).config
    m = config.policy.megatron
    tp, cp = m.tensor_model_parallel_size, m.context_parallel_size
    engine_tp = config.generation.engine.tensor_parallel_size
    nodes, per_node = min(config.cluster.num_nodes, NODES), config.cluster.gpus_per_node
    if split and nodes * per_node < 2:
        # A one-GPU recipe split: the engine on a second GPU of the same workstation.
        per_node = 2
    total = nodes * per_node
    generation = 0
    if split:
        # Whole nodes for the engines, about half the devices (DP stays a power of two,
        # as the recipes' batch sizes need).
        candidates = sorted(range(1, total), key=lambda g: (g % per_node != 0, abs(g - total // 2)))
        generation = next(
            g for g in candidates if g % engine_tp == 0 and (total - g) % (tp * cp) == 0
        )
    world = total - generation
    pp = max(p for p in range(1, m.pipeline_model_parallel_size + 1) if world % (tp * cp * p) == 0)
    # EP follows DP x CP down (a 2-rank MoE recipe has one policy rank left when split).
    dp_cp = world // (tp * cp * pp) * cp
    ep = max(e for e in range(1, m.expert_model_parallel_size + 1) if dp_cp % e == 0)
    return [
        "cluster.device=cuda",
        f"cluster.num_nodes={nodes}",
        f"cluster.gpus_per_node={per_node}",
        f"cluster.colocated={str(not split).lower()}",
        f"cluster.generation_num_devices={generation}",
        f"policy.megatron.pipeline_model_parallel_size={pp}",
        "policy.megatron.data_parallel_size=null",
        f"policy.megatron.expert_model_parallel_size={ep}",
        # Colocated on GPU the refit goes through CUDA IPC (a recipe may pin broadcast).
        *([] if split else ["generation.refit_transport=auto"]),
    ]


def _plan(recipe: Path, split: bool) -> RunPlan:
    return load_config(recipe, _overrides(recipe, split)).require_plan()


def _truth(places: list[ActorPlacement]) -> list[tuple[str, list[str]]]:
    """(node id, GPU ids) Ray gives a task started with each placement's options, one task
    at a time (they reuse one worker per node instead of starting one per placement)."""
    return [
        ray.get(_where.options(**p.options).remote(), timeout=waits.scaled(TIMEOUT_S))
        for p in places
    ]


def _reserve_policy(plan: RunPlan) -> tuple[Reservation, Any]:
    resources = rank_resources(
        plan.config.cluster, device=plan.device, device_share=plan.policy_device_share
    )
    return reserve_ranks(
        plan.policy_world_size, resources, timeout_s=waits.scaled(TIMEOUT_S)
    ), resources


@pytest.mark.parametrize("split", [False, True], ids=["colocated", "split"])
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_layout_places_groups_and_engines_on_one_node(
    cluster: Cluster, recipe: Path, split: bool
) -> None:
    plan = _plan(recipe, split)
    dims, world = plan.dims, plan.policy_world_size
    engine_tp = plan.config.generation.engine.tensor_parallel_size
    reservation, resources = _reserve_policy(plan)
    engine_group = None
    try:
        truth = _truth(policy_placements(reservation, plan, resources))
        nodes = [node for node, _ in truth]
        # What the controller believes (the probes) is what Ray does.
        assert [reservation.site(r).node_id for r in range(world)] == nodes
        assert [list(reservation.site(r).gpu_ids) for r in range(world)] == [g for _, g in truth]
        # One GPU per rank, no GPU of a node given twice.
        assert all(len(gpus) == 1 for _, gpus in truth)
        assert len({(node, gpus[0]) for node, gpus in truth}) == world
        # Megatron's order tp-cp-ep-dp-pp: TP groups are runs of TP ranks, CP groups
        # stride by TP inside runs of TP x CP.
        for start in range(0, world, dims.tp):
            assert len(set(nodes[start : start + dims.tp])) == 1, (start, nodes)
        cp_nodes = max(1, math.ceil(dims.tp * dims.cp / GPUS_PER_NODE))
        for block in range(0, world, dims.tp * dims.cp):
            for t in range(dims.tp):
                members = [block + t + dims.tp * c for c in range(dims.cp)]
                assert len({nodes[r] for r in members}) <= cp_nodes, (members, nodes)

        if not split and plan.needs_engine_workers:
            device_ids = [gpus[0] for _, gpus in truth]
            places = colocated_engine_placements(
                reservation, device_ids, plan.num_engines, engine_tp
            )
            for e, (node, gpus) in enumerate(_truth(places)):
                ranks = range(e * engine_tp, (e + 1) * engine_tp)
                assert {nodes[r] for r in ranks} == {node}, (e, node)
                visible = (places[e].visible_devices or "").split(",")
                assert visible == [device_ids[r] for r in ranks]
                on_node = {g for n, gs in truth if n == node for g in gs}
                assert set(visible) <= on_node and gpus == [visible[0]]
        if split:
            engine_group, places = split_engine_placements(
                plan.config.cluster, plan.num_engines, engine_tp, device="cuda"
            )
            seen = _truth(places)
            assert all(len(gpus) == engine_tp for _, gpus in seen)
            held = [(node, g) for node, gpus in seen for g in gpus]
            policy_held = {(node, gpus[0]) for node, gpus in truth}
            assert len(set(held)) == len(held) and not set(held) & policy_held
    finally:
        if engine_group is not None:
            remove_placement_group(engine_group)
        reservation.remove()


def test_bundle_index_does_not_follow_the_node(cluster: Cluster) -> None:
    """The bug the slot order fixes, as Ray 2.60 shows it on this cluster: with rank r on
    bundle r, a TP group spans two nodes and a colocated engine lists GPU ids of ranks on
    another node (Ray's unstable sort of 32 identical bundles: bundle 0 lands with 9-15)."""
    plan = _plan(REPO / "recipes" / "dapo-qwen2.5-32b-16n8g-tp8pp1cp2.yaml", split=False)
    reservation, _ = _reserve_policy(plan)
    try:
        world, engine_tp = (
            plan.policy_world_size,
            plan.config.generation.engine.tensor_parallel_size,
        )
        by_index = [reservation.sites[b].label() for b in range(world)]
        assert reservation.node_labels() != by_index, "Ray kept bundle order this time"
        with pytest.raises(PlacementError, match="TP group"):
            check_policy_nodes(by_index, plan.dims, gpus_per_node=GPUS_PER_NODE, name="old")
        # Old colocated mapping: engine e on bundle e*tp, seeing ranks e*tp.. (bundles too).
        assert any(
            len({by_index[r] for r in range(e * engine_tp, (e + 1) * engine_tp)}) > 1
            for e in range(plan.num_engines)
        )
        check_policy_nodes(
            reservation.node_labels(), plan.dims, gpus_per_node=GPUS_PER_NODE, name="new"
        )
    finally:
        reservation.remove()
