"""Sections of the GPU check: the machine's ceilings and our two Triton kernels at a real size.

Ceilings (``env``): a device-to-device copy of 2 GiB (bytes read plus bytes written over the
time) and an 8192^3 bf16 matrix product on random data, each the median of CUDA-event timed
repeats after warm-ups. The kernel figures are judged against these measured ceilings, not
against datasheets.

Logprob kernels (``kernels``): ``lp = log_softmax(h W^T)[t]`` for N = 16384 tokens, H = 4096,
V = 151936 (a Qwen-sized output layer at TP1), bf16, forward and backward of ``sum(c * lp)``
into h and W. Triton (``impl="triton"``) against the chunked torch path on the same inputs
(logprobs, dH, dW), and both against an IEEE fp32 reference on the first tokens (their dH rows
depend only on themselves). Time: medians of CUDA-event timed repeats, against the three
GEMMs of the problem run by cuBLAS on the same shapes (``h W^T`` forward; ``G W`` and
``G^T h`` backward with a precomputed bf16 G). The fused backward recomputes the logits, so
its GEMM work is four products against the bound's three.

PG loss (``pg_loss``): the fused Triton loss against the float64 torch path (loss, gradient,
metrics) at B = 64 rows of T = 8192 tokens, and its time against the torch path.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch

_NO_CUDA = (
    "needs CUDA: Triton has no CPU backend (tests/kernels run the kernels under TRITON_INTERPRET=1)"
)


def _median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median CUDA-event time of ``fn`` in milliseconds, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return statistics.median(times)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a64, b64 = a.double(), b.double()
    return float(((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item())


def _max_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(max |want|, 1e-12), any shape, float64 on the host."""
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    return ((g - w).abs().max() / w.abs().max().clamp_min(1e-12)).item()


def measure_ceilings() -> dict[str, float]:
    """Copy bandwidth (GB/s, read + written) and bf16 GEMM rate (TFLOP/s), measured here."""
    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), 10)
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    gemm_ms = _median_ms(lambda: a @ b, 10, warmup=3)
    return {
        "copy_gb_s": round(2 * src.numel() * 2 / (copy_ms / 1e3) / 1e9, 1),
        "bf16_gemm_tflops": round(2 * n**3 / (gemm_ms / 1e3) / 1e12, 1),
    }


def env_section() -> dict[str, Any] | str:
    """Device facts and the measured ceilings."""
    if not torch.cuda.is_available():
        return "needs CUDA: no device to measure"
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    out: dict[str, Any] = {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "memory_gib": round(total / 2**30, 1),
        "free_gib": round(free / 2**30, 1),
    }
    out.update(measure_ceilings())
    return out


def logprob_section(n: int = 16384, h: int = 4096, v: int = 151936) -> dict[str, Any] | str:
    """Triton vs chunked vs the GEMM floor at a real size (module docstring)."""
    if not torch.cuda.is_available():
        return _NO_CUDA
    from dapo_megatron.kernels import linear_logprob

    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = (torch.randn(v, h, device="cuda", generator=gen) / h**0.5).to(torch.bfloat16)
    targets = torch.randint(0, v, (n,), device="cuda", generator=gen)
    coef = torch.randn(n, device="cuda", generator=gen)

    def run(impl: str, backward: bool) -> tuple[torch.Tensor, ...]:
        hh = hidden.detach().requires_grad_(backward)
        ww = weight.detach().requires_grad_(backward)
        lp, _ = linear_logprob(hh, ww, targets, impl=impl)  # type: ignore[arg-type]
        if not backward:
            return (lp,)
        (coef * lp).sum().backward()
        assert hh.grad is not None and ww.grad is not None
        return lp, hh.grad, ww.grad

    tri = run("triton", True)
    chk = run("chunked", True)
    check = 64  # fp32 reference on the first tokens: their dH rows depend on them alone
    h32 = hidden[:check].float().requires_grad_()
    logp = torch.log_softmax(h32 @ weight.float().T, dim=-1)
    ref_lp = logp.gather(-1, targets[:check, None]).squeeze(-1)
    (coef[:check] * ref_lp).sum().backward()
    assert h32.grad is not None
    figures: dict[str, Any] = {
        "shape": {"N": n, "H": h, "V": v, "dtype": "bf16"},
        "max_abs_lp_triton_vs_chunked": (tri[0] - chk[0]).abs().max().item(),
        "rel_dH_triton_vs_chunked": _rel(tri[1], chk[1]),
        "rel_dW_triton_vs_chunked": _rel(tri[2], chk[2]),
        "max_abs_lp_triton_vs_fp32": (tri[0][:check] - ref_lp).abs().max().item(),
        "rel_dH_triton_vs_fp32": _rel(tri[1][:check], h32.grad),
        "rel_dH_chunked_vs_fp32": _rel(chk[1][:check], h32.grad),
        "lp_all_finite_nonpositive": bool(torch.isfinite(tri[0]).all() and (tri[0] <= 0).all()),
    }
    del tri, chk, logp, h32
    torch.cuda.empty_cache()
    # bf16 inputs, fp32 accumulation: the two paths differ by accumulation order only.
    assert figures["lp_all_finite_nonpositive"], figures
    assert figures["max_abs_lp_triton_vs_chunked"] < 5e-2, figures
    assert figures["rel_dH_triton_vs_chunked"] < 2e-2, figures
    assert figures["rel_dW_triton_vs_chunked"] < 2e-2, figures
    assert figures["rel_dH_triton_vs_fp32"] < 2e-2, figures

    times: dict[str, float] = {}
    for impl in ("triton", "chunked"):
        times[f"{impl}_fwd_ms"] = _median_ms(functools.partial(run, impl, False), 10)
        times[f"{impl}_fwd_bwd_ms"] = _median_ms(functools.partial(run, impl, True), 6)
        torch.cuda.empty_cache()
    times.update(_gemm_floor(hidden, weight, gen))
    flops = 2.0 * n * h * v
    times = {k: round(t, 3) for k, t in times.items()}
    figures.update(times)
    figures["triton_fwd_over_gemm"] = round(times["triton_fwd_ms"] / times["gemm_fwd_ms"], 3)
    figures["triton_fwd_bwd_over_3gemm"] = round(times["triton_fwd_bwd_ms"] / times["gemm_3_ms"], 3)
    figures["chunked_over_triton_fwd_bwd"] = round(
        times["chunked_fwd_bwd_ms"] / times["triton_fwd_bwd_ms"], 3
    )
    figures["triton_fwd_tflops"] = round(flops / (times["triton_fwd_ms"] / 1e3) / 1e12, 1)
    figures["triton_fwd_bwd_tflops_3gemm_basis"] = round(
        3 * flops / (times["triton_fwd_bwd_ms"] / 1e3) / 1e12, 1
    )
    figures["peak_mib_fwd_bwd"] = _peak_mib(lambda: run("triton", True))
    return figures


def _gemm_floor(
    hidden: torch.Tensor, weight: torch.Tensor, gen: torch.Generator
) -> dict[str, float]:
    """The problem's GEMMs through cuBLAS: ``h W^T`` alone, and with the backward's ``G W``
    and ``G^T h`` (a precomputed bf16 ``G`` of ``[N, V]``)."""
    grad_logits = torch.randn(
        hidden.shape[0], weight.shape[0], device="cuda", dtype=torch.bfloat16, generator=gen
    )
    fwd = _median_ms(lambda: hidden @ weight.T, 10)
    three = _median_ms(lambda: (hidden @ weight.T, grad_logits @ weight, grad_logits.T @ hidden), 6)
    return {"gemm_fwd_ms": fwd, "gemm_3_ms": three}


def _peak_mib(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)


def pg_loss_section(b: int = 64, t: int = 8192) -> dict[str, Any] | str:
    """The fused PG loss against the float64 torch loss, and its time (module docstring)."""
    if not torch.cuda.is_available():
        return _NO_CUDA
    from dapo_megatron.algorithms.loss import loss_denominator
    from dapo_megatron.algorithms.loss_inputs import LossInputs
    from dapo_megatron.config.run_plan import shipped_loss_spec
    from dapo_megatron.kernels.pg_loss import pg_loss, resolve_pg_loss_impl

    gen = torch.Generator(device="cuda").manual_seed(1)
    old = -torch.rand(b, t, device="cuda", generator=gen, dtype=torch.float64) * 4
    lp = old + 0.3 * torch.randn(b, t, device="cuda", generator=gen, dtype=torch.float64)
    rollout = old + 0.2 * torch.randn(b, t, device="cuda", generator=gen, dtype=torch.float64)
    adv = torch.randn(b, device="cuda", generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, t, device="cuda", generator=gen) > 0.1).double()
    # The shipped defaults with the dual clip and TIS on, so both paths are compared.
    spec = shipped_loss_spec(t, clip_ratio_c=3.0, rollout_correction="tis")
    norm = loss_denominator(mask, "token-mean")
    lp64 = lp.clone().requires_grad_()
    want = pg_loss(
        LossInputs(lp64, old, adv, mask, rollout_logprobs_BT=rollout, normalizer=norm),
        spec,
        impl="torch",
    )
    want.loss.backward()
    assert resolve_pg_loss_impl("auto", lp.float()) == "triton", "auto must pick Triton on CUDA"
    f32 = {
        k: x.float() for k, x in (("old", old), ("rollout", rollout), ("adv", adv), ("mask", mask))
    }

    def fused(impl: str) -> tuple[Any, torch.Tensor]:
        x = lp.float().requires_grad_()
        out = pg_loss(
            LossInputs(
                x,
                f32["old"],
                f32["adv"],
                f32["mask"],
                rollout_logprobs_BT=f32["rollout"],
                normalizer=norm.float(),
            ),
            spec,
            impl=impl,  # type: ignore[arg-type]
        )
        out.loss.backward()
        assert x.grad is not None
        return out, x.grad

    got, grad = fused("triton")
    assert lp64.grad is not None
    figures: dict[str, Any] = {
        "shape": {"B": b, "T": t},
        "abs_loss_err": abs(got.loss.item() - want.loss.item()),
        "max_abs_grad_err": (grad.double() - lp64.grad).abs().max().item(),
        "metric_max_rel_err": max(_max_rel(got.metrics[k], v) for k, v in want.metrics.items()),
    }
    assert figures["abs_loss_err"] < 1e-4 and _rel(grad, lp64.grad) < 1e-5, figures
    assert figures["metric_max_rel_err"] < 1e-3, figures
    figures["triton_fwd_bwd_ms"] = round(_median_ms(lambda: fused("triton"), 20), 3)
    figures["torch_fwd_bwd_ms"] = round(_median_ms(lambda: fused("torch"), 20), 3)
    figures["torch_over_triton"] = round(
        figures["torch_fwd_bwd_ms"] / figures["triton_fwd_bwd_ms"], 2
    )
    return figures
