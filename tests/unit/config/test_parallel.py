"""The parallel layout (config/parallel.py): derived data parallelism and the layouts
refused, expert parallelism included."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.config import ConfigError, load_config
from dapo_megatron.config.parallel import ParallelDims

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"


def error_of(path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def test_expert_parallel_size_is_checked_against_the_layout_and_the_model():
    dims = ParallelDims.build(world_size=8, tp=2, pp=1, cp=1, dp=None, sequence_parallel=True, ep=4)
    assert (dims.dp, dims.ep) == (4, 4)
    with pytest.raises(ConfigError, match="expert_model_parallel_size = 3 must divide"):
        ParallelDims.build(world_size=8, tp=2, pp=1, cp=1, dp=None, sequence_parallel=False, ep=3)
    # A dense model refuses EP > 1; a MoE needs EP to divide its experts (tiny: 4).
    dense = error_of(
        TINY, "cluster.gpus_per_node=2", "policy.megatron.expert_model_parallel_size=2"
    )
    assert "needs a mixture-of-experts model" in dense
    moe = error_of(
        TINY,
        "policy.model_arch=tiny-qwen3-moe",
        "cluster.gpus_per_node=8",
        "policy.megatron.expert_model_parallel_size=8",
    )
    assert "must divide num_experts = 4" in moe


def test_parallel_dims_derive_dp_and_reject_bad_layouts():
    dims = ParallelDims.build(world_size=32, tp=4, pp=2, cp=2, dp=None, sequence_parallel=True)
    assert (dims.dp, dims.world_size, dims.model_parallel_size) == (2, 32, 16)
    with pytest.raises(ConfigError, match="must divide the policy world size 12"):
        ParallelDims.build(world_size=12, tp=8, pp=1, cp=1, dp=None, sequence_parallel=False)
    with pytest.raises(ConfigError, match="context_parallel_size = 0"):
        ParallelDims.build(world_size=8, tp=1, pp=1, cp=0, dp=None, sequence_parallel=False)
