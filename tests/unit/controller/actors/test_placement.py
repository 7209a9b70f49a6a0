"""Slot order of placement-group bundles and the node checks, on hand-made bundle tables.

Ray ties neither node nor GPU id to a bundle's index (controller/actors/cluster.py), so these
tables are shuffled the way Ray shuffles them (and at random): the slot order must put
every TP group, CP group and colocated engine on one node whatever the table, and the old
mapping (rank r on bundle r) must fail on the same tables.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from ray.util.placement_group import PlacementGroup

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors.cluster import (
    BundleSite,
    RankResources,
    Reservation,
    order_bundles,
)
from dapo_megatron.controller.actors.placement import (
    PlacementError,
    check_policy_nodes,
    colocated_engine_placements,
    cp_groups,
    policy_placements,
    tp_groups,
)

REPO = Path(__file__).resolve().parents[4]
NODES = [(f"10.0.0.{i + 1}", f"{i + 1:02d}" + "ab" * 27) for i in range(5)]


def _sites(table: list[tuple[int, str]]) -> list[BundleSite]:
    """Bundle b on node table[b][0] (index into NODES) with GPU table[b][1]."""
    return [
        BundleSite(node_id=NODES[n][1], node_ip=NODES[n][0], gpu_ids=(gpu,) if gpu else ())
        for n, gpu in table
    ]


def _full(nodes: int = 4, gpus: int = 8) -> list[tuple[int, str]]:
    return [(n, str(g)) for n in range(nodes) for g in range(gpus)]


def _shuffled(seed: int) -> list[tuple[int, str]]:
    table = _full()
    random.Random(seed).shuffle(table)
    return table


# What Ray 2.60 did with 32 identical bundles on 4 fresh 8-GPU nodes (the multi-node test
# observes it): bundle 0 with bundles 9-15, bundles 1-8 together, 16 with 25-31, 17-24.
RAY_260 = (
    [(0, "0")]
    + [(1, str(g)) for g in range(8)]
    + [(0, str(g)) for g in range(1, 8)]
    + [(2, "0")]
    + [(3, str(g)) for g in range(8)]
    + [(2, str(g)) for g in range(1, 8)]
)


def _dims(tp: int, cp: int = 1, pp: int = 1, world: int = 32) -> ParallelDims:
    return ParallelDims.build(
        world_size=world, tp=tp, pp=pp, cp=cp, dp=None, sequence_parallel=False
    )


def _reservation(sites: list[BundleSite]) -> Reservation:
    return Reservation(
        group=PlacementGroup.empty(), sites=tuple(sites), order=tuple(order_bundles(sites))
    )


def _labels_by_index(sites: list[BundleSite]) -> list[str]:
    return [s.label() for s in sites]


LAYOUTS = [_dims(1), _dims(2), _dims(4), _dims(8), _dims(8, cp=2), _dims(8, cp=2, pp=2)]


@pytest.mark.parametrize("table", [RAY_260, *(_shuffled(s) for s in range(5))])
def test_slots_follow_node_then_gpu_id(table: list[tuple[int, str]]) -> None:
    sites = _sites(table)
    order = order_bundles(sites)
    assert sorted(order) == list(range(32))
    assert [table[b] for b in order] == _full()


@pytest.mark.parametrize("dims", LAYOUTS, ids=lambda d: f"tp{d.tp}cp{d.cp}pp{d.pp}")
@pytest.mark.parametrize("seed", range(10))
def test_slot_order_keeps_groups_on_a_node_where_bundle_order_does_not(
    dims: ParallelDims, seed: int
) -> None:
    sites = _sites(RAY_260 if seed == 0 else _shuffled(seed))
    check_policy_nodes(_reservation(sites).node_labels(), dims, gpus_per_node=8, name="t")
    if dims.tp > 1:
        with pytest.raises(PlacementError, match="TP group"):
            check_policy_nodes(_labels_by_index(sites), dims, gpus_per_node=8, name="t")


def test_numbers_sort_as_numbers_and_hosts_after_addresses() -> None:
    sites = [
        BundleSite("b" * 56, "10.0.0.10", ("0",)),
        BundleSite("c" * 56, "node-x", ("0",)),
        BundleSite("a" * 56, "10.0.0.2", ("10",)),
        BundleSite("a" * 56, "10.0.0.2", ("9",)),
        BundleSite("a" * 56, "10.0.0.2", ("4", "2")),  # a TP2 engine bundle: its lowest id
    ]
    assert order_bundles(sites) == [4, 3, 2, 0, 1]


def test_bundles_without_gpus_keep_index_order_within_a_node() -> None:
    sites = _sites([(1, ""), (0, ""), (1, ""), (0, "")])
    assert order_bundles(sites) == [1, 3, 0, 2]
    assert not _reservation(sites).has_gpus


def test_groups_follow_megatron_default_order() -> None:
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    for dims in LAYOUTS:
        ranks = parallel_state.RankGenerator(
            tp=dims.tp, ep=1, dp=dims.dp, pp=dims.pp, cp=dims.cp, order="tp-cp-ep-dp-pp"
        )
        assert sorted(tp_groups(dims)) == sorted(ranks.get_ranks("tp"))
        assert sorted(cp_groups(dims)) == sorted(ranks.get_ranks("cp"))


def test_cp_may_span_the_nodes_tp_x_cp_needs_and_no_more() -> None:
    labels = [f"n{r // 8}" for r in range(32)]
    check_policy_nodes(labels, _dims(8, cp=2), gpus_per_node=8, name="t")  # 2 nodes: needed
    check_policy_nodes(labels, _dims(4, cp=2), gpus_per_node=8, name="t")  # fits one node
    # TP4 CP2 fits a node, but rank 4's half of each CP group sits on the next node.
    shifted = [f"n{(r + 4) // 8}" for r in range(32)]
    with pytest.raises(PlacementError, match="CP group"):
        check_policy_nodes(shifted, _dims(4, cp=2), gpus_per_node=8, name="t")


def test_error_names_the_recipe_layout_ranks_nodes_and_fix() -> None:
    labels = ["A", "B", "B", "B"] + ["B"] * 4
    with pytest.raises(PlacementError) as error:
        check_policy_nodes(labels, _dims(4, world=8), gpus_per_node=8, name="my-recipe")
    text = str(error.value)
    for part in ("my-recipe", "TP4 CP1 PP1 DP2", "rank 0 on A", "ranks 1,2,3 on B", "Fix:"):
        assert part in text, (part, text)


def _plan() -> RunPlan:
    return load_config(REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml").require_plan()


def test_policy_rank_r_goes_to_slot_r() -> None:
    plan = _plan()
    assert plan.dims.tp == 4 and plan.policy_world_size == 32
    reservation = _reservation(_sites(RAY_260))
    places = policy_placements(reservation, plan, RankResources(num_cpus=1, num_gpus=0.5))
    bundles = [p.options["scheduling_strategy"].placement_group_bundle_index for p in places]
    assert bundles == list(reservation.order)
    assert [RAY_260[b] for b in bundles] == _full()


def test_policy_placements_refuse_a_node_holding_part_of_a_tp_group() -> None:
    # Another job holds 2 GPUs on each of nodes 0 and 1: they give the run 6 each, so the
    # TP4 group of slots 4-7 would cross from node 0 to node 1.
    table = [(0, str(g)) for g in range(2, 8)] + [(1, str(g)) for g in range(2, 8)]
    table += [(2, str(g)) for g in range(8)] + [(3, str(g)) for g in range(8)]
    table += [(4, str(g)) for g in range(4)]
    random.Random(0).shuffle(table)
    with pytest.raises(PlacementError, match="ranks 4,5 on 10.0.0.1/.*ranks 6,7 on 10.0.0.2"):
        policy_placements(_reservation(_sites(table)), _plan(), RankResources(1, 0.5))


def test_colocated_engines_see_their_ranks_gpus_on_their_node() -> None:
    reservation = _reservation(_sites(RAY_260))
    device_ids = [reservation.site(r).gpu_ids[0] for r in range(32)]
    places = colocated_engine_placements(reservation, device_ids, count=8, tp=4)
    for e, place in enumerate(places):
        bundle = place.options["scheduling_strategy"].placement_group_bundle_index
        assert bundle == reservation.bundle(e * 4)
        node = reservation.sites[bundle].node_id
        assert all(reservation.site(r).node_id == node for r in range(e * 4, e * 4 + 4))
        assert place.visible_devices == ",".join(
            str(g) for g in range(4 * (e % 2), 4 * (e % 2) + 4)
        )


def test_colocated_engine_spanning_nodes_is_refused() -> None:
    # Nodes giving the run 6 and 2 GPUs: an engine of TP4 on slots 4-7 crosses them.
    sites = _sites([(0, str(g)) for g in range(6)] + [(1, "0"), (1, "1")])
    reservation = _reservation(sites)
    with pytest.raises(PlacementError, match="engine 1: ranks 4,5 on 10.0.0.1"):
        colocated_engine_placements(reservation, ["0"] * 8, count=2, tp=4)
