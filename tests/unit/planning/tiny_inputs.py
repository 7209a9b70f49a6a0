"""The memory-model inputs of a small TP2 x DP2 layout of tiny-qwen2, shared by the planning
tests (import: ``from unit.planning.tiny_inputs import tiny_inputs``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.planning.memory_terms import NO_OVERHEADS, MemoryInputs


def tiny_inputs(**change: Any) -> MemoryInputs:
    """bf16 Adam with the distributed optimizer on an 80 GiB GPU, colocated, no engine and no
    overheads; the default safety margin unless ``margin_gib`` is given."""
    base = MemoryInputs(
        arch=PRESETS["tiny-qwen2"],
        dims=ParallelDims(tp=2, pp=1, cp=1, dp=2, sequence_parallel=True),
        precision="bf16",
        optimizer="adam",
        distributed_optimizer=True,
        recompute="none",
        micro_batch_size=2,
        logprob_micro_batch_size=2,
        seq_len=32,
        micro_batches=4,
        gpu_mem_gib=80.0,
        on_gpu=True,
        colocated=True,
        engine=None,
        overheads=NO_OVERHEADS,
    )
    return dataclasses.replace(base, **change)
