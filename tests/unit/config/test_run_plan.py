"""The run plan: every derived value computed once by load_config, by hand-derived numbers."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from dapo_megatron.config import ConfigError, load_config, run_plan
from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.refit_transport import RefitTransport
from dapo_megatron.config.run_plan import RunPlan, policy_plan, runtime_problems

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"


def plan_of(*overrides: str) -> RunPlan:
    return load_config(
        TINY, ["policy.model_name_or_path=/nonexistent/model", *overrides]
    ).require_plan()


def test_tiny_recipe_plan_by_hand() -> None:
    plan = plan_of("run.output_dir=/runs/x")
    # 1 node x 2 CPU "devices", colocated megatron, TP1 PP1 CP1: DP2, engines = DP replicas.
    assert plan.dims == ParallelDims(tp=1, pp=1, cp=1, dp=2, sequence_parallel=False)
    assert plan.policy_world_size == 2 and plan.generation_devices == 2
    assert plan.num_engines == 2 and not plan.needs_engine_workers
    assert plan.device == "cpu" and plan.refit_transport == "broadcast"
    assert plan.sampling_seeds == "per_request" and plan.policy_device_share == 1.0
    # No config.json at the path: the recipe's preset is the architecture.
    assert plan.arch == PRESETS["tiny-qwen2"] and plan.arch_source == "preset tiny-qwen2"
    # vocab 64 padded to a multiple of 128 * TP.
    assert plan.padded_vocab_size == 128
    assert plan.run_dir == Path("/runs/x") and plan.checkpoint_dir == Path("/runs/x/checkpoints")
    # 32 prompts x 8 samples / global batch 256 = 1 optimizer step per DAPO step.
    cfg = plan.config
    assert plan.total_optimizer_steps == cfg.dapo.max_num_steps
    # loss_scale_length null resolves to the response cap.
    assert cfg.dapo.loss.loss_scale_length is None
    assert plan.loss.loss_scale_length == cfg.generation.max_response_length


def test_split_vllm_plan_by_hand() -> None:
    plan = plan_of(
        "cluster.device=cuda", "cluster.gpus_per_node=8", "cluster.num_nodes=2",
        "cluster.colocated=false", "cluster.generation_num_devices=8",
        "generation.backend=vllm", "generation.engine.tensor_parallel_size=2",
        "policy.megatron.tensor_model_parallel_size=2", "policy.train_micro_batch_size=4",
        "generation.sampling_seeds=auto", "checkpointing.checkpoint_dir=/ckpt",
    )  # fmt: skip
    # 16 devices - 8 for generation = 8 policy ranks; TP2 -> DP4; 8 / TP2 = 4 engines.
    assert plan.policy_world_size == 8 and plan.dims.dp == 4
    assert plan.generation_devices == 8 and plan.num_engines == 4 and plan.needs_engine_workers
    assert plan.refit_transport == "broadcast" and plan.policy_device_share == 1.0
    assert plan.sampling_seeds == "engine" and plan.checkpoint_dir == Path("/ckpt")
    assert plan.padded_vocab_size == 256  # 64 padded to a multiple of 128 * 2


def test_colocated_vllm_on_gpu_shares_devices_and_uses_ipc(monkeypatch) -> None:
    monkeypatch.setattr(run_plan, "te_installed", lambda: True)
    plan = plan_of(
        "cluster.device=cuda", "cluster.gpus_per_node=4", "generation.backend=vllm",
        "generation.engine.tensor_parallel_size=2", "policy.train_micro_batch_size=8",
    )  # fmt: skip
    assert plan.num_engines == 2 and plan.policy_device_share == 0.5
    assert plan.refit_transport == "ipc" and runtime_problems(plan) == []


def test_colocated_vllm_that_resolves_to_cpu_is_a_runtime_problem() -> None:
    # cluster.device=auto validates (a GPU recipe on a CPU login node), but cannot run here.
    plan = plan_of("generation.backend=vllm", "cluster.device=auto")
    assert plan.device == "cpu"
    (problem,) = runtime_problems(plan)
    assert "cluster.colocated = true needs GPUs" in problem and "cluster.device = auto" in problem


def test_missing_transformer_engine_on_cuda_is_a_runtime_problem(monkeypatch) -> None:
    """Refused before any worker starts, unless the user opts into the local spec."""
    monkeypatch.setattr(run_plan, "te_installed", lambda: False)
    plan = plan_of("cluster.device=cuda", "generation.backend=megatron")
    (problem,) = runtime_problems(plan)
    assert "transformer_engine is not installed" in problem
    assert "policy.allow_local_spec=true" in problem and "'.[gpu]'" in problem
    opted_in = plan_of(
        "cluster.device=cuda", "generation.backend=megatron", "policy.allow_local_spec=true"
    )
    assert runtime_problems(opted_in) == []
    monkeypatch.setattr(run_plan, "te_installed", lambda: True)
    assert runtime_problems(plan) == []
    # CPU runs never need it.
    assert runtime_problems(plan_of("generation.backend=megatron")) == []


def test_plan_is_frozen_and_picklable_for_ray() -> None:
    plan = plan_of()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.num_engines = 3  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan and again.loss == plan.loss


def test_policy_slice_carries_the_same_values() -> None:
    plan = plan_of()
    sliced = plan.policy()
    assert (sliced.dims, sliced.arch, sliced.loss) == (plan.dims, plan.arch, plan.loss)
    assert sliced.total_optimizer_steps == plan.total_optimizer_steps
    # Built outside a run (tests, dapo-export): the given layout, the preset architecture.
    other = policy_plan(plan.config, ParallelDims(2, 1, 1, 1, False))
    assert other.dims.tp == 2 and other.arch == plan.arch and other.loss == plan.loss


def test_no_derivation_outside_the_plan() -> None:
    # The parallel layout, architecture and engine count are derived in config/ only:
    # workers and the controller read them from the plan.
    for rel in ("megatron/policy.py", "workers/generation_worker.py", "workers/policy_worker.py",
                "controller/actors/generation_group.py", "controller/actors/policy_group.py", "cli.py"):  # fmt: skip
        text = (REPO / "dapo_megatron" / rel).read_text()
        for call in (
            "parallel_dims(",
            "resolve_arch(",
            "policy_world_size(",
            "generation_devices(",
        ):
            assert call not in text, f"dapo_megatron/{rel} derives {call[:-1]} again"


def test_empty_policy_world_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cluster.gpus_per_node = 0 .*must be >= 1"):
        plan_of("cluster.gpus_per_node=0")


def test_policy_moe_reaches_the_policy_plan_and_is_validated() -> None:
    moe = ("policy.model_arch=tiny-qwen3-moe", "policy.megatron.expert_model_parallel_size=2")
    plan = plan_of(*moe, "policy.moe.token_dispatcher=allgather", "policy.moe.aux_loss_coef=0.01")
    assert plan.moe == run_plan.MoeTraining(aux_loss_coef=0.01, token_dispatcher="allgather")
    assert plan.policy().moe == plan.moe and plan.dims.ep == 2
    # The defaults a model built outside a run uses are dapo_base.yaml's.
    assert plan_of().moe == run_plan.FORWARD_MOE

    def error(*overrides: str) -> str:
        with pytest.raises(ConfigError) as info:
            plan_of(*moe, *overrides)
        return str(info.value)

    replay = plan_of(*moe, "policy.moe.routing_replay=true")  # the tiny recipe: megatron engine
    assert replay.moe.routing_replay and replay.policy().moe.routing_replay
    vllm = error("policy.moe.routing_replay=true", "generation.backend=vllm")
    assert "policy.moe.routing_replay" in vllm and "_verify_aux_output_compatibility" in vllm
    pp_full = error(
        "policy.moe.routing_replay=true",
        "cluster.gpus_per_node=4",
        "policy.megatron.pipeline_model_parallel_size=2",
        "policy.megatron.recompute_granularity=full",
    )
    assert "would replay another micro-batch's routing" in pp_full
    with pytest.raises(ConfigError, match="routing_replay.*needs a mixture-of-experts model"):
        plan_of("policy.moe.routing_replay=true")
    assert "policy.moe.aux_loss_coef = -0.1" in error("policy.moe.aux_loss_coef=-0.1")
    # Megatron's MoE layer refuses to train under TP without sequence parallelism.
    tp_no_sp = error("cluster.gpus_per_node=4", "policy.megatron.tensor_model_parallel_size=2")
    assert "policy.megatron.sequence_parallel = False" in tp_no_sp
    assert "token_dispatcher" in error("policy.moe.token_dispatcher=ring")


def test_the_refit_transport_is_chosen_once_and_answers_every_refit_question() -> None:
    # The factory resolves auto; every other module asks the transport object its traits.
    ipc, broadcast, fallback = (
        RefitTransport.IPC, RefitTransport.BROADCAST, RefitTransport.OBJECT_STORE
    )  # fmt: skip
    assert isinstance(plan_of().refit_transport, RefitTransport)
    assert plan_of("generation.refit_transport=object_store").refit_transport is fallback
    # Weight group: every policy rank joins the shared buffer's gloo barriers; rank 0
    # broadcasts over the device's backend.
    assert (ipc.group_senders(4), ipc.group_backend("cuda")) == (4, "gloo")
    assert (broadcast.group_senders(4), broadcast.group_backend("cuda")) == (1, "nccl")
    assert broadcast.group_backend("cpu") == "gloo"
    # Memory terms: exporters and receive buffers.
    assert ipc.bucket_exporters(8, 2) == 2 and broadcast.bucket_exporters(8, 2) == 1
    assert (ipc.receive_buffers, broadcast.receive_buffers) == (1, 2)
    assert ipc.needs_group() and broadcast.needs_group() and not fallback.needs_group()
    # Its constraints on the cluster are its own (test_validate.py: the refusals); the
    # object store and a one-node cluster have none.
    config = plan_of().config
    assert config.cluster.num_nodes == 1
    for transport in (ipc, fallback):
        assert transport.cluster_problems(config.generation, config.cluster, "the recipe") == []
    # A str: it crosses Ray and collective_rpc as its name, and pickles as itself.
    assert pickle.loads(pickle.dumps(ipc)) is ipc and str(ipc) == "ipc"
    with pytest.raises(ValueError, match="not a collective refit transport"):
        from dapo_megatron.refit.halves import halves_of

        halves_of("object_store")


# One staleness bound per run: max_carry_age at K = 0, rollout.max_staleness at K >= 1.
SPLIT_K = ["cluster.gpus_per_node=3", "cluster.colocated=false", "cluster.generation_num_devices=1"]


@pytest.mark.parametrize(
    ("overrides", "age"),
    [
        ([], 1),  # null at K = 0: 1
        (["dapo.dynamic_sampling.max_carry_age=3"], 3),
        ([*SPLIT_K, "rollout.max_staleness=2"], 2),  # null at K = 2: K
        ([*SPLIT_K, "rollout.max_staleness=2", "dapo.dynamic_sampling.max_carry_age=2"], 2),
    ],
)
def test_max_group_age_is_resolved_once(overrides: list[str], age: int) -> None:
    assert plan_of(*overrides).max_group_age == age


def test_a_max_carry_age_that_overlapping_rollouts_would_replace_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        plan_of(*SPLIT_K, "rollout.max_staleness=2", "dapo.dynamic_sampling.max_carry_age=1")
    message = str(info.value)
    assert "dapo.dynamic_sampling.max_carry_age" in message
    assert "rollout.max_staleness=2" in message and "null" in message
