"""Start or join the Ray cluster, reserve devices, and find where Ray put them.

A local cluster binds to loopback and keeps Ray's token authentication as configured by
the environment (Ray >= 2.60 enables it by default). Under slurm/ray.sub, RAY_ADDRESS
points at the head node and we join it.

One placement group holds one bundle per policy rank (or per split engine), PACKed so that
a model-parallel group can land on one node. Bundle index and node do NOT follow each
other: Ray sorts a group's bundles by their demands with an unstable sort before packing
them onto nodes (SortRequiredResources in Ray's bundle_scheduling_policy.cc), so among
identical bundles the order is scrambled (on Ray 2.60, 4 nodes x 8 GPUs: bundle 0 lands
with bundles 9-15, bundles 1-8 on another node). ``reserve_ranks`` therefore returns a
``Reservation``: the group plus where each bundle landed (node, and the GPU ids Ray gave
it, read by one short probe task per bundle) and the bundles ordered by (node, GPU id);
slot r of that order is what rank r (or engine r) runs on (controller/actors/placement.py).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

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


@contextlib.contextmanager
def _node_processes_in_own_session() -> Iterator[None]:
    """While ``ray.init`` starts a local cluster: its node processes (GCS, raylet, and the
    workers the raylet starts) in a session of their own, out of the driver's process group.

    Ray 2.60 starts them with ``ray._private.services.start_ray_process``, a
    ``ConsolePopen`` (a ``subprocess.Popen``) without a new session or process group, so a
    signal to the driver's group (a terminal, ``timeout``, ``kill -TERM -PGID``) reaches
    them too: the GCS and raylet stop at once, the driver's checkpoint at the end of the
    step never completes and its GCS client waits 60 s for a dead GCS. In their own session
    they see only what Ray sends them; they still die with the driver (Ray's fate sharing:
    ``set_kill_on_parent_death_linux`` in the same ``preexec_fn``, and ``ray.shutdown`` at
    exit).
    """
    from ray._private import services

    original = services.ConsolePopen

    class _OwnSessionPopen(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = _OwnSessionPopen  # type: ignore[misc]
    try:
        yield
    finally:
        services.ConsolePopen = original  # type: ignore[misc]


def gcs_address() -> str | None:
    """host:port of the connected cluster's GCS (None when Ray does not say, or when not
    connected: ``ray.get_runtime_context`` would start a local cluster of its own)."""
    if not ray.is_initialized():
        return None
    try:
        return str(ray.get_runtime_context().gcs_address) or None
    except Exception:  # not connected, or an attribute Ray renamed: no probe then
        return None


# Ray's own INFO lines ("Started a local Ray instance.", "Connecting to existing Ray
# cluster") are not the run's: the console shows the plan, progress and errors only.
_RAY_LOG = logging.WARNING


class _TokenAuthDefaultNote(logging.Filter):
    """Drops Ray's note that it enabled token authentication on a new local cluster, its
    default when RAY_AUTH_MODE is unset (ray/_private/authentication/
    authentication_token_setup.py, ``enable_token_auth_by_default``): nothing is wrong and
    the protection stays on. Setting RAY_AUTH_MODE=token ourselves would not do: Ray then
    skips the refresh of the driver's cached mode, and the driver cannot reach its GCS."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
    _TokenAuthDefaultNote()
)


def start_ray(cluster: ClusterConfig, *, device: Device, num_cpus: int | None = None) -> None:
    """Join RAY_ADDRESS / cluster.ray_address, or start a small local cluster on loopback
    (``device``: the run plan's resolved device kind) whose node processes live in their
    own session (``_node_processes_in_own_session``)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = cluster.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        _check_authentication(address)
        ray.init(
            address=address, include_dashboard=False, log_to_driver=True, logging_level=_RAY_LOG
        )
        return
    with _node_processes_in_own_session():
        _init_local(num_cpus=num_cpus, device=device)


class ClusterJoinError(RuntimeError):
    """The cluster at RAY_ADDRESS refused this driver (one line, for the CLI)."""


AUTH_PROBE_S = 5.0
"""How long the join waits for the GCS's answer to one unauthenticated-or-not request before
leaving the question to ``ray.init`` (a GCS that is not up yet takes Ray 40 s to give up on)."""


def _check_authentication(address: str) -> None:
    """Refuse at once, in one line naming the variables, a cluster whose authentication mode
    or token differs from this driver's.

    ``ray.init(address=...)`` retries a refused connection for 20 s and then raises a
    ``ConnectionError`` whose cause holds the ``AuthenticationError`` (ray/_private/node.py,
    ``Node._init_gcs_client``: NUM_REDIS_GET_RETRIES tries, 1 s apart). One request of
    Ray's own ``GcsClient`` is refused in milliseconds with that ``AuthenticationError``. A
    driver given an address never turns token mode on by itself (ray/_private/worker.py,
    ``init``: ``maybe_enable_token_auth_if_token_available`` only for address None or
    "auto"), while ``ray start --head`` does when it finds a token
    (ray/scripts/scripts.py ``start``), hence the usual mismatch: RAY_AUTH_MODE unset."""
    import threading

    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # compiled, no stub
    from ray.exceptions import AuthenticationError

    refused: list[BaseException] = []

    def probe() -> None:
        try:
            GcsClient(address=address).cluster_id  # noqa: B018 (the request is the point)
        except AuthenticationError as e:
            refused.append(e)
        except Exception:  # not up yet, unreachable: ray.init's own retries decide
            return

    thread = threading.Thread(target=probe, name="ray-auth-probe", daemon=True)
    thread.start()
    thread.join(AUTH_PROBE_S)
    if refused:
        mode = os.environ.get("RAY_AUTH_MODE")
        has_token = bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"))
        raise ClusterJoinError(
            f"the Ray cluster at {address} refused this driver's authentication "
            f"(RAY_AUTH_MODE={'unset' if mode is None else mode}, RAY_AUTH_TOKEN"
            f"{'/RAY_AUTH_TOKEN_PATH set' if has_token else ' and RAY_AUTH_TOKEN_PATH unset'}): "
            "set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN, as slurm/ray.sub "
            "does for its COMMAND"
        )


def local_gpus(device: Device) -> int | None:
    """The GPUs a local cluster declares: on CUDA the devices torch sees (it honours
    CUDA_VISIBLE_DEVICES), so that placement does not hang on Ray's own detection through
    NVML, which finds none where the NVML library is not where Ray looks; None (Ray's own
    count, as ever) on CPU or when torch sees no device."""
    if device != "cuda":
        return None
    import torch

    count = torch.cuda.device_count()
    return count or None


def _init_local(*, num_cpus: int | None, device: Device) -> None:
    ray.init(
        address="local",  # never a stale cluster file from an earlier session
        num_cpus=num_cpus,
        num_gpus=local_gpus(device),
        include_dashboard=False,
        logging_level=_RAY_LOG,
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


@dataclass(frozen=True)
class BundleSite:
    """Where Ray put one bundle of a placement group."""

    node_id: str
    """Ray's id of the node (hex)."""
    node_ip: str
    """The node's address."""
    gpu_ids: tuple[str, ...]
    """The accelerator ids Ray reserved for the bundle on that node (empty without GPUs)."""

    def label(self) -> str:
        """How errors name the node: address and the start of its id (fake multi-node
        clusters put every node on one address)."""
        return f"{self.node_ip}/{self.node_id[:8]}"


def _gpu_key(gpu: str) -> tuple[int, int, str]:
    # Numeric ids compare as numbers (2 before 10); anything else (a UUID) after them.
    return (0, int(gpu), "") if gpu.isdigit() else (1, 0, gpu)


def _ip_key(ip: str) -> tuple[int, int, str]:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:  # a host name
        return (9, 0, ip)
    return (address.version, int(address), "")


def order_bundles(sites: Sequence[BundleSite]) -> list[int]:
    """Bundle indices in (node, GPU id) order: entry r is the bundle that slot r runs on.

    Nodes are ordered by address, then id; within a node, bundles by their lowest GPU id,
    then by index (bundles without GPUs keep Ray's index order). Pure: unit-tested with
    hand-made, shuffled bundle tables.
    """

    def key(bundle: int) -> tuple[tuple[int, int, str], str, tuple[int, int, str], int]:
        site = sites[bundle]
        first_gpu = min((_gpu_key(g) for g in site.gpu_ids), default=(0, 0, ""))
        return (_ip_key(site.node_ip), site.node_id, first_gpu, bundle)

    return sorted(range(len(sites)), key=key)


@dataclass(frozen=True)
class Reservation:
    """A ready placement group, where each bundle landed, and its bundles in slot order."""

    group: PlacementGroup
    sites: tuple[BundleSite, ...]
    """Where bundle i landed, by bundle index."""
    order: tuple[int, ...]
    """``order_bundles(sites)``: slot r (rank r, engine r) runs on bundle ``order[r]``."""

    def bundle(self, slot: int) -> int:
        """The bundle index of a slot."""
        return self.order[slot]

    def site(self, slot: int) -> BundleSite:
        """Where a slot runs."""
        return self.sites[self.order[slot]]

    def node_labels(self) -> list[str]:
        """Each slot's node, as errors name it."""
        return [self.site(slot).label() for slot in range(len(self.order))]

    @property
    def has_gpus(self) -> bool:
        """Whether the bundles hold GPUs (the node checks apply to GPU runs only)."""
        return any(site.gpu_ids for site in self.sites)

    def remove(self) -> None:
        """Release the placement group and wait until Ray reports it removed
        (``release_groups``)."""
        release_groups([self.group])


# Unannotated Ray calls (client-mode wrapped), typed here once as Ray documents them.
_placement_group_table = cast(
    Callable[[PlacementGroup], dict[str, Any]], ray.util.placement_group_table
)
_ray_nodes = cast(Callable[[], list[dict[str, Any]]], ray.nodes)


# How long ``release_groups`` waits for the GCS to report a removed group as REMOVED
# (milliseconds on a healthy cluster).
RELEASE_TIMEOUT_S = 30.0


def group_state(group: PlacementGroup) -> str:
    """The group's state in the GCS's placement table (PENDING, CREATED, REMOVED, ...;
    "" when the GCS does not answer)."""
    try:
        return str(_placement_group_table(group).get("state", ""))
    except Exception:  # the GCS gone (a job-wide SIGTERM): nothing left to wait for
        return ""


def release_groups(
    groups: Sequence[PlacementGroup], *, timeout_s: float = RELEASE_TIMEOUT_S
) -> None:
    """Remove placement groups (their bundles' resources, and any actor still in them,
    return to the nodes) and wait until the GCS reports every one REMOVED, so that the
    next attempt's groups are placed on free resources, not queued behind these. Groups
    already removed are skipped; at most ``timeout_s`` in all."""
    for group in groups:
        if group_state(group) not in ("REMOVED", ""):
            with contextlib.suppress(Exception):  # removed meanwhile, or the GCS gone
                remove_placement_group(group)
    deadline = time.monotonic() + timeout_s
    while any(group_state(g) not in ("REMOVED", "") for g in groups):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _where_am_i() -> tuple[str, list[str]]:
    """Run inside a bundle: this node's id and the GPU ids Ray gave the task."""
    return ray.get_runtime_context().get_node_id(), [str(i) for i in ray.get_gpu_ids()]


def bundle_sites(
    group: PlacementGroup, bundles: Sequence[dict[str, float]], *, timeout_s: float
) -> list[BundleSite]:
    """Where each bundle of a ready group landed: its node from the GCS's placement table;
    on GPU bundles, the GPU ids from one probe task per bundle (Ray exposes a bundle's GPU
    ids only to what runs in it).

    The probes ask for no CPU and all of the bundle's GPUs, and reuse their worker
    (``max_calls=0``; Ray's default for GPU tasks is one call per process), so a node starts
    one worker for all its probes; they run in waves of one probe per node, so a node never
    starts more than one.
    """
    table: dict[int, str] = _placement_group_table(group)["bundles_to_node_id"]
    missing = [b for b in range(len(bundles)) if b not in table]
    if missing:
        raise RuntimeError(f"Ray reports no node for bundles {missing} of a ready placement group")
    address = {str(n["NodeID"]): str(n["NodeManagerAddress"]) for n in _ray_nodes()}
    gpu_ids: list[tuple[str, ...]] = [() for _ in bundles]
    if any(b.get("GPU") for b in bundles):
        probe = ray.remote(num_cpus=0, max_calls=0)(_where_am_i)
        per_node: dict[str, list[int]] = {}
        for b in range(len(bundles)):
            per_node.setdefault(table[b], []).append(b)
        for wave in range(max(len(v) for v in per_node.values())):
            batch = [v[wave] for v in per_node.values() if wave < len(v)]
            refs = [
                probe.options(
                    num_gpus=bundles[b].get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        group, placement_group_bundle_index=b
                    ),
                ).remote()
                for b in batch
            ]
            for b, (node, ids) in zip(batch, ray.get(refs, timeout=timeout_s), strict=True):
                if node != table[b]:
                    raise RuntimeError(
                        f"bundle {b}: the placement table says node {table[b]}, a task in "
                        f"it ran on {node}"
                    )
                gpu_ids[b] = tuple(ids)
    return [
        BundleSite(node_id=table[b], node_ip=address.get(table[b], "?"), gpu_ids=gpu_ids[b])
        for b in range(len(bundles))
    ]


def reserve_ranks(
    world_size: int,
    resources: RankResources,
    *,
    timeout_s: float = 120.0,
    what: str = "policy ranks",
    devices_per_bundle: int = 1,
) -> Reservation:
    """A placement group with one bundle per rank, where its bundles landed and their slot
    order; a clear error if the cluster cannot fit it.

    A bundle holds ``devices_per_bundle`` whole GPUs when ranks use GPUs (a generation
    engine holds all devices of its tensor-parallel group).
    """
    bundle = {"CPU": resources.num_cpus}
    if resources.num_gpus:
        bundle["GPU"] = float(devices_per_bundle)
    bundles = [dict(bundle) for _ in range(world_size)]
    group: PlacementGroup = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        release_groups([group])
        raise RuntimeError(
            f"the Ray cluster cannot place {world_size} {what} of {bundle} within "
            f"{timeout_s:.0f} s (cluster resources: {cluster_resources()}); check "
            f"cluster.num_nodes, cluster.gpus_per_node and cluster.generation_num_devices"
        )
    try:
        sites = bundle_sites(group, bundles, timeout_s=timeout_s)
    except BaseException:
        release_groups([group])
        raise
    return Reservation(group=group, sites=tuple(sites), order=tuple(order_bundles(sites)))
