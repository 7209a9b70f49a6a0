"""The vLLM backend module without vllm: importable, and a clear error when it is used.

Runs in the main .venv (which has no vllm on purpose); the engine itself is tested in
tests/vllm_backend, in the environment made by scripts/setup_vllm_cpu.sh.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from dapo_megatron.generation import vllm_backend


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
