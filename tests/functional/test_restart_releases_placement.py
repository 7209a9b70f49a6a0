"""A restart places its workers on free resources: the attempt before it leaves no
placement group behind (controller/actors/policy_group.py, cluster.release_groups).

Policy groups on a local 2-CPU Ray whose 2 ranks take every CPU, with a stand-in for the
policy worker (no model): a group stopped, or one whose start failed (a rank died in
setup), has its placement group REMOVED in Ray's placement table before the call returns,
so the next attempt's group is placed at once instead of waiting behind it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray import cloudpickle

from dapo_megatron.config import load_config
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors import policy_group
from dapo_megatron.controller.actors.policy_group import PolicyGroup
from dapo_megatron.controller.actors.remote import WorkerDied

_CHILD_ENV = "DAPO_TEST_IN_FRESH_PROCESS"
pytestmark = pytest.mark.functional

TINY = Path(__file__).resolve().parents[2] / "recipes" / "dapo-tiny-cpu.yaml"


class _Rank:
    """A policy rank without a model: answers the start-up calls (or dies in them)."""

    def __init__(self, plan: RunPlan, *, rank: int, world_size: int, num_threads: int) -> None:
        self.rank = rank

    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    def setup(self, addr: str, port: int) -> dict[str, int]:
        return {"rank": self.rank, "dp_rank": self.rank}


class _DyingRank(_Rank):
    def address(self) -> tuple[str, int]:
        os._exit(1)


_CHILD = _CHILD_ENV


def _in_a_fresh_process(request: pytest.FixtureRequest) -> bool:
    """Run the calling test again in a fresh Python process and report its result; True
    when this IS that process (the test body should run).

    Its local Ray starts in a process of its own, with the authentication mode set before
    ray is imported there (see the call): after another test's in-process Ray, the pytest
    process's own ray module and environment are not a clean start."""
    if os.environ.get(_CHILD) == "1":
        return True
    import waits

    # The child prints its result only at the end and runs a Ray cluster (whose daemons use
    # CPU while idle, so CPU time is no sign of progress): a generous idle limit, scaled.
    out = waits.run(
        [sys.executable, "-m", "pytest", f"{__file__}::{request.node.name}", "-q",
         "-p", "no:cacheprovider"],
        # The authentication mode is fixed before the child imports ray. Ray reads it once, at
        # import: an earlier test's in-process ray.init with the mode unset leaves
        # RAY_AUTH_MODE=token in this process's environment (Ray's own default), and a child
        # that imported ray in token mode and then started its cluster with "disabled" had
        # its actor workers refused by the driver ("died at creation"): the failure seen
        # only in the full session.
        env={**os.environ, _CHILD: "1", "RAY_AUTH_MODE": "disabled"},
        idle_s=300,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return False


@pytest.fixture
def local_ray(request: pytest.FixtureRequest) -> Iterator[bool]:
    if not _in_a_fresh_process(request):
        yield False
        return
    yield from _local_ray()


def _local_ray() -> Iterator[bool]:
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    # The stand-in ranks travel by value: a worker process cannot import this test module.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        address="local", num_cpus=2, include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
    )  # fmt: skip
    try:
        yield True
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _states() -> list[str]:
    table: dict[str, Any] = ray.util.placement_group_table()
    return sorted(str(group["state"]) for group in table.values())


def _plan() -> RunPlan:
    plan = load_config(TINY, ["policy.model_name_or_path=/nonexistent/model"]).require_plan()
    assert plan.policy_world_size == 2 and plan.device == "cpu"
    return plan


def test_a_restart_removes_the_previous_placement_group_first(local_ray, monkeypatch):
    if not local_ray:
        return  # ran, and passed, in a fresh process
    monkeypatch.setattr(policy_group, "PolicyWorker", _Rank)
    plan = _plan()
    first = PolicyGroup(plan)
    assert _states() == ["CREATED"]
    first.shutdown()  # the failed attempt's workers.stop()
    assert _states() == ["REMOVED"]  # before the next group is asked for
    second = PolicyGroup(plan)  # every CPU free again: placed at once
    assert _states() == ["CREATED", "REMOVED"]
    second.shutdown()
    assert _states() == ["REMOVED", "REMOVED"]


def test_a_start_that_fails_releases_its_placement_group(local_ray, monkeypatch):
    if not local_ray:
        return  # ran, and passed, in a fresh process
    monkeypatch.setattr(policy_group, "PolicyWorker", _DyingRank)
    plan = _plan()
    with pytest.raises(WorkerDied, match="policy rank 0"):
        PolicyGroup(plan)  # no handle to stop: the group must release itself
    assert _states() == ["REMOVED"]
    monkeypatch.setattr(policy_group, "PolicyWorker", _Rank)
    again = PolicyGroup(plan)
    assert _states() == ["CREATED", "REMOVED"]
    again.shutdown()
