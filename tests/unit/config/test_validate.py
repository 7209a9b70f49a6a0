"""Validation of a loaded config (config/validate.py): each refused value names its key
and the constraint; all violations are reported together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_megatron.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"


def error_of(path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


@pytest.mark.parametrize(
    "override, key, constraint",
    [
        ("dapo.loss.clip_ratio_low=-0.1", "dapo.loss.clip_ratio_low", "must be in [0, 1)"),
        (
            "dapo.dynamic_sampling.batch_multiplier=0.5",
            "dapo.dynamic_sampling.batch_multiplier",
            "must be in [1, inf)",
        ),
        (
            "dapo.overlong_buffer.length=16",
            "dapo.overlong_buffer.length",
            "max_response_length = 16",
        ),
        ("policy.megatron.pipeline_model_parallel_size=4", "policy.megatron", "must divide"),
        ("dapo.loss.clip_ratio_c=0.9", "dapo.loss.clip_ratio_c", "must be in (1, inf)"),
        (
            # 256 is not a multiple of 3 x DP2 (the tiny recipe packs, but the check holds)
            "policy.train_micro_batch_size=3",
            "policy.train_global_batch_size",
            "train_micro_batch_size * data_parallel_size",
        ),
        (
            "policy.megatron.sequence_parallel=true",
            "sequence_parallel",
            "tensor_model_parallel_size > 1",
        ),
        ("policy.megatron.data_parallel_size=4", "data_parallel_size", "gives 2"),
        ("generation.top_p=0", "generation.top_p", "(0, 1]"),
        ("policy.max_total_sequence_length=40", "policy.max_total_sequence_length", "= 48"),
        ("dapo.num_generations_per_prompt=1", "dapo.num_generations_per_prompt", ">= 2 samples"),
    ],
)
def test_invalid_values_name_key_and_constraint(override, key, constraint):
    msg = error_of(TINY, override)
    assert key in msg and constraint in msg


def test_query_groups_not_divisible_by_tp():
    # tiny-qwen2: 4 heads, 2 query groups. TP=4 divides the heads but not the groups.
    msg = error_of(TINY, "cluster.gpus_per_node=4", "policy.megatron.tensor_model_parallel_size=4")
    assert "num_query_groups (key/value heads) = 2" in msg
    assert "num_attention_heads" not in msg


def test_all_violations_reported_together():
    msg = error_of(TINY, "dapo.loss.clip_ratio_low=-1", "generation.temperature=0")
    assert msg.startswith("2 invalid settings")


def test_checkpoint_config_json_wins_over_preset(tmp_path):
    hf = {
        "model_type": "llama",
        "num_hidden_layers": 6,
        "hidden_size": 96,
        "intermediate_size": 256,
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "vocab_size": 100,
        "max_position_embeddings": 128,
    }
    model = tmp_path / "model"
    model.mkdir()

    (model / "config.json").write_text(json.dumps(hf))
    loaded = load_config(TINY, [f"policy.model_name_or_path={model}"])
    assert loaded.plan.arch.num_layers == 6
    assert "config.json" in loaded.plan.arch_source
    # 3 query groups cannot be split over TP=2.
    msg = error_of(
        TINY,
        f"policy.model_name_or_path={model}",
        "cluster.gpus_per_node=2",
        "policy.megatron.tensor_model_parallel_size=2",
    )
    assert "num_query_groups (key/value heads) = 3" in msg


def test_split_mode_world_size():
    loaded = load_config(
        TINY,
        ["cluster.gpus_per_node=4", "cluster.colocated=false", "cluster.generation_num_devices=2"],
    )
    assert loaded.plan.dims.dp == 2
    msg = error_of(TINY, "cluster.colocated=false", "cluster.generation_num_devices=0")
    assert "cluster.generation_num_devices" in msg


def test_seq_mean_token_mean_refused_under_context_parallelism():
    msg = error_of(
        TINY,
        "policy.megatron.context_parallel_size=2",
        "dapo.loss.loss_agg_mode=seq-mean-token-mean",
        "policy.train_micro_batch_size=32",
    )
    assert "dapo.loss.loss_agg_mode" in msg and "context_parallel_size > 1" in msg


def test_arithmetic_validation_split_must_fit_the_task():
    # Two single-digit operands with "+" give 10 * 10 = 100 distinct problems.
    msg = error_of(TINY, "data.arithmetic.difficulty=2", "data.arithmetic.num_val=100")
    assert "data.arithmetic.num_val" in msg and "only 100 distinct problems" in msg


@pytest.mark.parametrize(
    "key", ["policy.megatron.pipeline_model_parallel_size", "policy.megatron.context_parallel_size"]
)
def test_colocated_megatron_generation_refuses_pipeline_and_context_parallelism(key):
    # The policy ranks would generate on a layout Megatron generation cannot run: refused
    # before any worker starts, naming the key and the ways out.
    msg = error_of(TINY, f"{key}=2")
    assert f"{key} = 2" in msg and "cluster.colocated=false" in msg
    # Split engines have a layout of their own: the same policy layout is accepted.
    plan = load_config(
        TINY,
        [
            f"{key}=2",
            "cluster.gpus_per_node=3",
            "cluster.colocated=false",
            "cluster.generation_num_devices=1",
            "policy.train_micro_batch_size=32",
        ],
    )
    assert plan.config.cluster.colocated is False


def test_broadcast_refit_to_colocated_gpu_engines_is_refused(tmp_path):
    # NCCL cannot hold two ranks of one communicator (policy rank 0 and the engine worker
    # beside it) on one GPU: refused before any worker starts, naming both keys, the file
    # and the ways out.
    recipe = tmp_path / "colocated-broadcast.yaml"
    recipe.write_text(
        f"defaults: {TINY}\n"
        "generation:\n  backend: vllm\n  refit_transport: broadcast\n"
        "cluster:\n  device: cuda\n"
    )
    msg = error_of(recipe, "policy.model_name_or_path=/nonexistent/model")
    assert f"generation.refit_transport = 'broadcast' (set in {recipe})" in msg
    assert "cluster.colocated = true" in msg and "NCCL" in msg
    assert "generation.refit_transport=ipc" in msg and "cluster.colocated=false" in msg
    # auto resolves to ipc on GPU; device auto is refused too (only GPUs run it).
    ok = load_config(recipe, ["policy.model_name_or_path=/x", "generation.refit_transport=auto"])
    assert ok.require_plan().refit_transport == "ipc"
    assert "NCCL" in error_of(recipe, "policy.model_name_or_path=/x", "cluster.device=auto")


def test_broadcast_refit_stays_allowed_where_gloo_carries_it():
    # Split engines on CPU (the tiny vLLM recipe) and colocated Megatron generation (no
    # engine workers: nothing is broadcast) keep the broadcast.
    cpu_vllm = load_config(REPO / "recipes" / "dapo-tiny-cpu-vllm.yaml")
    assert cpu_vllm.require_plan().refit_transport == "broadcast"
    megatron = load_config(TINY, ["cluster.device=cuda", "generation.refit_transport=broadcast"])
    assert megatron.config.cluster.colocated and megatron.config.generation.backend == "megatron"


def test_max_num_epochs_is_null_or_at_least_one_and_synchronous():
    assert load_config(TINY, []).config.dapo.max_num_epochs is None  # the default: steps only
    assert load_config(TINY, ["dapo.max_num_epochs=2"]).config.dapo.max_num_epochs == 2
    assert "dapo.max_num_epochs = 0" in error_of(TINY, "dapo.max_num_epochs=0")
    msg = error_of(TINY, "dapo.max_num_epochs=2", "rollout.max_staleness=1")
    assert "dapo.max_num_epochs = 2" in msg and "rollout.max_staleness=0" in msg
