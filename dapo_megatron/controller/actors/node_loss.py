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

The workers of a lost node die (and the controller sees it) long before Ray marks their
node dead: the GCS marks a node dead only when its health check fails
``health_check_failure_threshold`` times in a row (GcsHealthCheckManager::
HealthCheckContext::StartHealthCheck in Ray's src/ray/gcs/gcs_health_check_manager.cc: a
check every ``health_check_period_ms``, each with a ``health_check_timeout_ms`` deadline;
Ray 2.60's defaults in src/ray/common/ray_config_def.h, read back from
``ray._raylet.Config``: 3000 ms, 10000 ms, 5 failures, first check after 5000 ms). A
raylet killed on a live host fails each check at once (connection refused): the node is
marked dead about ``period x threshold`` (13-15 s) after it died; a host cut off the
network fails each check only at its deadline, up to ``threshold x (period + timeout)``
(65 s). So before deciding, the restart waits for the node's state (``settle_nodes``):
until every node of the failed attempt is either marked dead by the GCS or has a raylet
that accepts a connection (a worker died, not its node: no wait), at most the health
check's window (``health_check_window_s``).
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors import preemption
from dapo_megatron.controller.actors.cluster import _ray_nodes
from dapo_megatron.controller.actors.remote import WorkerFailure


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


# Ray 2.60's health-check defaults (src/ray/common/ray_config_def.h), used when neither the
# cluster's system config nor ``ray._raylet.Config`` says otherwise.
_HEALTH_DEFAULTS = {
    "health_check_period_ms": 3000,
    "health_check_timeout_ms": 10000,
    "health_check_failure_threshold": 5,
}

# Seconds added to the health check's worst case (the GCS's own scheduling, a loaded head).
SLACK_S = 5.0

# How long a raylet gets to accept a connection (``raylet_answers``).
CONNECT_TIMEOUT_S = 1.0

# Between two looks at the node table while a node's state is unknown.
POLL_S = 0.5


def health_check() -> dict[str, int]:
    """The connected cluster's health-check settings: the GCS's system config (what the
    head was started with, ``_system_config`` / ``--system-config``), else this process's
    ``ray._raylet.Config`` (Ray's compiled defaults and ``RAY_health_check_*`` variables)."""
    settings = dict(_HEALTH_DEFAULTS)
    try:
        config = ray._raylet.Config  # type: ignore[attr-defined]
        settings = {key: int(getattr(config, key)()) for key in _HEALTH_DEFAULTS}
    except Exception:  # an attribute Ray renamed: its documented defaults
        pass
    try:
        overrides = ray._private.state.state.get_system_config()
        settings.update({k: int(v) for k, v in overrides.items() if k in _HEALTH_DEFAULTS})
    except Exception:  # not connected, or an older GCS: the local view
        pass
    return settings


def health_check_window_s(settings: dict[str, int] | None = None) -> float:
    """The longest the GCS takes to mark a dead node dead, plus slack: ``threshold``
    failed checks, each up to ``timeout`` (a host cut off the network) then ``period``
    to the next, and up to one ``period`` before the first (a node recently seen healthy
    is not checked again before that)."""
    s = health_check() if settings is None else settings
    period, timeout = s["health_check_period_ms"] / 1000, s["health_check_timeout_ms"] / 1000
    return s["health_check_failure_threshold"] * (period + timeout) + period + SLACK_S


def raylet_answers(node: dict[str, Any], timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether the node's raylet accepts a TCP connection on its port (what the GCS's
    health check dials): a killed raylet refuses at once, a host cut off times out."""
    address, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not address or not port:
        return False
    try:
        with socket.create_connection((str(address), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def settle_nodes(
    before: dict[str, dict[str, Any]], *, window_s: float | None = None, poll_s: float = POLL_S
) -> float:
    """After a worker death, wait until the state of every node of ``before`` is known:
    marked dead by the GCS, or alive with a raylet that answers; at most ``window_s``
    (default ``health_check_window_s``), after which the GCS's word (alive) stands.
    Returns the seconds waited. A SIGTERM ends the wait (the run stops, no restart)."""
    window = health_check_window_s() if window_s is None else window_s
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        while True:
            alive = alive_nodes()
            unsure = [node for node_id, node in before.items() if node_id in alive]
            answers = list(pool.map(raylet_answers, (alive[n["NodeID"]] for n in unsure)))
            waited = time.monotonic() - started
            if all(answers) or waited >= window or preemption.requested():
                return waited
            time.sleep(poll_s)


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
    """After a worker death, once the nodes' state is known (``settle_nodes``): raise NodeLost when nodes of ``before`` are gone and the rest
    cannot hold the layout; else the note the restart line carries ('' when no node was
    lost)."""
    settle_nodes(before)
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
