"""The decoder's layer spec on a (faked) CUDA machine: a Transformer Engine that does not
import is an error unless ``policy.allow_local_spec`` opts in, and both specs get QK-norm
and MoE arguments from the same TransformerConfig fields (DESIGN section 8: the CPU twin
runs the local spec only, so CI checks the GPU decision with the CUDA facts patched in).

Megatron is imported in one spawned rank (launch.run_distributed), not in pytest's process.
"""

from __future__ import annotations

from typing import Any

import pytest
from launch import run_distributed

pytestmark = pytest.mark.distributed

# Imports that fail as on a machine without the gpu extra (None in sys.modules: "halted").
TE_ABSENT = dict.fromkeys(
    (
        "transformer_engine",
        "transformer_engine.pytorch",
        "megatron.core.extensions.transformer_engine",
        "megatron.core.extensions.transformer_engine_spec_provider",
    )
)


def _spec_checks() -> dict[str, Any]:
    import dataclasses
    import sys
    import warnings
    from unittest import mock

    import torch

    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.megatron import model as m
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel

    dims = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)
    initialize_parallel(dims, seed=0)
    out: dict[str, Any] = {}
    try:
        config = m.transformer_config(PRESETS["tiny-qwen2"], dims, "fp32")
        out["cpu_spec"] = type(m.layer_spec(config)).__name__  # no TE check on CPU
        cuda = mock.patch.object(torch.cuda, "is_available", return_value=True)
        with cuda, mock.patch.dict(sys.modules, TE_ABSENT):
            try:
                m.layer_spec(config)
                out["error"] = None
            except m.TransformerEngineUnavailable as error:
                out["error"] = str(error)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out["opt_in_spec"] = type(m.layer_spec(config, allow_local_spec=True)).__name__
            out["opt_in_warning"] = str(caught[-1].message) if caught else None

        # An architecture with QK-norm (Qwen3): both builders receive it from the config.
        qk = dataclasses.replace(config, qk_layernorm=True)
        received: dict[str, dict[str, Any]] = {}
        local = m.get_gpt_layer_local_spec

        def record_local(**kwargs: Any) -> Any:
            received["local"] = kwargs
            return local(**kwargs)

        def record_te(**kwargs: Any) -> str:
            received["te"] = kwargs
            return "te spec"

        with mock.patch.object(m, "get_gpt_layer_local_spec", side_effect=record_local):
            block = m.layer_spec(qk)
        attention = block.layer_specs[0].submodules.self_attention.submodules
        out["local_qk_norms"] = (attention.q_layernorm.__name__, attention.k_layernorm.__name__)
        with (
            cuda,
            mock.patch.object(m, "transformer_engine_error", return_value=None),
            mock.patch.object(
                m, "get_gpt_layer_with_transformer_engine_spec", side_effect=record_te
            ),
        ):
            out["te_spec"] = m.layer_spec(qk)
        out["received"] = received
    finally:
        destroy_parallel()
    return out


@pytest.fixture(scope="module")
def checks() -> dict[str, Any]:
    return run_distributed(_spec_checks, 1)[0]


def test_cpu_builds_the_local_spec(checks) -> None:
    assert checks["cpu_spec"] == "TransformerBlockSubmodules"


def test_missing_transformer_engine_on_cuda_is_an_error_naming_the_fix(checks) -> None:
    error = checks["error"]
    assert error is not None, "a missing TE on CUDA fell back to the local spec silently"
    assert "transformer_engine" in error and "ModuleNotFoundError" in error
    assert "gpu extra" in error and "policy.allow_local_spec=true" in error


def test_opt_in_builds_the_local_spec_with_a_warning(checks) -> None:
    assert checks["opt_in_spec"] == "TransformerBlockSubmodules"
    assert "policy.allow_local_spec=true" in checks["opt_in_warning"]


def test_both_specs_take_qk_norm_and_moe_from_the_config(checks) -> None:
    expected = {"num_experts": None, "moe_grouped_gemm": False, "qk_layernorm": True}
    assert checks["te_spec"] == "te spec"
    assert checks["received"]["te"] == expected
    local = checks["received"]["local"]
    assert {k: local[k] for k in expected} == expected and local["normalization"] == "RMSNorm"
    # The local QK-norms accept sequence parallelism (Megatron's torch norm refuses it).
    assert checks["local_qk_norms"] == ("_RMSNorm", "_RMSNorm")
