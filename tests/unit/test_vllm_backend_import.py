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
