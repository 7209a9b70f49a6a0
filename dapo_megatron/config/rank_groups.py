"""Megatron's process groups of a policy layout, computed without Megatron.

The controller decides whether the ranks that must talk fast share a node before any
worker (and so any Megatron import) exists: it must never import megatron itself (it runs
on login nodes without CUDA and starts in seconds). This module mirrors the two pieces of
megatron-core 0.16.1 that decide which ranks form a group:

* ``megatron/core/parallel_state.py`` ``generate_masked_orthogonal_rank_groups``: the
  groups of the parallelism types selected by a mask, for sizes listed fastest first;
* ``RankGenerator`` and ``initialize_model_parallel``: the decoder generator
  (tp, cp, dp, pp; ep 1) and the expert generator (tp = expert_tensor_parallel_size,
  ep = expert_model_parallel_size, dp = world / (expert TP x EP x PP), pp, cp 1), both in
  the default order ``tp-cp-ep-dp-pp``. The EP group (the alltoall dispatcher's
  all-to-all) is the expert generator's ``ep`` groups, the expert TP x EP group its
  ``tp-ep`` groups.

We pass ``expert_tensor_parallel_size = tensor_model_parallel_size``
(megatron/distributed.py, megatron/model.py), which is also Megatron's default when it is
None. tests/unit/config/test_rank_groups.py pins this mirror against the upstream RankGenerator
for many layouts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dapo_megatron.config.parallel import ParallelDims

ORDER = "tp-cp-ep-dp-pp"
"""initialize_model_parallel's default order, the one we use (fastest first)."""


def masked_orthogonal_groups(sizes: Sequence[int], mask: Sequence[bool]) -> list[list[int]]:
    """Groups of the types where ``mask`` is True, ``sizes`` fastest first (upstream
    ``generate_masked_orthogonal_rank_groups``): rank = sum(index_i x stride_i), and a
    group fixes the unmasked indices and runs over the masked ones."""
    strides = [math.prod(sizes[:i]) for i in range(len(sizes))]
    masked = [(s, d) for s, d, m in zip(sizes, strides, mask, strict=True) if m]
    unmasked = [(s, d) for s, d, m in zip(sizes, strides, mask, strict=True) if not m]
    groups = []
    for group_index in range(math.prod(s for s, _ in unmasked)):
        base = 0
        rest = group_index
        for size, stride in unmasked:
            base += (rest % size) * stride
            rest //= size
        group = []
        for in_group in range(math.prod(s for s, _ in masked)):
            offset = 0
            rest = in_group
            for size, stride in masked:
                offset += (rest % size) * stride
                rest //= size
            group.append(base + offset)
        groups.append(group)
    return groups


def rank_groups(sizes: dict[str, int], token: str, order: str = ORDER) -> list[list[int]]:
    """``RankGenerator(**sizes, order=order).get_ranks(token)``: token is one type or
    several joined by "-" (e.g. "tp-ep")."""
    names = order.split("-")
    missing = [n for n in sizes if n not in names and sizes[n] != 1]
    if missing:
        raise ValueError(f"sizes {missing} > 1 are not in the order {order!r}")
    ordered = [sizes.get(n, 1) for n in names]
    wanted = token.split("-")
    unknown = [t for t in wanted if t not in names]
    if unknown:
        raise ValueError(f"{unknown} not in the order {order!r}")
    return masked_orthogonal_groups(ordered, [n in wanted for n in names])


def expert_sizes(dims: ParallelDims) -> dict[str, int]:
    """The expert RankGenerator's sizes of a layout (expert TP = TP, cp folded into dp)."""
    etp = dims.tp
    block = etp * dims.ep * dims.pp
    if dims.world_size % block:
        raise ValueError(
            f"world {dims.world_size} is not a multiple of expert TP x EP x PP = {block}"
        )
    return {"tp": etp, "ep": dims.ep, "dp": dims.world_size // block, "pp": dims.pp, "cp": 1}


def expert_groups(dims: ParallelDims, token: str) -> list[list[int]]:
    """The expert generator's groups: "ep" (the token all-to-all), "tp-ep" (expert TP x
    EP, one copy of a layer's experts), "tp" (expert TP)."""
    return rank_groups(expert_sizes(dims), token)


def nodes_spanned(group: Sequence[int], nodes: Sequence[str]) -> int:
    """How many distinct nodes the ranks of ``group`` sit on."""
    return len({nodes[r] for r in group})


def packed_nodes(world_size: int, gpus_per_node: int) -> list[str]:
    """Rank r's node when the ranks fill whole nodes in rank order (the slot order of
    controller/actors/cluster.py on whole nodes): what the layout itself implies."""
    return [f"node{r // gpus_per_node}" for r in range(world_size)]


def expert_layout_warning(dims: ParallelDims, gpus_per_node: int) -> str | None:
    """A line naming the keys when the layout itself puts an EP group on several nodes
    (ranks packed on whole nodes), else None.

    Not an error: the alltoall dispatcher then crosses the inter-node network twice per MoE
    layer (a large slowdown), which a layout may accept to hold fewer experts per GPU."""
    if dims.ep == 1:
        return None
    nodes = packed_nodes(dims.world_size, gpus_per_node)
    crossing = [g for g in expert_groups(dims, "ep") if nodes_spanned(g, nodes) > 1]
    if not crossing:
        return None
    etp = dims.tp
    return (
        f"expert-parallel groups span nodes: expert TP{etp} (= policy.megatron."
        f"tensor_model_parallel_size) x policy.megatron.expert_model_parallel_size = "
        f"{etp}*{dims.ep} = {etp * dims.ep} ranks per copy of the experts, with "
        f"cluster.gpus_per_node = {gpus_per_node}: EP group {crossing[0]} strides by {etp} "
        f"over {nodes_spanned(crossing[0], nodes)} nodes, so every MoE layer's token "
        f"all-to-all crosses the inter-node network. Keep tensor_model_parallel_size x "
        f"expert_model_parallel_size a divisor of cluster.gpus_per_node for an all-to-all "
        f"inside a node"
    )
