"""The one builder of the vLLM tests' engines: the backend's fp32 engine of a tiny
checkpoint (TP1, eager, seed 0), in this process unless the test sets
VLLM_ENABLE_V1_MULTIPROCESSING=1. The tests differ only in the model, its context length
and how many sequences one step schedules."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dapo_megatron.generation.vllm_backend import VllmGenerationBackend


def start_engine(
    model_dir: str, *, max_model_len: int, max_num_seqs: int = 32
) -> VllmGenerationBackend:
    """A started engine of ``model_dir``; the caller shuts it down (or uses ``with``)."""
    # Imported here: vllm is absent from the main .venv, where this directory is skipped.
    from dapo_megatron.generation.vllm_backend import VllmGenerationBackend

    return VllmGenerationBackend(
        model_dir,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        max_num_seqs=max_num_seqs,
        enforce_eager=True,
        max_model_len=max_model_len,
        seed=0,
        dtype="float32",
    )
