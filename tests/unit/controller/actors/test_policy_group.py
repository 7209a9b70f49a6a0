"""The policy actors start with CUDA_DEVICE_MAX_CONNECTIONS=1 on CUDA with TP > 1.

PolicyGroup's real constructor runs on stand-ins for Ray (the actor options are recorded,
then construction stops before any worker is called); the GPU recipe's plan resolves to
cuda without a GPU (cluster.device: cuda).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors import policy_group
from dapo_megatron.controller.actors.placement import ActorPlacement
from dapo_megatron.controller.actors.policy_group import (
    MAX_CONNECTIONS_VAR,
    PolicyGroup,
    policy_env_vars,
    with_env_vars,
)

REPO = Path(__file__).resolve().parents[4]
GPU_RECIPE = REPO / "recipes" / "dapo-qwen3-8b-1n8g-tp4pp1cp1.yaml"  # TP4 + SP, cuda
CPU_RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"


class _Stop(Exception):
    """Ends the constructor once every actor was created."""


def _plan(recipe: Path, *overrides: str) -> RunPlan:
    return load_config(recipe, list(overrides)).require_plan()


def _actor_options(plan: RunPlan, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The ``.options(...)`` of every policy actor PolicyGroup(plan) creates."""
    created: list[dict[str, Any]] = []
    placement = ActorPlacement({"num_gpus": 1, "num_cpus": 1}, 1, None)
    monkeypatch.setattr(policy_group, "rank_resources", lambda *a, **k: SimpleNamespace())
    monkeypatch.setattr(policy_group, "reserve_ranks", lambda *a, **k: SimpleNamespace())
    monkeypatch.setattr(
        policy_group, "policy_placements", lambda *a: [placement] * plan.policy_world_size
    )

    def options(**kwargs: Any) -> SimpleNamespace:
        created.append(kwargs)
        handle = SimpleNamespace(address=SimpleNamespace(remote=lambda: None))
        return SimpleNamespace(remote=lambda *a, **k: handle)

    monkeypatch.setattr(
        policy_group, "ray", SimpleNamespace(remote=lambda cls: SimpleNamespace(options=options))
    )

    def stop(*args: Any) -> list[Any]:
        raise _Stop

    monkeypatch.setattr(policy_group, "gather", stop)
    with pytest.raises(_Stop):
        PolicyGroup(plan)
    assert len(created) == plan.policy_world_size
    return created


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_CONNECTIONS_VAR, raising=False)


def test_policy_actors_on_cuda_with_tp_get_one_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = _plan(GPU_RECIPE)
    assert plan.device == "cuda" and plan.dims.tp == 4 and plan.dims.sequence_parallel
    for options in _actor_options(plan, monkeypatch):
        assert options["runtime_env"] == {"env_vars": {MAX_CONNECTIONS_VAR: "1"}}
        assert options["num_gpus"] == 1  # the placement's options are kept


def test_tp_without_sequence_parallel_gets_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron overlaps the input-gradient all-reduce then (allreduce_dgrad)."""
    plan = _plan(GPU_RECIPE, "policy.megatron.sequence_parallel=false")
    assert policy_env_vars(plan) == {MAX_CONNECTIONS_VAR: "1"}


def test_a_value_the_user_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_CONNECTIONS_VAR, "8")
    assert policy_env_vars(_plan(GPU_RECIPE)) == {MAX_CONNECTIONS_VAR: "8"}


def test_cpu_and_tp1_policies_start_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    for options in _actor_options(_plan(CPU_RECIPE), monkeypatch):
        assert "runtime_env" not in options
    tp1 = _plan(
        GPU_RECIPE,
        "policy.megatron.tensor_model_parallel_size=1",
        "policy.megatron.sequence_parallel=false",
        "generation.engine.tensor_parallel_size=1",
    )
    assert tp1.device == "cuda" and policy_env_vars(tp1) == {}


def test_runtime_env_merges_with_existing_env_vars() -> None:
    options = {"runtime_env": {"env_vars": {"A": "1"}, "pip": ["x"]}, "num_gpus": 1}
    merged = with_env_vars(options, {"B": "2"})
    assert merged["runtime_env"] == {"env_vars": {"A": "1", "B": "2"}, "pip": ["x"]}
    assert options["runtime_env"]["env_vars"] == {"A": "1"}  # not mutated
    assert with_env_vars(options, {}) is options


def test_upstream_warns_without_it_under_tp() -> None:
    """megatron-core 0.16.1 tensor_parallel/layers.py: the check this setting satisfies."""
    layers = pytest.importorskip("megatron.core.tensor_parallel.layers")
    source = inspect.getsource(layers.linear_with_grad_accumulation_and_async_allreduce)
    assert 'os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1"' in source
    assert "if sequence_parallel:" in source and "if allreduce_dgrad:" in source
