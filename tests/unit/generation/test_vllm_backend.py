"""The vLLM backend module without vllm: importable, and a clear error when it is used.

Runs in the main .venv (which has no vllm on purpose); the engine itself is tested in
tests/vllm_backend, in the environment made by scripts/setup_vllm_cpu.sh.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from dapo_megatron.generation import vllm_backend
from dapo_megatron.generation.vllm_backend import VllmGenerationBackend
from dapo_megatron.refit.buckets import plan_buckets


def test_missing_vllm_names_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError) as info:
        vllm_backend.import_vllm()
    message = str(info.value)
    assert "'.[gpu]'" in message
    assert "scripts/setup_vllm_cpu.sh" in message
    assert "generation.backend=megatron" in message


def test_namespace_directory_named_vllm_is_not_vllm(monkeypatch, tmp_path) -> None:
    # A directory named vllm on sys.path (e.g. a tests/vllm folder) must not pass for vllm.
    (tmp_path / "vllm").mkdir()
    # setitem first so that monkeypatch also removes the module this test imports.
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.delitem(sys.modules, "vllm")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    if importlib.util.find_spec("vllm").has_location:
        pytest.skip("the real vllm is installed here")
    with pytest.raises(ImportError, match="namespace directory"):
        vllm_backend.import_vllm()


def test_cpu_environment_keeps_callers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    names = (
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
    )
    for name in names:
        # setenv first so that monkeypatch restores the original state of each variable,
        # including the ones configure_cpu_environment sets itself.
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")

    applied = vllm_backend.configure_cpu_environment(tensor_parallel_size=1)
    assert applied == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4"

    # TP > 1 needs vLLM's worker processes: multiprocessing stays vLLM's choice.
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm_backend.configure_cpu_environment(2)


def test_runner_environment_pins_v1_on_every_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same on CPU and CUDA (tests/vllm_backend/test_engine_config.py runs vLLM's choice).
    name, value = vllm_backend.RUNNER_ENVIRONMENT
    assert (name, value) == ("VLLM_USE_V2_MODEL_RUNNER", "0")
    monkeypatch.setenv(name, "placeholder")
    monkeypatch.delenv(name)
    assert vllm_backend.configure_runner_environment() == {name: value}
    assert os.environ[name] == value
    assert vllm_backend.configure_runner_environment() == {}
    monkeypatch.setenv(name, "1")
    with pytest.raises(ValueError, match="V1 model runner"):
        vllm_backend.configure_runner_environment()


def test_engine_arguments_need_no_vllm() -> None:
    args = vllm_backend.engine_arguments(
        "/m",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.5,
        max_num_seqs=8,
        enforce_eager=True,
        max_model_len=64,
        seed=0,
        dtype="bfloat16",
        enable_sleep_mode=True,
        cuda=True,
    )
    assert args["logprobs_mode"] == "processed_logits"
    assert args["moe_backend"] == "triton"
    assert args["logits_processors"] == [vllm_backend.LOGITS_PROCESSOR]
    assert args["distributed_executor_backend"] == "mp"


# ---------------------------------------------------------------------------------------
# The vLLM backend's sleep/wake protocol around a refit, against a recording stand-in for
# ``vllm.LLM`` (no vllm import: the real engine has no sleep mode on CPU, so this ordering is
# what CI can check of the GPU path; the calls themselves are vLLM 0.32's LLM.sleep(level),
# LLM.wake_up(tags) and LLM.collective_rpc, vllm/entrypoints/llm.py).
#
# A refit must never bring the stale weights back (sleep level 2 discards them; the refit
# wakes only the weight memory), and the KV cache comes back only for generation.


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
    layout = plan_buckets([("w", (4,))], torch.float32, 1024)
    backend.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        backend._engine()  # generate() would refuse: nothing is mapped
    backend.receive_weights(layout)
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
