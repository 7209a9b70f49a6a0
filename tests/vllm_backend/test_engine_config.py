"""vLLM's GPU-side decisions about our engine, run on CPU with a CUDA node's facts patched in.

The CPU build never takes these decisions the way a GPU node does: it has no Triton backend,
so vLLM 0.32 always picks its V1 model runner there, while on CUDA it picks Model Runner V2
(``VllmConfig.use_v2_model_runner``), whose frontend refuses V1-interface logits processors
when ``LLM()`` starts. Here vLLM's own code decides, on our engine arguments
(``vllm_backend.engine_arguments`` + ``configure_runner_environment``, what the backend
passes on every platform), with the facts of a CUDA node:

* Triton: vLLM's ``HAS_TRITON`` decision (vllm/triton_utils/importing.py) re-run with
  Triton's NVIDIA driver active and a non-CPU vLLM build must say True; that value is what
  ``use_v2_model_runner`` reads (vllm/config/vllm.py);
* sleep mode is available (the backend then asks for it: the only platform-dependent
  argument).

Then: the runner is V1; the frontend's processor validator (vllm/v1/engine/input_processor.py
``_build_logits_processors_params_validator``) accepts our processor and request params; V1's
worker-side loader builds it; V1's top-k/top-p sampler on CUDA takes its native path (the
one that returns processed logits). Against the arguments of before (no runner pinned) the
runner test fails (V2 chosen) and the validator test raises V2's "is not a subclass of
vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor", the error a GPU node gave.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers

from dapo_megatron.generation import vllm_backend

MAX_MODEL_LEN = 64


def _save_config(out: Path) -> str:
    """A tiny Qwen2 checkpoint directory with its config only: no engine starts here."""
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_MODEL_LEN,
        tie_word_embeddings=True,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    config.save_pretrained(out)
    return str(out)


def cuda_node_has_triton(
    monkeypatch: pytest.MonkeyPatch, *, nvidia_active: bool = True, visible_devices: str = "0"
) -> bool:
    """vLLM's ``HAS_TRITON`` as computed on a CUDA node: its module re-executed (a fresh copy,
    the imported one stays as it is) with a vLLM build that is not the CPU one, Triton's
    NVIDIA driver active (or not) and the AMD one not, and CUDA_VISIBLE_DEVICES as given."""
    import triton.backends
    import vllm.platforms
    from vllm.triton_utils import importing

    def backend(active: bool) -> SimpleNamespace:
        return SimpleNamespace(driver=SimpleNamespace(is_active=lambda: active))

    drivers = {"nvidia": backend(nvidia_active), "amd": backend(False)}
    monkeypatch.setattr(triton.backends, "backends", drivers)
    monkeypatch.setattr(vllm.platforms, "vllm_version_matches_substr", lambda substr: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible_devices)
    spec = importlib.util.spec_from_file_location("_triton_on_a_cuda_node", importing.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return bool(module.HAS_TRITON)


def _apply_cuda_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.config.vllm as vllm_config_module
    from vllm import envs
    from vllm.platforms import current_platform

    has_triton = cuda_node_has_triton(monkeypatch)
    assert has_triton, "vLLM's own check says a CUDA node with Triton has no Triton"
    # The name use_v2_model_runner and _validate_v2_model_runner read.
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", has_triton)
    monkeypatch.setattr(current_platform, "is_sleep_mode_available", lambda: True)
    # An engine started in this process (another test) caches vllm.envs; read them afresh.
    if envs._is_envs_cache_enabled():
        monkeypatch.setattr(envs, "__getattr__", envs.__getattr__.__wrapped__)


def _arguments(model_dir: str, *, enable_sleep_mode: bool, cuda: bool = True) -> dict[str, Any]:
    # A GPU recipe's engine (bf16, CUDA graphs, TP 1).
    return vllm_backend.engine_arguments(
        model_dir,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        max_num_seqs=8,
        enforce_eager=False,
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        dtype="bfloat16",
        enable_sleep_mode=enable_sleep_mode,
        cuda=cuda,
    )


@pytest.fixture(scope="module")
def cuda_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The VllmConfig of our GPU engine, built by vLLM (``EngineArgs.create_engine_config``,
    as ``LLM()`` does) with the CUDA facts and the backend's runner environment in place;
    the facts stay patched while the module's tests run."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    model_dir = _save_config(tmp_path_factory.mktemp("engine_config") / "model")
    with pytest.MonkeyPatch.context() as monkeypatch:
        # Restored afterwards whatever the backend sets (an engine test may have set it).
        monkeypatch.setenv(vllm_backend.RUNNER_ENVIRONMENT[0], "placeholder")
        monkeypatch.delenv(vllm_backend.RUNNER_ENVIRONMENT[0])
        _apply_cuda_facts(monkeypatch)
        vllm_backend.configure_runner_environment()
        args = _arguments(model_dir, enable_sleep_mode=current_platform.is_sleep_mode_available())
        yield EngineArgs(**args).create_engine_config()


@pytest.mark.parametrize(
    ("nvidia_active", "visible_devices", "expected"),
    [
        (True, "0", True),  # a CUDA node: V2 by default
        (False, "", True),  # a Ray actor while CUDA_VISIBLE_DEVICES is still empty: too
        (False, "0", False),  # control: no active driver, not in Ray's start-up window
    ],
)
def test_vllm_sees_triton_on_a_cuda_node(
    monkeypatch, nvidia_active: bool, visible_devices: str, expected: bool
) -> None:
    """The facts _apply_cuda_facts relies on (seen on an H200 with Triton 3.6: NVIDIA driver
    active, AMD not; HAS_TRITON True with CUDA_VISIBLE_DEVICES unset, "0" and "")."""
    has_triton = cuda_node_has_triton(
        monkeypatch, nvidia_active=nvidia_active, visible_devices=visible_devices
    )
    assert has_triton is expected


def test_arguments_differ_from_the_cpu_build_only_in_sleep_mode_and_moe_kernel(tmp_path) -> None:
    cpu = _arguments(str(tmp_path), enable_sleep_mode=False, cuda=False)
    cuda = _arguments(str(tmp_path), enable_sleep_mode=True, cuda=True)
    assert {k for k in cuda if cuda[k] != cpu[k]} == {"enable_sleep_mode", "moe_backend"}
    assert cuda["logprobs_mode"] == vllm_backend.LOGPROBS_MODE == "processed_logits"


def test_cuda_engine_runs_moe_experts_whose_weights_a_refit_keeps_current(cuda_config) -> None:
    """vLLM 0.32 calls an experts class's ``process_weights_after_loading`` at the first
    load only (unquantized_fused_moe_method.py ``_setup_kernel``, ``is_weight_update``), so
    a refit is exact only with experts that prepare nothing there. On CUDA the oracle's own
    choice depends on the GPU (Blackwell tries FlashInfer first, whose CUTLASS experts do
    prepare); the engine pins Triton, whose experts keep the base no-op. On CPU the only
    experts prepack, which vllm_worker._repack_experts redoes after every refit."""
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.oracle import unquantized as oracle

    assert cuda_config.kernel_config.moe_backend == "triton"
    backend = oracle.map_unquantized_backend(cuda_config.kernel_config.moe_backend)
    assert backend == oracle.UnquantizedMoeBackend.TRITON
    base = mk.FusedMoEExperts.process_weights_after_loading
    for experts in oracle.backend_to_kernel_cls(backend):
        assert experts.process_weights_after_loading is base, experts
    # Controls: the experts of the unpinned choices this guards against do prepare.
    from vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe import (
        FlashInferExperts,
    )

    assert FlashInferExperts.process_weights_after_loading is not base
    for experts in oracle.backend_to_kernel_cls(oracle.UnquantizedMoeBackend.CPU):
        assert experts.process_weights_after_loading is not base, experts


def test_cuda_node_runs_the_v1_model_runner(cuda_config) -> None:
    assert cuda_config.model_config.enable_sleep_mode
    assert cuda_config.use_v2_model_runner is False, (
        "with a CUDA node's facts vLLM picks Model Runner V2 for our engine arguments; the "
        "CPU build runs V1, and V2 refuses FullVocabLogprobs"
    )
    vllm_backend.check_model_runner(cuda_config)


def test_cuda_frontend_accepts_the_logits_processor(cuda_config) -> None:
    """The validator ``LLM()`` builds at start, then the one it runs on every request."""
    import vllm
    from vllm.v1.engine.input_processor import InputProcessor

    frontend = SimpleNamespace(model_config=cuda_config.model_config, vllm_config=cuda_config)
    validate = InputProcessor._build_logits_processors_params_validator(frontend)  # type: ignore[arg-type]
    # Request params as the backend sends them: truncated sampling with the sampled logprob.
    validate(vllm.SamplingParams(temperature=0.7, top_p=0.9, top_k=8, logprobs=0, seed=1))


def test_cuda_v1_worker_builds_the_logits_processor(cuda_config) -> None:
    """What the V1 GPU model runner does with ``logits_processors`` (gpu_model_runner.py)."""
    from vllm.v1.sample.logits_processor import build_logitsprocs

    from dapo_megatron.generation.vllm_worker import FullVocabLogprobs

    processors = build_logitsprocs(
        cuda_config, torch.device("cpu"), False, False, cuda_config.model_config.logits_processors
    )
    assert any(isinstance(p, FullVocabLogprobs) for p in processors.argmax_invariant)


def test_cuda_v1_sampler_returns_processed_logits(monkeypatch) -> None:
    """On CUDA, V1's top-k/top-p sampler uses FlashInfer unless a processed logprobs mode is
    on; ours must take the native path, which returns the logits it sampled from."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    sampler = TopKTopPSampler(vllm_backend.LOGPROBS_MODE)
    assert sampler.forward.__func__ is TopKTopPSampler.forward_native


def test_model_runner_v2_would_refuse_the_processor() -> None:
    """Why the runner is pinned: V2's loader (the frontend's, on a GPU node by default)."""
    from vllm.v1.worker.gpu.sample.logits_processor import (
        build_custom_logits_processors_params_validator,
    )

    with pytest.raises(ValueError, match="is not a subclass of"):
        build_custom_logits_processors_params_validator([vllm_backend.LOGITS_PROCESSOR])


def test_caller_asking_for_v2_is_refused(monkeypatch) -> None:
    name = vllm_backend.RUNNER_ENVIRONMENT[0]
    monkeypatch.setenv(name, "1")
    with pytest.raises(ValueError, match="V1 model runner"):
        vllm_backend.configure_runner_environment()
    monkeypatch.setenv(name, "0")
    assert vllm_backend.configure_runner_environment() == {}


def test_qualified_names_resolve_to_the_worker_classes() -> None:
    from dapo_megatron.generation import vllm_worker

    module, _, name = vllm_backend.LOGITS_PROCESSOR.partition(":")
    assert module == vllm_worker.__name__
    assert getattr(vllm_worker, name) is vllm_worker.FullVocabLogprobs
    module, _, name = vllm_backend.WORKER_EXTENSION.rpartition(".")
    assert module == vllm_worker.__name__
    assert getattr(vllm_worker, name) is vllm_worker.WeightRefitExtension
