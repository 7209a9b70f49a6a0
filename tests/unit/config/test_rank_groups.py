"""config/rank_groups.py against megatron-core's own rank groups, and the EP node check.

The controller computes Megatron's process groups without importing megatron
(config/rank_groups.py mirrors ``RankGenerator``); these tests pin the mirror against the
upstream ``RankGenerator`` for many layouts, and against ``initialize_model_parallel``
itself, run on CPU with torch.distributed patched to a 32- (or N-) rank world that records
the groups it would create, with the same arguments megatron/distributed.py passes
(expert TP = TP).
"""

from __future__ import annotations

import inspect
import itertools
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from shipped_recipes import shipped_recipes

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.parallel import ParallelDims, parallel_dims
from dapo_megatron.config.rank_groups import (
    ORDER,
    expert_groups,
    expert_layout_warning,
    expert_sizes,
    packed_nodes,
    rank_groups,
)
from dapo_megatron.controller.actors.placement import PlacementError, check_policy_nodes, cp_groups

REPO = Path(__file__).resolve().parents[3]
MOE_RECIPE = REPO / "recipes" / "dapo-qwen3-30b-a3b-4n8g-tp2pp1cp1ep4.yaml"


def _dims(tp: int, ep: int, *, world: int = 32, cp: int = 1, pp: int = 1) -> ParallelDims:
    return ParallelDims.build(
        world_size=world, tp=tp, pp=pp, cp=cp, dp=None, sequence_parallel=tp > 1, ep=ep
    )


def _layouts() -> list[ParallelDims]:
    """Every valid (tp, cp, pp, ep) on 8, 16 and 32 ranks."""
    found = []
    for world in (8, 16, 32):
        for tp, cp, pp, ep in itertools.product((1, 2, 4, 8), (1, 2), (1, 2), (1, 2, 4, 8)):
            try:
                dims = _dims(tp, ep, world=world, cp=cp, pp=pp)
                expert_sizes(dims)
            except Exception:
                continue
            found.append(dims)
    return found


LAYOUTS = _layouts()


def _name(d: ParallelDims) -> str:
    return f"w{d.world_size}tp{d.tp}cp{d.cp}pp{d.pp}ep{d.ep}"


def test_there_are_many_layouts() -> None:
    assert len(LAYOUTS) > 60


@pytest.mark.parametrize("dims", LAYOUTS, ids=_name)
def test_mirror_matches_upstream_rank_generator(dims: ParallelDims) -> None:
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    decoder = {"tp": dims.tp, "ep": 1, "dp": dims.dp, "pp": dims.pp, "cp": dims.cp}
    upstream = parallel_state.RankGenerator(**decoder, order=ORDER)
    for token in ("tp", "cp", "dp", "pp", "tp-cp", "dp-cp", "tp-dp-cp"):
        assert rank_groups(decoder, token) == upstream.get_ranks(token), token
    sizes = expert_sizes(dims)
    upstream_expert = parallel_state.RankGenerator(**sizes, order=ORDER)
    for token in ("ep", "tp", "tp-ep", "dp", "tp-ep-pp"):
        assert expert_groups(dims, token) == upstream_expert.get_ranks(token), token


def _megatron_groups(dims: ParallelDims) -> dict[str, list[list[int]]]:
    """The groups megatron-core's initialize_model_parallel creates for ``dims``, with the
    arguments megatron/distributed.py passes, on a patched world of dims.world_size."""
    torch = pytest.importorskip("torch")
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    recorded: dict[str, list[list[int]]] = {}

    def new_group(**kwargs: Any) -> object:
        recorded.setdefault(kwargs.get("group_desc") or "", []).append(list(kwargs["ranks"]))
        return object()

    dist = torch.distributed
    with (
        mock.patch.object(dist, "is_initialized", return_value=True),
        mock.patch.object(dist, "get_world_size", return_value=dims.world_size),
        mock.patch.object(dist, "get_rank", return_value=0),
        mock.patch.object(dist, "new_group", side_effect=new_group),
    ):
        try:
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=dims.tp,
                pipeline_model_parallel_size=dims.pp,
                context_parallel_size=dims.cp,
                expert_model_parallel_size=dims.ep,
                expert_tensor_parallel_size=dims.tp,
            )
        finally:
            parallel_state.destroy_model_parallel()
    return recorded


MOE_LAYOUTS = [
    _dims(2, 8),  # the recipe's old layout: EP groups stride by 2 over 16 ranks
    _dims(2, 4),  # its new layout
    _dims(1, 8),
    _dims(4, 2),
    _dims(2, 4, cp=2),
    _dims(2, 2, pp=2),
    _dims(8, 4),
]


@pytest.mark.parametrize("dims", MOE_LAYOUTS, ids=_name)
def test_mirror_matches_initialize_model_parallel(dims: ParallelDims) -> None:
    groups = _megatron_groups(dims)
    assert groups["EXPERT_MODEL_PARALLEL_GROUP"] == expert_groups(dims, "ep")
    assert groups["EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP"] == expert_groups(dims, "tp-ep")
    assert groups["EXPERT_TENSOR_PARALLEL_GROUP"] == expert_groups(dims, "tp")
    assert sorted(groups["CONTEXT_PARALLEL_GROUP"]) == sorted(cp_groups(dims))


def test_upstream_default_expert_tp_is_tp_and_we_pass_it() -> None:
    """The mirror assumes expert TP = TP: what megatron/distributed.py passes, and what
    initialize_model_parallel takes when it is None (megatron-core 0.16.1)."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    signature = inspect.signature(parallel_state.initialize_model_parallel)
    assert signature.parameters["order"].default == ORDER
    source = inspect.getsource(parallel_state.initialize_model_parallel)
    assert "expert_tensor_parallel_size = tensor_model_parallel_size" in source
    ours = (REPO / "dapo_megatron" / "megatron" / "distributed.py").read_text()
    assert "expert_tensor_parallel_size=dims.tp," in ours
    assert "order=" not in ours.split("initialize_model_parallel(", 1)[1].split(")", 1)[0]


def test_old_recipe_layout_puts_ep_groups_on_two_nodes_with_a_warning() -> None:
    dims = _dims(2, 8)
    ep = _megatron_groups(dims)["EXPERT_MODEL_PARALLEL_GROUP"]
    assert ep[0] == [0, 2, 4, 6, 8, 10, 12, 14]  # ranks 0-15: nodes 0 and 1 of 8 GPUs
    warning = expert_layout_warning(dims, 8)
    assert warning is not None
    for key in ("policy.megatron.tensor_model_parallel_size", "expert_model_parallel_size"):
        assert key in warning, warning
    assert "cluster.gpus_per_node = 8" in warning
    # At placement: a warning (the layout chose it), not an error, as long as Ray put the
    # ranks on whole nodes in order.
    warnings = check_policy_nodes(packed_nodes(32, 8), dims, gpus_per_node=8, name="moe")
    assert len(warnings) == 1 and warnings[0].startswith("moe: expert-parallel groups span")


def test_recipe_keeps_every_ep_group_in_a_node() -> None:
    config = load_config(MOE_RECIPE, validate=False).config
    dims = parallel_dims(config)
    assert dims.ep > 1
    gpus = config.cluster.gpus_per_node
    nodes = packed_nodes(dims.world_size, gpus)
    for token in ("ep", "tp-ep"):
        for group in _megatron_groups(dims)[
            "EXPERT_MODEL_PARALLEL_GROUP"
            if token == "ep"
            else "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP"
        ]:
            assert len({nodes[r] for r in group}) == 1, (token, group)
    assert expert_layout_warning(dims, gpus) is None
    assert check_policy_nodes(nodes, dims, gpus_per_node=gpus, name="r") == []


def test_ep_group_that_ray_spread_over_nodes_is_an_error() -> None:
    """TP2 EP4 fits a node; a placement shifted by 4 ranks splits TP x EP blocks (and their
    EP groups) over two nodes although every TP group still shares a node."""
    dims = _dims(2, 4)
    shifted = [f"n{(r + 4) // 8}" for r in range(32)]
    with pytest.raises(PlacementError) as error:
        check_policy_nodes(shifted, dims, gpus_per_node=8, name="t")
    text = str(error.value)
    # 8 EP groups and 4 expert TP x EP groups cross: the first 4 are shown, then a count.
    assert "EP4" in text and "EP group ranks 0,2 on n0, ranks 4,6 on n1" in text, text
    assert "; and 8 more" in text, text
    assert "TP group ranks" not in text, text
    assert "expert_model_parallel_size" in text


def test_dense_layouts_have_no_expert_checks() -> None:
    dims = _dims(8, 1)
    assert expert_layout_warning(dims, 8) is None
    assert check_policy_nodes(packed_nodes(32, 8), dims, gpus_per_node=8, name="d") == []


def test_dry_run_and_plan_warn_about_expert_groups_that_cross_nodes() -> None:
    from dapo_megatron.config.loader import load_config

    recipe = shipped_recipes("dapo-qwen3-30b-a3b-*")[0]
    shipped = load_config(recipe, []).require_plan()
    assert not any("expert-parallel groups span nodes" in w for w in shipped.warnings)
    # The recipe's earlier layout: EP8 at expert TP2 strides its EP groups over two nodes.
    old = load_config(
        recipe,
        [
            "policy.megatron.expert_model_parallel_size=8",
            "generation.engine.gpu_memory_utilization=0.55",
        ],
    ).require_plan()
    assert any("expert-parallel groups span nodes" in w for w in old.warnings)
