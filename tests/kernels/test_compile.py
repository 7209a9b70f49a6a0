"""Ahead-of-time compilation of every Triton kernel for sm_90 and sm_80, without a GPU.

The interpreter tests check the numbers; this checks what only the compiler knows: that
each launch configuration the GPU path uses compiles for the target, and its registers,
spills, tensor-core instructions and shared memory (see
:mod:`dapo_megatron.kernels.compile_check`). The configurations come from the kernel modules'
``compile_specs`` (the same tile tables the launches read). The default run compiles the
production (bf16, launched tiles) configurations once per session in one child process;
the alternative tiles and fp32 are ``slow``.
"""

from __future__ import annotations

import importlib

import pytest

triton = pytest.importorskip("triton")

from dapo_megatron.kernels import compile_check as cc  # noqa: E402
from dapo_megatron.kernels import dispatch  # noqa: E402

ARCHS = (90, 80)
_missing = [a for a in ARCHS if cc.bundled_ptxas(a) is None]
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"the triton wheel has no bundled ptxas for sm_{_missing}"
)
LOGPROB = "dapo_megatron.kernels.triton_logprob_kernels"
# Bytes a production sm_80 (A100) kernel may spill: mma.sync keeps the accumulator in
# registers, so the softmax epilogue competes with it for the 255 available.
SM80_SPILL_BOUND = 64


@pytest.fixture(scope="module")
def production() -> list[cc.CompileReport]:
    return cc.compile_in_subprocess(ARCHS, extra_args=["--production-only"])


@pytest.fixture(scope="module")
def everything() -> list[cc.CompileReport]:
    return cc.compile_in_subprocess(ARCHS)


def _by_key(reports: list[cc.CompileReport]) -> dict[str, cc.CompileReport]:
    return {r.key: r for r in reports}


def test_every_production_kernel_compiles_within_limits(production: list) -> None:
    failed = {r.key: r.error for r in production if not r.ok}
    assert not failed, failed
    print("\n" + cc.format_table(production))
    for r in production:
        assert r.shared_bytes is not None and r.shared_limit is not None
        assert r.shared_bytes <= r.shared_limit, r.key
        assert r.registers is not None and 0 < r.registers <= 255, r.key


def test_production_configs_cover_every_kernel_and_target(production: list) -> None:
    # Every @triton.jit kernel launched by the modules appears, for each target.
    for name in cc.KERNEL_MODULES:
        module = importlib.import_module(name)
        kernels = {k for k in vars(module) if k.endswith("_kernel") and k.startswith("_")}
        for arch in ARCHS:
            compiled = {s.kernel for s in module.compile_specs(arch) if s.production}
            assert compiled == kernels, (name, arch, kernels - compiled)
    assert {r.arch for r in production} == set(ARCHS)


def test_no_spills_on_sm90_and_bounded_on_sm80(production: list) -> None:
    for r in production:
        if r.arch == 90:
            assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (r.key, r.registers)
        else:
            assert r.spills <= SM80_SPILL_BOUND, (r.key, r.spill_store_bytes, r.spill_load_bytes)


def test_logprob_kernels_use_tensor_cores(production: list) -> None:
    for r in production:
        if not r.label.startswith("logprob"):
            continue
        op = "HGMMA" if r.arch == 90 else "HMMA"
        assert r.sass_counts[op] > 0, (r.key, r.sass_counts)


def test_backward_has_no_atomics_or_gpu_barriers(production: list) -> None:
    # dW is written by the program that owns each tile: no atomics, hence no acq_rel fences.
    for r in production:
        if r.label.startswith("logprob"):
            assert r.sass_counts["ATOM"] == r.sass_counts["RED"] == 0, (r.key, r.sass_counts)
            assert r.sass_counts["MEMBAR_GPU"] == 0, (r.key, r.sass_counts)


def test_launch_tiles_are_the_compiled_ones() -> None:
    # compile_specs and the launches read one table: its first entry per target and dtype.
    from dapo_megatron.kernels import triton_logprob_kernels as tlp

    for arch in ARCHS:
        specs = {s.label: s for s in tlp.compile_specs(arch) if s.production}
        for kind, label in (("fwd", "logprob_fwd[lp]"), ("dz", "logprob_dz[lp]")):
            t = tlp.kernel_tiles(kind, arch, "bf16")[0]
            spec = specs[label]
            assert (spec.constexprs["BLOCK_M"], spec.constexprs["BLOCK_V"]) == (
                t.block_m,
                t.block_n,
            )
            assert (spec.num_warps, spec.num_stages) == (t.num_warps, t.num_stages)
        mm = tlp.kernel_tiles("matmul", arch, "bf16")[0]
        dw = specs["logprob_dW"]
        assert (dw.constexprs["BLOCK_M"], dw.constexprs["BLOCK_N"]) == (mm.block_m, mm.block_n)
        assert dw.constexprs["stride_am"] == 1  # the transposed dz operand, as launched


@pytest.mark.slow
def test_all_candidate_tiles_and_fp32(everything: list) -> None:
    failed = {r.key: r.error for r in everything if not r.ok}
    assert not failed, failed
    print("\n" + cc.format_table(everything))
    for r in everything:
        assert r.shared_bytes is not None and r.shared_limit is not None
        assert r.shared_bytes <= r.shared_limit, r.key
    # fp32 goes to the Triton kernels under impl="auto" exactly where it does not spill.
    for arch in ARCHS:
        fp32 = [r for r in everything if r.arch == arch and r.dtype == "fp32"]
        assert fp32
        spill_free = all(r.spills == 0 for r in fp32 if r.label.startswith("logprob"))
        assert spill_free == (arch // 10 in dispatch.FP32_TRITON_ARCHS), arch


def test_fp32_dispatch_follows_the_compiled_table() -> None:
    for major in (8, 9):
        want = major in dispatch.FP32_TRITON_ARCHS
        assert dispatch.triton_takes_dtype(dispatch.torch.float32, major) == want
        assert dispatch.triton_takes_dtype(dispatch.torch.bfloat16, major)
