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

Usage:
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


def _print_table(device: str, shapes: list[tuple], all_results: list[dict]) -> None:
    header = (
        f"{'shape':<34}{'provider':<9}{'peak MiB':>10}{'mem/naive':>10}{'fwd ms':>10}"
        f"{'fwd/naive':>10}{'fb ms':>10}{'fb/naive':>9}{'fb/gemm':>9}{'fb TF/s':>9}"
        f"{'err lp':>9}{'err dH':>9}"
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
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--deadline-in", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 10 if args.device == "cuda" else 5
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
