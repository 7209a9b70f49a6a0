"""A node lost mid-run: restart on the nodes left when they still fit the layout, else stop.

A lost node (its raylet and every actor on it gone: a crash, a reboot, a network cut)
reaches the controller as the deaths of the workers it held (remote.WorkerDied). A restart
would then ask Ray for the run's placement groups again; on a cluster that no longer holds
the layout, the reservation could only wait out its timeout and fail with a traceback-less
but misleading "cannot place". So before each restart the controller compares the nodes
alive now with those of the attempt that failed (``lost_nodes``): when some are gone and
the ones left cannot hold ``cluster.num_nodes`` nodes of the layout (``layout_fits``), the
run stops at once with one line naming the lost node, and the CLI adds the command that
resumes from the last checkpoint once the cluster is whole again.
"""

from __future__ import annotations

from typing import Any

import ray

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.cluster import _ray_nodes
from dapo_megatron.controller.remote import WorkerFailure


class NodeLost(WorkerFailure):
    """Workers died with their node and the nodes left cannot hold the run's layout."""


def alive_nodes() -> dict[str, dict[str, Any]]:
    """Ray's live nodes by id (``ray.nodes()`` entries: address, resources)."""
    if not ray.is_initialized():
        return {}
    return {n["NodeID"]: n for n in _ray_nodes() if n.get("Alive")}


def node_label(node: dict[str, Any]) -> str:
    """How errors name a node: its address and the start of its id (as BundleSite.label;
    fake multi-node clusters put every node on one address)."""
    return f"{node.get('NodeManagerAddress', '?')}/{str(node['NodeID'])[:8]}"


def lost_nodes(before: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes of ``before`` (``alive_nodes`` at the attempt's start) no longer alive."""
    alive = alive_nodes()
    return [node for node_id, node in before.items() if node_id not in alive]


def layout_fits(plan: RunPlan, nodes: dict[str, dict[str, Any]]) -> tuple[bool, str]:
    """Whether ``nodes`` hold the layout: ``cluster.num_nodes`` nodes with
    ``cluster.gpus_per_node`` GPUs each (on CPU: with CPUs), and how many do."""
    cluster = plan.config.cluster
    if plan.device == "cuda":
        need = f"{cluster.gpus_per_node} GPUs"
        usable = [
            n for n in nodes.values() if n["Resources"].get("GPU", 0) >= cluster.gpus_per_node
        ]
    else:
        need = "CPUs"
        usable = [n for n in nodes.values() if n["Resources"].get("CPU", 0) > 0]
    return len(usable) >= cluster.num_nodes, (
        f"{len(usable)} node(s) with {need} left, cluster.num_nodes = {cluster.num_nodes}"
    )


def check_restart(plan: RunPlan, before: dict[str, dict[str, Any]], failure: Exception) -> str:
    """After a worker death: raise NodeLost when nodes of ``before`` are gone and the rest
    cannot hold the layout; else the note the restart line carries ('' when no node was
    lost)."""
    lost = lost_nodes(before)
    if not lost:
        return ""
    names = ", ".join(node_label(n) for n in lost)
    fits, counted = layout_fits(plan, alive_nodes())
    if not fits:
        raise NodeLost(
            f"node {names} was lost ({failure}) and the cluster no longer fits the layout "
            f"({counted}): the run stopped"
        ) from failure
    return f" (node {names} lost; {counted}: the layout fits)"
