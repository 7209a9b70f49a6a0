"""NeMo RL's layout keys in the table: the Megatron and DTensor parallel layout, micro-batch
and token budgets, the cluster and the generation engine's placement; nemo_keys.py joins
them to the rest of NeMo RL's keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import ForeignKey, choice, same
from dapo_megatron.migrate.shared_keys import NEMO

NEMO_LAYOUT_KEYS: tuple[ForeignKey, ...] = (
    same(NEMO, "cluster.num_nodes", "cluster.num_nodes"),
    same(NEMO, "cluster.gpus_per_node", "cluster.gpus_per_node"),
    same(NEMO, "policy.train_micro_batch_size", "policy.train_micro_batch_size"),
    same(NEMO, "policy.logprob_batch_size", "policy.logprob_micro_batch_size"),
    choice(
        NEMO,
        "policy.precision",
        "policy.precision",
        {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"},
    ),
    same(
        NEMO,
        "policy.generation.vllm_cfg.tensor_parallel_size",
        "generation.engine.tensor_parallel_size",
    ),
    same(
        NEMO,
        "policy.generation.vllm_cfg.gpu_memory_utilization",
        "generation.engine.gpu_memory_utilization",
    ),
    same(
        NEMO,
        "policy.megatron_cfg.tensor_model_parallel_size",
        "policy.megatron.tensor_model_parallel_size",
    ),
    same(
        NEMO,
        "policy.megatron_cfg.pipeline_model_parallel_size",
        "policy.megatron.pipeline_model_parallel_size",
    ),
    same(
        NEMO,
        "policy.megatron_cfg.context_parallel_size",
        "policy.megatron.context_parallel_size",
    ),
    same(NEMO, "policy.megatron_cfg.sequence_parallel", "policy.megatron.sequence_parallel"),
    choice(
        NEMO,
        "policy.megatron_cfg.activation_checkpointing",
        "policy.megatron.recompute_granularity",
        {True: "full", False: "none"},
    ),
)
"""NeMo RL's layout, cluster and engine-placement keys."""

NEMO_LAYOUT_TIERS: dict[str, str] = {}
"""NeMo RL layout keys (or subtrees ending in ".") classified by what NeMo RL does with them."""


def layout_inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """NeMo RL layout keys of a config that are not live there (key -> why)."""
    return {}
