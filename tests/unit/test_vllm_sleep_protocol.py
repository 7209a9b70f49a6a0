"""The vLLM backend's sleep/wake protocol around a refit, against a recording stand-in for
``vllm.LLM`` (no vllm import: the real engine has no sleep mode on CPU, so this ordering is
what CI can check of the GPU path; the calls themselves are vLLM 0.32's LLM.sleep(level),
LLM.wake_up(tags) and LLM.collective_rpc, vllm/entrypoints/llm.py).

A refit must never bring the stale weights back (sleep level 2 discards them; the refit
wakes only the weight memory), and the KV cache comes back only for generation.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dapo_megatron.generation.vllm_backend import VllmGenerationBackend
from dapo_megatron.refit.buckets import plan_buckets


class RecordingLLM:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list:
        self.calls.append(("collective_rpc", method))
        return [{"bytes": 1.0}]

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


def _backend(llm: RecordingLLM) -> VllmGenerationBackend:
    backend = object.__new__(VllmGenerationBackend)
    backend._llm = llm
    backend._asleep = set()
    backend._sleep_supported = True
    backend._in_process = False
    backend._worker = SimpleNamespace(
        RECEIVE_WEIGHTS="dapo_receive_weights",
        RELOAD_SERIALISED="dapo_reload_serialised_weights",
        serialise_weights=lambda weights: list(weights),
    )
    return backend


def test_refit_wakes_only_the_weights_and_generation_the_kv_cache() -> None:
    llm = RecordingLLM()
    backend = _backend(llm)
    plan = plan_buckets([("w", (4,))], torch.float32, 1024)
    backend.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        backend._engine()  # generate() would refuse: nothing is mapped
    backend.receive_weights(plan)
    backend.wake()
    assert llm.calls == [
        ("sleep", 2),  # weights and KV cache discarded, not offloaded
        ("wake_up", ("weights",)),  # memory re-mapped, no stale copy restored
        ("collective_rpc", "dapo_receive_weights"),
        ("reset_prefix_cache",),
        ("wake_up", ("kv_cache",)),  # only what is still asleep
    ]
    backend.wake()  # awake: nothing more
    assert len(llm.calls) == 5


def test_object_store_refit_follows_the_same_protocol() -> None:
    llm = RecordingLLM()
    backend = _backend(llm)
    backend.sleep()
    backend.update_weights([("w", torch.zeros(2))])
    assert llm.calls[:3] == [
        ("sleep", 2),
        ("wake_up", ("weights",)),
        ("collective_rpc", "dapo_reload_serialised_weights"),
    ]
