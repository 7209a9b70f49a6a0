"""Token logprobs from hidden states, forward and forward+backward: our kernels vs peers vs GEMMs.

Every provider computes ``lp = log_softmax(h W^T)[target]`` for ``N`` tokens (hidden ``H``,
vocabulary ``V``), then backpropagates ``sum(c * lp)`` with random ``c`` into ``h`` and ``W``.
All providers run in the same invocation on identical seeded inputs:

  naive     ``(h @ W^T).float()``, ``log_softmax``, ``gather`` (fp32 logits materialised)
  chunked   ``linear_logprob(impl="chunked")``: our chunked torch path (recompute backward)
  triton    ``linear_logprob(impl="triton")``: our fused Triton kernels (CUDA only)
  liger     Liger Kernel's fused linear cross entropy, ``reduction="none"``, ``lp = -loss``
            (only if ``liger_kernel`` imports; it computes its gradients during the forward)
  cce       Apple's Cut Cross-Entropy ``linear_cross_entropy(reduction="none")``, ``lp = -loss``
            (only if ``cut_cross_entropy`` imports; default settings, i.e. gradient filtering)
  gemm      the floor: the three GEMMs of the problem without any softmax work, i.e. the
            forward ``h W^T`` and the backward ``G W`` (dH) and ``G^T h`` (dW) with a
            precomputed ``[N, V]`` G (cuBLAS on a GPU, the CPU BLAS on CPU); its memory
            figure counts its own ``[N, V]`` buffers (G, and logits on CPU), so it is a time
            floor, not a memory floor

Providers that are not installed, not supported on the device, run out of memory or exceed
the time budget are skipped, and the reason is written to the JSON. A peer whose
``reduction="none"`` backward rejects per-token upstream gradients is timed with unit weights
instead, recorded under ``backward_weights`` (its dH error is then against a unit-weight
reference; a peer that silently mishandles the weights shows up in ``max_abs_err_dH``).

Metrics per (shape, provider):
  * ``peak_extra_mib``: memory of one forward+backward beyond the inputs (activations,
    logits, temporaries, and the gradients dH/dW, which every provider produces).
  * ``fwd_ms`` / ``fwd_bwd_ms``: median time; ratios to naive, to every peer, and to the
    gemm provider's time for the same GEMMs (1 GEMM forward, 3 forward+backward).
  * ``tflops_fwd`` / ``tflops_fwd_bwd``: on the 2NHV / 6NHV basis (the GEMM work only, so
    providers that recompute logits in backward are not credited for it).
  * ``max_abs_err_lp`` / ``max_abs_err_dH``: against a reference computed on the first
    ``--check-tokens`` tokens (float64 on CPU, IEEE fp32 on GPU; the rows of dH of those
    tokens depend only on those tokens, so the reference is exact for them).

Method, GPU (``--device cuda``): one FRESH subprocess per shape (a crash or a poisoned CUDA
context costs one shape, not the run), providers in sequence inside it. Per provider: one
warm-up forward+backward (Triton compilation, cuBLAS heuristics), then one forward+backward
between ``torch.cuda.reset_peak_memory_stats()`` and ``torch.cuda.max_memory_allocated()``
(peak minus the memory allocated before it), then ``--repeats`` (>= 10) forwards and
``--repeats`` forward+backwards, each timed with a pair of CUDA events; the median is
reported. Inputs are bf16. A global ``--budget-s`` (default 420 s) skips what no longer fits,
so the run finishes unattended in under 8 minutes.

Method, CPU (``--device cpu``, the default without CUDA): one FRESH subprocess per
(shape, provider), as in bench/logprob_memory.py: the child resets the kernel's peak-RSS
counter (/proc/self/clear_refs), records RSS after creating the inputs, runs everything, and
reports ``ru_maxrss`` minus that baseline. Times are ``time.perf_counter`` medians. fp32.

Bound and model (``--model-only`` prints them for the issue-17 shapes on H100/H200/A100 peaks
and writes bench/results/kernels_model.json; a GPU run prints them under each shape and puts
``fwd_over_bound`` / ``fwd_bwd_over_3gemm_bound`` next to each measured time):
  bound     the three GEMMs of the problem (logits ``h W^T``, ``dH = G W``, ``dW = G^T h``),
            each ``max(2NHV / peak FLOP/s, compulsory bytes / peak bandwidth)``; the forward's
            bound is the logits GEMM alone. A backward that does not store the ``[N, V]``
            logits recomputes them, so its work is exactly these three GEMMs.
  model     our kernels as launched (tiles, splits and vocab chunks of triton_logprob):
            tensor-core FLOPs plus the softmax epilogue on the CUDA cores (not overlapped),
            against modelled DRAM traffic (GROUP_M raster: each operand panel fetched once
            per band of the first wave; the dz chunk written once and read by both GEMMs;
            the fp32 dH accumulator read and written once per chunk), per launch.
  ratios    ``bwd_modelled_over_bound`` = model backward / the three GEMMs;
            ``fwd_modelled_over_bound`` = model forward / the logits GEMM.

Usage:
  python bench/kernels.py --model-only        # no measurement: bench/results/kernels_model.json
  python bench/kernels.py                     # CPU, CI-sized, bench/results/kernels_cpu.json
  python bench/kernels.py --device cuda --out bench/results/kernels_h100.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from logprob_memory import _reset_peak_rss  # noqa: E402  (same peak-RSS method)

MIB = 2**20
PROVIDERS = ("naive", "chunked", "triton", "liger", "cce", "gemm")
PEERS = ("liger", "cce")

# (label, N, H, V). GPU: Qwen2.5-7B output layer; Llama-3-70B output layer shard at TP8.
GPU_SHAPES = [
    ("qwen2.5-7b", 4096, 3584, 152064),
    ("qwen2.5-7b", 16384, 3584, 152064),
    ("llama3-70b-tp8", 16384, 8192, 128256 // 8),
    ("qwen2.5-7b", 65536, 3584, 152064),
    ("llama3-70b-tp8", 65536, 8192, 128256 // 8),
]
# CPU: at N=2048 the fp32 logits (256 MiB) fit in ONE default chunk of the chunked path, so
# its memory saving only shows at N=8192 (4 chunks).
CPU_SHAPES = [("ci-small", 2048, 256, 32768), ("ci", 8192, 256, 32768)]


# ---------------------------------------------------------------------------------------
# Providers


def _naive(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    logits = (h @ w.T).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, t[:, None]).squeeze(-1)


def _provider(name: str, device: torch.device) -> Callable | str:
    """The provider's ``lp = f(h, w, targets)``, or why it cannot run here."""
    if name == "naive":
        return _naive
    if name in ("chunked", "triton"):
        from dapo_megatron.kernels import linear_logprob
        from dapo_megatron.kernels.dispatch import triton_available

        if name == "triton":
            if device.type != "cuda":
                return "CUDA only (the Triton interpreter is a test tool, not a benchmark)"
            if not triton_available():
                return "triton does not import"

        def ours(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return linear_logprob(h, w, t, impl=name)[0]

        return ours
    if name in PEERS:
        if device.type != "cuda":
            return "CUDA only (Triton kernels)"
        try:
            if name == "liger":
                from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

                liger_loss = LigerFusedLinearCrossEntropyLoss(reduction="none")
                return lambda h, w, t: -liger_loss(w, h, t)
            from cut_cross_entropy import linear_cross_entropy

            return lambda h, w, t: -linear_cross_entropy(h, w, t, reduction="none")
        except Exception as exc:  # ImportError, or a broken install
            pkg = "liger_kernel" if name == "liger" else "cut_cross_entropy"
            return f"{pkg} not importable: {type(exc).__name__}: {exc}"
    if name == "gemm":
        return "gemm"  # handled separately: no autograd, three plain matmuls
    raise ValueError(name)


# ---------------------------------------------------------------------------------------
# Analytic bound and traffic model (no GPU needed; printed next to measured times)


@dataclass(frozen=True)
class DevicePeak:
    """Datasheet peaks of one GPU (dense, no sparsity)."""

    name: str
    tc_flops: float
    """bf16 tensor-core FLOP/s."""
    cuda_flops: float
    """fp32 FMA-pipe FLOP/s (the softmax epilogue runs there; exp counted as 8 ops)."""
    dram_bw: float
    """HBM bytes/s."""
    sms: int


DEVICES = {
    "H100-SXM": DevicePeak("H100-SXM", 989e12, 67e12, 3.35e12, 132),
    "H200": DevicePeak("H200", 989e12, 67e12, 4.8e12, 132),
    "A100-SXM-80GB": DevicePeak("A100-SXM-80GB", 312e12, 19.5e12, 2.04e12, 108),
}
# FMA-equivalent CUDA-core operations per logit in the epilogues (exp = 8: the MUFU pipe
# issues at 1/8 of the FMA rate on sm_80/sm_90): forward (scale, mask, max, shift, exp,
# sums, entropy term, target compare) and dz (shift, exp, coefficient, target, cast).
FWD_OPS_PER_LOGIT = 17
DZ_OPS_PER_LOGIT = 16
MODEL_SHAPES = [
    ("tp1", 16384, 4096, 152064),
    ("tp4", 16384, 4096, 152064 // 4),
    ("tp8-70b", 16384, 8192, 128256 // 8),
    ("tp1-short", 4096, 4096, 152064),
]


def _roofline(tc_flops: float, ops: float, dram: float, dev: DevicePeak) -> float:
    """Seconds: tensor-core and CUDA-core work in sequence (not overlapped: conservative),
    against DRAM traffic (overlapped)."""
    return max(tc_flops / dev.tc_flops + ops / dev.cuda_flops, dram / dev.dram_bw)


def _gemm_traffic(m: int, n: int, k: int, bm: int, bn: int, group_m: int, dev: DevicePeak,
                  a_bytes: int, b_bytes: int) -> float:  # fmt: skip
    """DRAM bytes of a tiled ``[m, k] @ [k, n]`` GEMM's operand loads with a GROUP_M raster:
    one wave (one program per SM) is a ``group_m x sms/group_m`` band of tiles; each A row
    panel is fetched once per band of columns, each B column panel once per band of rows
    (the wave's panels are assumed to stay in L2 while it steps through K together)."""
    grid_m, grid_n = -(-m // bm), -(-n // bn)
    rows = min(group_m, grid_m)
    cols = max(1, dev.sms // rows)
    return m * k * a_bytes * -(-grid_n // cols) + k * n * b_bytes * -(-grid_m // rows)


def gemm_bound(n: int, h: int, v: int, dev: DevicePeak, elem: int = 2) -> dict:
    """The three GEMMs of the problem (``h W^T``, ``G W``, ``G^T h``), each at the device's
    peak with compulsory traffic only (operands read once, output written once)."""
    flops = 2.0 * n * h * v
    shapes = {"logits": (n, v, h), "dH": (n, h, v), "dW": (v, h, n)}
    out = {}
    for name, (m, nn, k) in shapes.items():
        dram = (m * k + k * nn + m * nn) * elem
        out[name] = {"flops": flops, "bytes": dram, "s": _roofline(flops, 0, dram, dev)}
    out["fwd_s"] = out["logits"]["s"]
    out["bwd_s"] = out["logits"]["s"] + out["dH"]["s"] + out["dW"]["s"]
    return out


def model_triton(n: int, h: int, v: int, dev: DevicePeak, elem: int = 2) -> dict:
    """Modelled time and DRAM traffic of our kernels (tiles and chunking as launched on sm_90,
    or sm_80 for an A100): forward, and the backward's three phases per vocab chunk."""
    from dapo_megatron.kernels import triton_logprob_kernels as tlp

    arch = 80 if dev.name.startswith("A100") else 90
    ft, lt = tlp.kernel_tiles("fwd", arch, "bf16")[0], tlp.kernel_tiles("dz", arch, "bf16")[0]
    mt = tlp.kernel_tiles("matmul", arch, "bf16")[0]
    grid_m, grid_v = -(-n // ft.block_m), -(-v // ft.block_n)
    splits = tlp.forward_splits(dev.sms, grid_m, grid_v, ft.group_m, True)
    rows = min(ft.group_m, grid_m)
    # Forward: a band of `rows` token blocks streams S vocab ranges; the band's hidden rows
    # stay in L2, the weight is fetched once per band.
    fwd_dram = n * h * elem + v * h * elem * -(-grid_m // rows) + 16 * splits * n
    fwd = {
        "flops": 2.0 * n * h * v,
        "bytes": fwd_dram,
        "s": _roofline(2.0 * n * h * v, FWD_OPS_PER_LOGIT * n * v, fwd_dram, dev),
        "splits": splits,
    }
    chunk = tlp.dz_chunk_columns(n, v, elem, tlp.CHUNK_MULTIPLE)
    phases = {"dz": [0.0, 0.0, 0.0], "dW": [0.0, 0.0, 0.0], "dH": [0.0, 0.0, 0.0]}
    for c0 in range(0, v, chunk):
        c = min(chunk, v - c0)
        p = phases["dz"]  # recompute the logits, write dz in bf16
        dram = _gemm_traffic(n, c, h, lt.block_m, lt.block_n, lt.group_m, dev, elem, elem)
        p[0] += 2.0 * n * c * h
        p[1] += DZ_OPS_PER_LOGIT * n * c
        p[2] += dram + n * c * elem + 12 * n
        p = phases["dW"]  # dW[chunk] = dz^T h, written once in bf16
        dram = _gemm_traffic(c, h, n, mt.block_m, mt.block_n, mt.group_m, dev, elem, elem)
        p[0] += 2.0 * n * c * h
        p[2] += dram + c * h * elem
        p = phases["dH"]  # dH (fp32) += dz W[chunk]: read and write the fp32 accumulator
        dram = _gemm_traffic(n, h, c, mt.block_m, mt.block_n, mt.group_m, dev, elem, elem)
        p[0] += 2.0 * n * c * h
        p[2] += dram + 2 * n * h * 4
    # Zeroing dH, and its conversion to bf16 (read fp32, write bf16): elementwise passes.
    extra_dram = n * h * 4 + n * h * (4 + elem)
    bwd_s = sum(_roofline(f, o, d, dev) for f, o, d in phases.values()) + extra_dram / dev.dram_bw
    bwd = {
        "flops": sum(p[0] for p in phases.values()),
        "bytes": sum(p[2] for p in phases.values()) + extra_dram,
        "s": bwd_s,
        "chunks": -(-v // chunk),
        "chunk_columns": chunk,
        "phases": {k: {"flops": p[0], "bytes": p[2]} for k, p in phases.items()},
    }
    return {"fwd": fwd, "bwd": bwd}


def model_before(n: int, h: int, v: int, dev: DevicePeak, elem: int = 2) -> dict:
    """The backward as it was before issue 17 (one fused kernel, 64 x 128 tiles): per tile a
    read and write of the fp32 dH rows, and an fp32 atomic add of the dW tile."""
    bm, bv = 64, 128
    grid_m, grid_v = -(-n // bm), -(-v // bv)
    dh_round_trips = 2 * n * h * 4 * grid_v
    dw_atomics = v * h * 4 * grid_m
    dram = dh_round_trips + dw_atomics + (n * h + v * h) * elem
    flops = 6.0 * n * h * v
    return {"s": _roofline(flops, DZ_OPS_PER_LOGIT * n * v, dram, dev), "bytes": dram,
            "dh_round_trip_bytes": dh_round_trips, "dw_atomic_bytes": dw_atomics}  # fmt: skip


def model_record(shapes: list[tuple] = MODEL_SHAPES) -> dict:
    """bench/results/kernels_model.json: per device and shape, bound, model and ratios."""
    record: dict = {
        "benchmark": "kernels_model",
        "what": "analytic, no measurement: bound = the three GEMMs (logits, dH, dW) at "
        "datasheet peak with compulsory traffic; model = our kernels' FLOPs (tensor cores) + "
        "epilogue ops (CUDA cores, not overlapped) vs modelled DRAM traffic, per launch; "
        "*_modelled_over_bound = model time / bound time (bwd vs the 3 GEMMs, fwd vs the "
        "logits GEMM, fwd_bwd vs the 3 GEMMs)",
        "devices": {},
    }
    for dev in DEVICES.values():
        rows = {}
        for label, n, h, v in shapes:
            bound = gemm_bound(n, h, v, dev)
            ours = model_triton(n, h, v, dev)
            before = model_before(n, h, v, dev)
            rows[f"{label} N={n} H={h} V={v}"] = {
                "N": n, "H": h, "V_local": v,
                "bound_fwd_ms": 1e3 * bound["fwd_s"],
                "bound_bwd_ms": 1e3 * bound["bwd_s"],
                "model_fwd_ms": 1e3 * ours["fwd"]["s"],
                "model_bwd_ms": 1e3 * ours["bwd"]["s"],
                "model_fwd_gb": ours["fwd"]["bytes"] / 1e9,
                "model_bwd_gb": ours["bwd"]["bytes"] / 1e9,
                "bwd_chunks": ours["bwd"]["chunks"],
                "fwd_splits": ours["fwd"]["splits"],
                "fwd_modelled_over_bound": ours["fwd"]["s"] / bound["fwd_s"],
                "bwd_modelled_over_bound": ours["bwd"]["s"] / bound["bwd_s"],
                "fwd_bwd_modelled_over_bound": (ours["fwd"]["s"] + ours["bwd"]["s"]) / bound["bwd_s"],
                "before_bwd_gb": before["bytes"] / 1e9,
                "before_bwd_modelled_over_bound": before["s"] / bound["bwd_s"],
            }  # fmt: skip
        record["devices"][dev.name] = rows
    return record


def _print_model(record: dict) -> None:
    print(
        f"{'device':<15}{'shape':<36}{'bound fwd':>10}{'model fwd':>10}{'fwd/bnd':>8}"
        f"{'bound bwd':>10}{'model bwd':>10}{'bwd GB':>8}{'bwd/bnd':>8}{'before':>8}"
    )
    for dev, rows in record["devices"].items():
        for shape, r in rows.items():
            print(
                f"{dev:<15}{shape:<36}{r['bound_fwd_ms']:>10.2f}{r['model_fwd_ms']:>10.2f}"
                f"{r['fwd_modelled_over_bound']:>8.3f}{r['bound_bwd_ms']:>10.2f}"
                f"{r['model_bwd_ms']:>10.2f}{r['model_bwd_gb']:>8.1f}"
                f"{r['bwd_modelled_over_bound']:>8.3f}{r['before_bwd_modelled_over_bound']:>8.2f}"
            )


def _device_peak(name: str | None) -> DevicePeak:
    """The DEVICES entry for a torch device name (H100 when unknown)."""
    name = (name or "").upper()
    if "A100" in name:
        return DEVICES["A100-SXM-80GB"]
    if "H200" in name:
        return DEVICES["H200"]
    return DEVICES["H100-SXM"]


# ---------------------------------------------------------------------------------------
# Measurement (runs in the child process)


def _inputs(n: int, h: int, v: int, dtype: torch.dtype, device: torch.device) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(n, h, generator=gen, device=device, dtype=torch.float32)
    # Logits with a standard deviation of ~3: peaked enough to be realistic.
    weight = torch.randn(v, h, generator=gen, device=device, dtype=torch.float32) * (3.0 / h**0.5)
    return dict(
        hidden=hidden.to(dtype).requires_grad_(),
        weight=weight.to(dtype).requires_grad_(),
        targets=torch.randint(0, v, (n,), generator=gen, device=device),
        coef=torch.randn(n, generator=gen, device=device, dtype=torch.float32),
    )


def _reference(inp: dict, check: int, coef: torch.Tensor) -> dict:
    """lp and dH (of ``sum(coef * lp)``) of the first ``check`` tokens, float64 on CPU, IEEE
    fp32 on GPU."""
    device = inp["hidden"].device
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False
    h = inp["hidden"][:check].detach().to(dtype).requires_grad_()
    w = inp["weight"].detach().to(dtype)
    lp = _naive(h, w, inp["targets"][:check]).to(dtype)
    (coef[:check].to(dtype) * lp).sum().backward()
    ref = {"lp": lp.detach(), "dH": h.grad, "dtype": str(dtype)}
    del w
    return ref


class _Clock:
    """Wall time on CPU, CUDA events on GPU; returns seconds per call of ``fn``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object], repeats: int) -> list[float]:
        times = []
        for _ in range(repeats):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return times


def _gemm_steps(inp: dict) -> tuple[Callable, Callable]:
    """Forward GEMM, and forward + the two backward GEMMs (dH, dW), on plain tensors."""
    h, w = inp["hidden"].detach(), inp["weight"].detach()
    grad_NV = torch.randn(h.shape[0], w.shape[0], device=h.device, dtype=h.dtype)

    def fwd() -> None:
        torch.matmul(h, w.T)

    def fwd_bwd() -> None:
        torch.matmul(h, w.T)
        torch.matmul(grad_NV, w)
        torch.matmul(grad_NV.T, h)

    return fwd, fwd_bwd


def _measure(name: str, inp: dict, check: int, repeats: int, deadline: float) -> dict:
    """One provider on one shape (see the module docstring for the method).

    Returns the metrics, plus under ``"_check"`` the provider's lp and dH of the first
    ``check`` tokens (compared with the reference once every provider has run: computing
    the reference first would leave its freed pages in the RSS baseline of the CPU method).
    """
    device = inp["hidden"].device
    cuda = device.type == "cuda"
    fn = _provider(name, device)
    if isinstance(fn, str) and fn != "gemm":
        return {"skipped": fn}
    h, w, t, c = inp["hidden"], inp["weight"], inp["targets"], inp["coef"]
    out: dict = {}

    if fn == "gemm":
        fwd, fwd_bwd = _gemm_steps(inp)
    else:

        def fwd() -> torch.Tensor:
            return fn(h, w, t)

        def fwd_bwd() -> torch.Tensor:
            h.grad = w.grad = None
            lp = fn(h, w, t)
            (c * lp.float()).sum().backward()
            return lp

    clock = _Clock(device)
    try:
        clock(fwd_bwd, 1)  # compilation, autotuning, allocator warm-up
    except (RuntimeError, AssertionError) as exc:
        if name not in PEERS or isinstance(exc, torch.OutOfMemoryError):
            raise
        # A peer whose reduction="none" backward rejects per-token upstream gradients: time
        # it with unit weights (what it supports) and say so; dH is checked against that.
        c = torch.ones_like(c)
        out["backward_weights"] = f"uniform (per-token weights failed: {str(exc)[:200]})"
        clock(fwd_bwd, 1)
    # Timed again, without compilation, to estimate what the repeats will cost.
    warm = clock(fwd_bwd, 1)[0]
    # Each timed call: `repeats` forwards + `repeats` forward+backwards, ~ 1.3 x warm-up.
    if time.monotonic() + 1.5 * repeats * warm > deadline:
        return {"skipped": f"time budget (one forward+backward took {warm:.2f} s)"}

    gc.collect()
    if cuda:
        h.grad = w.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        out["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - base) / MIB
    out["fwd_s_all"] = clock(fwd, repeats)
    out["fwd_bwd_s_all"] = clock(fwd_bwd, repeats)
    if not cuda:  # the parent process reads the peak RSS after this returns
        out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["fwd_ms"] = 1e3 * statistics.median(out["fwd_s_all"])
    out["fwd_bwd_ms"] = 1e3 * statistics.median(out["fwd_bwd_s_all"])

    if fn != "gemm":
        lp = fwd_bwd()
        out["_check"] = {
            "lp": lp[:check].detach().clone(),
            "dH": h.grad[:check].clone(),
            "uniform": "backward_weights" in out,
        }
        h.grad = w.grad = None
    return out


def run_child(args: argparse.Namespace) -> None:
    """Measure ``args.providers`` on one shape in this fresh process; JSON to ``args.result``."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n, h, v = (int(x) for x in args.shape.split(","))
    inp = _inputs(n, h, v, dtype, device)
    check = min(n, args.check_tokens)
    results: dict = {}
    checks: dict[str, dict] = {}
    hwm_reset = _reset_peak_rss()
    baseline = psutil.Process().memory_info().rss
    for name in args.providers.split(","):
        try:
            res = _measure(name, inp, check, args.repeats, args.deadline)
        except torch.OutOfMemoryError as exc:
            res = {"skipped": f"out of memory: {str(exc).splitlines()[0]}"}
        except Exception as exc:  # a peer's bug must not cost the other providers
            res = {"skipped": f"error: {type(exc).__name__}: {str(exc)[:300]}"}
        if "peak_rss" in res:
            res["peak_extra_mib"] = (res.pop("peak_rss") - baseline) / MIB
            res["hwm_reset"] = hwm_reset
        if "_check" in res:
            checks[name] = res.pop("_check")
        results[name] = res
        inp["hidden"].grad = inp["weight"].grad = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        # Written after every provider, so a later crash or timeout keeps what was measured.
        Path(args.result).write_text(json.dumps(results))
    refs: dict[bool, dict] = {}
    for name, got in checks.items():
        uniform = got["uniform"]
        if uniform not in refs:
            coef = torch.ones_like(inp["coef"]) if uniform else inp["coef"]
            refs[uniform] = _reference(inp, check, coef)
            results["reference_dtype"] = refs[uniform]["dtype"]
        for key in ("lp", "dH"):
            err = (got[key].double() - refs[uniform][key].double()).abs().max().item()
            results[name][f"max_abs_err_{key}"] = err
    if checks:
        Path(args.result).write_text(json.dumps(results))


# ---------------------------------------------------------------------------------------
# Parent: spawn children, derive ratios, print, write JSON


def _spawn(args: argparse.Namespace, shape: tuple, providers: list[str], result: str) -> dict:
    _, n, h, v = shape
    remaining = args.deadline - time.monotonic()
    cmd = [
        sys.executable, __file__, "--child", "--device", args.device,
        "--shape", f"{n},{h},{v}", "--providers", ",".join(providers),
        "--repeats", str(args.repeats), "--check-tokens", str(args.check_tokens),
        "--deadline-in", str(remaining), "--result", result,
    ]  # fmt: skip
    note = None
    try:
        # Grace beyond the child's own deadline for start-up and the last provider.
        proc = subprocess.run(cmd, timeout=max(30.0, remaining + 60.0), capture_output=True)
        if proc.returncode != 0:
            note = f"child exited {proc.returncode}: {proc.stderr.decode()[-500:]}"
    except subprocess.TimeoutExpired:
        note = "child timed out"
    results = json.loads(Path(result).read_text()) if Path(result).exists() else {}
    for p in providers:
        if p not in results:
            results[p] = {"skipped": note or "not run"}
    return results


def _derive(shape: tuple, results: dict) -> None:
    """Add ratios and TFLOP/s to each measured provider, in place."""
    _, n, h, v = shape
    flops = {"fwd": 2 * n * h * v, "fwd_bwd": 6 * n * h * v}
    measured = {p: r for p, r in results.items() if isinstance(r, dict) and "fwd_ms" in r}
    for p, r in measured.items():
        for phase in ("fwd", "fwd_bwd"):
            r[f"tflops_{phase}"] = flops[phase] / (r[f"{phase}_ms"] / 1e3) / 1e12
            ratios = {}
            for other in ("naive", "gemm", *PEERS):
                if other in measured and other != p:
                    ratios[other] = r[f"{phase}_ms"] / measured[other][f"{phase}_ms"]
            r[f"{phase}_time_ratio_to"] = ratios
        naive_mem = measured.get("naive", {}).get("peak_extra_mib")
        if naive_mem and r.get("peak_extra_mib") is not None:
            r["peak_extra_mem_ratio_to_naive"] = r["peak_extra_mib"] / naive_mem


def _fmt(x: float | None, spec: str) -> str:
    """``format(x, spec)``, or a right-aligned "-" of the same width for a missing value."""
    return "-".rjust(int(spec.split(".")[0])) if x is None else format(x, spec)


def _add_bound(shape: tuple, results: dict, peak: DevicePeak) -> None:
    """Attach the analytic bound and our kernels' model to a measured shape, in place."""
    _, n, h, v = shape
    bound, ours = gemm_bound(n, h, v, peak), model_triton(n, h, v, peak)
    results["model"] = {
        "device_peak": peak.name,
        "bound_fwd_ms": 1e3 * bound["fwd_s"],
        "bound_3gemm_ms": 1e3 * bound["bwd_s"],
        "model_triton_fwd_ms": 1e3 * ours["fwd"]["s"],
        "model_triton_bwd_ms": 1e3 * ours["bwd"]["s"],
        "model_triton_fwd_gb": ours["fwd"]["bytes"] / 1e9,
        "model_triton_bwd_gb": ours["bwd"]["bytes"] / 1e9,
    }
    for p in PROVIDERS:
        r = results.get(p, {})
        if "fwd_ms" in r:
            r["fwd_over_bound"] = r["fwd_ms"] / results["model"]["bound_fwd_ms"]
            r["fwd_bwd_over_3gemm_bound"] = r["fwd_bwd_ms"] / results["model"]["bound_3gemm_ms"]


def _print_table(device: str, shapes: list[tuple], all_results: list[dict]) -> None:
    header = (
        f"{'shape':<34}{'provider':<9}{'peak MiB':>10}{'mem/naive':>10}{'fwd ms':>10}"
        f"{'fwd/naive':>10}{'fb ms':>10}{'fb/naive':>9}{'fb/gemm':>9}{'fb TF/s':>9}"
        f"{'err lp':>9}{'err dH':>9}{'fwd/bnd':>9}{'fb/3gemm':>9}"
    )
    print(f"device={device}  (fb = forward+backward; TF/s on the 6NHV basis)")
    print(header)
    for shape, results in zip(shapes, all_results, strict=True):
        label, n, h, v = shape
        name = f"{label} N={n} H={h} V={v}"
        for p in PROVIDERS:
            r = results[p]
            if "skipped" in r:
                print(f"{name:<34}{p:<9}  skipped: {r['skipped'][:70]}")
                continue
            fb_ratio = r["fwd_bwd_time_ratio_to"]
            print(
                f"{name:<34}{p:<9}{_fmt(r.get('peak_extra_mib'), '10.1f')}"
                f"{_fmt(r.get('peak_extra_mem_ratio_to_naive'), '10.3f')}"
                f"{r['fwd_ms']:>10.1f}{_fmt(r['fwd_time_ratio_to'].get('naive'), '10.3f')}"
                f"{r['fwd_bwd_ms']:>10.1f}{_fmt(fb_ratio.get('naive'), '9.3f')}"
                f"{_fmt(fb_ratio.get('gemm'), '9.2f')}{r['tflops_fwd_bwd']:>9.3f}"
                f"{_fmt(r.get('max_abs_err_lp'), '9.1e')}{_fmt(r.get('max_abs_err_dH'), '9.1e')}"
                f"{_fmt(r.get('fwd_over_bound'), '9.2f')}{_fmt(r.get('fwd_bwd_over_3gemm_bound'), '9.2f')}"
            )
        m = results.get("model")
        if m:
            print(
                f"{name:<34}bound ({m['device_peak']} peak): fwd {m['bound_fwd_ms']:.2f} ms, "
                f"3 GEMMs {m['bound_3gemm_ms']:.2f} ms; triton model: fwd "
                f"{m['model_triton_fwd_ms']:.2f} ms / {m['model_triton_fwd_gb']:.1f} GB, bwd "
                f"{m['model_triton_bwd_ms']:.2f} ms / {m['model_triton_bwd_gb']:.1f} GB"
            )


def _versions() -> dict:
    out = {"torch": torch.__version__, "python": platform.python_version()}
    for pkg in ("triton", "liger_kernel", "cut_cross_entropy"):
        try:
            from importlib.metadata import version

            out[pkg] = version(pkg.replace("_", "-"))
        except Exception:
            out[pkg] = None
    return out


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if cuda else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="default results/kernels_<dev>")
    parser.add_argument("--repeats", type=int, default=None, help="default 10 (GPU), 5 (CPU)")
    parser.add_argument("--check-tokens", type=int, default=256)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--shapes", default=None, help="override: 'N,H,V;N,H,V' (label 'custom')")
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument(
        "--model-only", action="store_true",
        help="print the analytic bound and traffic model; write results/kernels_model.json",
    )  # fmt: skip
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--deadline-in", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 10 if args.device == "cuda" else 5
    if args.model_only:
        record = model_record()
        _print_model(record)
        out = args.out or Path(__file__).parent / "results" / "kernels_model.json"
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {out}")
        return
    if args.child:
        args.deadline = time.monotonic() + (args.deadline_in or args.budget_s)
        run_child(args)
        return
    if args.device == "cuda" and not cuda:
        parser.error("--device cuda but torch.cuda.is_available() is False")
    args.deadline = time.monotonic() + args.budget_s
    if args.shapes:
        shapes = [("custom", *map(int, s.split(","))) for s in args.shapes.split(";")]
    else:
        shapes = GPU_SHAPES if args.device == "cuda" else CPU_SHAPES
    providers = args.providers.split(",")
    unknown = set(providers) - set(PROVIDERS)
    if unknown:
        parser.error(f"unknown providers {sorted(unknown)}; known: {PROVIDERS}")

    all_results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, shape in enumerate(shapes):
            if args.device == "cuda":  # one child per shape
                results = _spawn(args, shape, providers, os.path.join(tmp, f"{i}.json"))
            else:  # one child per (shape, provider): peak RSS is per process
                results = {}
                for p in providers:
                    part = _spawn(args, shape, [p], os.path.join(tmp, f"{i}-{p}.json"))
                    results["reference_dtype"] = part.pop("reference_dtype", None)
                    results.update(part)
            reference_dtype = results.pop("reference_dtype", None)
            results = {p: results.get(p, {"skipped": "not requested"}) for p in PROVIDERS}
            _derive(shape, results)
            if args.device == "cuda":
                _add_bound(shape, results, _device_peak(torch.cuda.get_device_name()))
            results["reference_dtype"] = reference_dtype
            all_results.append(results)

    _print_table(args.device, shapes, all_results)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    record = {
        "benchmark": "kernels",
        "device": args.device,
        "device_name": device_name or platform.machine(),
        "dtype": "bfloat16" if args.device == "cuda" else "float32",
        "repeats": args.repeats,
        "check_tokens": args.check_tokens,
        "shapes": [
            {"label": s[0], "N": s[1], "H": s[2], "V": s[3], "providers": r}
            for s, r in zip(shapes, all_results, strict=True)
        ],
        "versions": _versions(),
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "method": "see the docstring of bench/kernels.py: fresh subprocess per shape (GPU) or "
        "per shape x provider (CPU); CUDA events / perf_counter medians; "
        "max_memory_allocated delta (GPU) or ru_maxrss minus RSS after inputs (CPU)",
    }
    out = args.out or Path(__file__).parent / "results" / f"kernels_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
