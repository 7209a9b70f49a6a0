"""The GPU placement of policy ranks and vLLM engines, scheduled on a CPU machine.

Ray is started with 8 declared GPUs (``ray.init(num_gpus=8)`` works without any) and the
actors are started with exactly the options the worker groups compute
(controller/actors/placement.py). Probe actors report the devices Ray assigned them and what they
see after the engine's own device set-up (workers/generation_worker.py
``apply_visible_devices``), plus the vLLM executor the engine would be built with. Only the
actor body differs from a real run; the bookkeeping is the production code.
"""

from __future__ import annotations

import os

import pytest
import ray
import waits
from tiny_job import REPO

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors.cluster import Reservation, rank_resources, reserve_ranks
from dapo_megatron.controller.actors.placement import (
    colocated_engine_placements,
    policy_placements,
    split_engine_placements,
)
from dapo_megatron.generation.vllm_backend import executor_backend
from dapo_megatron.workers.generation_worker import apply_visible_devices

pytestmark = pytest.mark.functional
# Ray's scheduling on a quiet machine takes seconds; scaled by the machine's speed at use.
SCHEDULE_TIMEOUT_S = 60


@ray.remote
class Probe:
    """Stands in for PolicyWorker / GenerationWorker: reports what a real one would see."""

    def __init__(self, visible_devices: str | None = None, tp: int = 1) -> None:
        self.assigned = [str(i) for i in ray.get_gpu_ids()]
        apply_visible_devices(visible_devices)
        self.tp = tp

    def report(self) -> dict:
        return {
            "assigned": self.assigned,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "executor": executor_backend(self.tp),
        }


@pytest.fixture(scope="module")
def gpu_cluster():
    ray.init(
        address="local",
        num_cpus=16,
        num_gpus=8,
        include_dashboard=False,
        object_store_memory=128 * 1024 * 1024,
        _node_ip_address="127.0.0.1",
    )
    yield
    ray.shutdown()


def _plan(*overrides: str) -> RunPlan:
    return load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        [
            "cluster.device=cuda",
            "cluster.gpus_per_node=8",
            "generation.backend=vllm",
            "policy.train_micro_batch_size=8",
            "policy.megatron.data_parallel_size=null",
            *overrides,
        ],
    ).require_plan()


def _reports(actors: list) -> list[dict]:
    return ray.get([a.report.remote() for a in actors], timeout=waits.scaled(SCHEDULE_TIMEOUT_S))


def _policy(plan: RunPlan) -> tuple[Reservation, list, list[dict]]:
    world = plan.policy_world_size
    resources = rank_resources(
        plan.config.cluster, device=plan.device, device_share=plan.policy_device_share
    )
    group = reserve_ranks(world, resources, timeout_s=waits.scaled(SCHEDULE_TIMEOUT_S))
    places = policy_placements(group, plan, resources)
    actors = [Probe.options(**p.options).remote() for p in places]
    return group, actors, _reports(actors)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_colocated_engines_schedule_and_see_their_policy_ranks_devices(gpu_cluster, tp):
    plan = _plan("cluster.colocated=true", f"generation.engine.tensor_parallel_size={tp}")
    group, policy, policy_seen = _policy(plan)
    assert plan.policy_device_share == 0.5 and plan.device == "cuda"
    devices = [r["assigned"][0] for r in policy_seen]
    # One GPU per rank, rank r on GPU r: ranks follow (node, GPU id) order.
    assert devices == [str(i) for i in range(8)]
    assert [group.site(r).gpu_ids for r in range(8)] == [(d,) for d in devices]
    count = plan.num_engines
    assert count == 8 // tp
    places = colocated_engine_placements(group, devices, count, tp)
    engines = [Probe.options(**p.options).remote(p.visible_devices, tp) for p in places]
    seen = _reports(engines)  # every engine scheduled next to the policy within the timeout
    for e, report in enumerate(seen):
        assert report["visible"] == ",".join(devices[e * tp : (e + 1) * tp])
        assert report["assigned"] == [devices[e * tp]]  # Ray's half of its first GPU
        assert report["executor"] == ("uni" if tp == 1 else "mp")
    for actor in policy + engines:
        ray.kill(actor)
    group.remove()


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_split_engines_hold_all_their_gpus_in_one_bundle(gpu_cluster, tp):
    plan = _plan(
        "cluster.colocated=false",
        "cluster.generation_num_devices=4",
        f"generation.engine.tensor_parallel_size={tp}",
    )
    group, policy, policy_seen = _policy(plan)
    count = plan.num_engines
    assert count == 4 // tp and plan.policy_device_share == 1.0
    engine_group, places = split_engine_placements(plan.config.cluster, count, tp, device="cuda")
    engines = [Probe.options(**p.options).remote(p.visible_devices, tp) for p in places]
    seen = _reports(engines)
    engine_devices = [d for r in seen for d in r["assigned"]]
    policy_devices = [d for r in policy_seen for d in r["assigned"]]
    assert all(len(r["assigned"]) == tp for r in seen)
    assert len(set(engine_devices)) == 4 and not set(engine_devices) & set(policy_devices)
    for report in seen:
        # Ray's own CUDA_VISIBLE_DEVICES lists all tp GPUs: vLLM's mp workers inherit it.
        assert sorted(report["visible"].split(","), key=int) == sorted(report["assigned"], key=int)
        assert report["executor"] == ("uni" if tp == 1 else "mp")
    for actor in policy + engines:
        ray.kill(actor)
    group.remove()
    ray.util.remove_placement_group(engine_group)
