"""The generation worker releases cached memory only where its engine's memory lives
(workers/generation_worker.py).

vLLM's engine core runs in child processes: the actor's own process holds none of the
engine's memory, and ``torch.cuda.synchronize`` there would only create a CUDA context
(see device/test_memory_release.py). The GPU facts are patched in."""

from __future__ import annotations

from typing import Any

import pytest

from dapo_megatron.generation.vllm_backend import VllmGenerationBackend
from dapo_megatron.workers.generation_worker import GenerationWorker, engine_memory_in_process

ZERO = {"reserved_before": 0, "reserved_after": 0, "released": 0}


class _Backend:
    """A generation backend whose memory is (or is not) in the actor's process."""

    def __init__(self, in_process: bool | None) -> None:
        self.slept = False
        if in_process is not None:
            self.memory_in_process = in_process

    def sleep(self) -> None:
        self.slept = True


def _worker(backend: Any) -> GenerationWorker:
    worker = object.__new__(GenerationWorker)
    worker.backend = backend
    return worker


def test_engine_actor_with_vllm_in_child_processes_releases_nothing(
    cuda_calls: list[str],
) -> None:
    """Even with CUDA state in the actor, its vLLM memory is in the children: no call."""
    backend = _Backend(in_process=False)
    assert _worker(backend).sleep() == ZERO
    assert backend.slept and cuda_calls == []


def test_in_process_engine_releases(cuda_calls: list[str]) -> None:
    backend = _Backend(in_process=True)
    released = _worker(backend).sleep()
    assert released["reserved_before"] == 1 << 30
    assert cuda_calls == ["sync", "gc", "empty_cache"]


def test_backends_without_the_flag_hold_their_memory_in_process() -> None:
    assert engine_memory_in_process(_Backend(in_process=None))  # type: ignore[arg-type]


@pytest.mark.parametrize("in_process", [True, False])
def test_vllm_backend_reports_where_its_memory_lives(in_process: bool) -> None:
    backend = object.__new__(VllmGenerationBackend)
    backend._in_process = in_process
    assert backend.memory_in_process is in_process
    assert engine_memory_in_process(backend) is in_process
