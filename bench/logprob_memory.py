"""Peak memory and time of token logprobs, forward + backward: naive torch vs the chunked path.

Providers, both run in this invocation on identical seeded inputs (fp32 hidden ``[N, H]``,
fp32 weight ``[V, H]``, targets ``[N]``), loss ``sum(c * logprob)`` with random ``c``:
  naive    ``logits = h @ W^T`` (fp32 ``[N, V]``), ``log_softmax``, ``gather``; autograd.
  chunked  ``dapo_megatron.kernels.linear_logprob(impl="chunked")``, default chunk size
           unless ``--chunk-size`` is given.

Memory method: each provider runs in a FRESH subprocess, so one provider's allocator state
and high-water mark cannot leak into the other's. The child imports torch, creates the
inputs, resets the kernel's peak-RSS counter when it can (writing "5" to
/proc/self/clear_refs, Linux >= 4.0; otherwise the peak of the import phase stays in the
counter, which the JSON records as ``hwm_reset: false``), and records the current RSS as the
baseline. It then runs one warm-up and ``--repeats`` timed forward+backward iterations. The
reported peak extra memory is ``ru_maxrss`` (``resource.getrusage``, the process high-water
mark of resident memory) minus that baseline: everything the computation itself touched at
its worst moment (activations, gradients, temporaries, allocator slack). Time is the
median wall time of the timed iterations.

Both children save their logprobs and gradients; the parent reports the max |difference|
between the providers, so the speed/memory numbers are for the same results.

Usage: python bench/logprob_memory.py [--tokens 8192] [--hidden 256] [--vocab 32768]
           [--chunk-size N] [--repeats 3] [--out bench/results/logprob_memory_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

PROVIDERS = ("naive", "chunked")
MIB = 2**20


def _inputs(args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=gen)
    weight = torch.randn(args.vocab, args.hidden, generator=gen) * (3.0 / args.hidden**0.5)
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen)
    coef = torch.randn(args.tokens, generator=gen)
    return hidden.requires_grad_(), weight.requires_grad_(), targets, coef


def _naive(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = (hidden @ weight.T).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def _reset_peak_rss() -> bool:
    """Reset the process's peak-RSS counter (VmHWM, which ru_maxrss reads); False if unable."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_child(args: argparse.Namespace) -> None:
    """Measure one provider in this (fresh) process; write JSON + tensors to --result."""
    from dapo_megatron.kernels import linear_logprob
    from dapo_megatron.kernels.chunked import default_chunk_size

    hidden, weight, targets, coef = _inputs(args)
    chunk = args.chunk_size or default_chunk_size(args.vocab, hidden.dtype)

    def step() -> torch.Tensor:
        hidden.grad = weight.grad = None
        if args.child == "naive":
            lp = _naive(hidden, weight, targets)
        else:
            lp, _ = linear_logprob(hidden, weight, targets, chunk_size=chunk, impl="chunked")
        (coef * lp).sum().backward()
        return lp.detach()

    hwm_reset = _reset_peak_rss()
    baseline = psutil.Process().memory_info().rss
    times = []
    for i in range(args.repeats + 1):
        start = time.perf_counter()
        lp = step()
        if i > 0:  # iteration 0 is the warm-up
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    torch.save({"lp": lp, "dH": hidden.grad, "dW": weight.grad}, args.result + ".pt")
    result = {
        "peak_extra_mib": (peak - baseline) / MIB,
        "baseline_rss_mib": baseline / MIB,
        "hwm_reset": hwm_reset,
        "time_s_median": statistics.median(times),
        "time_s_all": times,
        "chunk_size": chunk if args.child == "chunked" else None,
    }
    Path(args.result).write_text(json.dumps(result))


def _spawn(provider: str, args: argparse.Namespace, result: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        provider,
        "--result",
        result,
        "--tokens",
        str(args.tokens),
        "--hidden",
        str(args.hidden),
        "--vocab",
        str(args.vocab),
        "--repeats",
        str(args.repeats),
    ]
    if args.chunk_size:
        cmd += ["--chunk-size", str(args.chunk_size)]
    subprocess.run(cmd, check=True)
    return json.loads(Path(result).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "logprob_memory_cpu.json",
    )
    parser.add_argument("--child", choices=PROVIDERS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        results = {p: _spawn(p, args, os.path.join(tmp, p + ".json")) for p in PROVIDERS}
        tensors = {p: torch.load(os.path.join(tmp, p + ".json.pt")) for p in PROVIDERS}
    max_abs_diff = {
        key: (tensors["chunked"][key] - tensors["naive"][key]).abs().max().item()
        for key in ("lp", "dH", "dW")
    }
    # Scale of each quantity, to read the differences against.
    max_abs_naive = {key: tensors["naive"][key].abs().max().item() for key in max_abs_diff}
    naive, chunked = results["naive"], results["chunked"]
    ratio_mem = chunked["peak_extra_mib"] / naive["peak_extra_mib"]
    ratio_time = chunked["time_s_median"] / naive["time_s_median"]

    print(
        f"N={args.tokens} H={args.hidden} V={args.vocab} fp32, fwd+bwd, "
        f"{torch.get_num_threads()} threads, chunk={chunked['chunk_size']}"
    )
    print(f"{'provider':<10}{'peak extra MiB':>16}{'time s':>10}")
    for name, res in results.items():
        print(f"{name:<10}{res['peak_extra_mib']:>16.1f}{res['time_s_median']:>10.3f}")
    print(f"{'ratio':<10}{ratio_mem:>16.3f}{ratio_time:>10.3f}   (chunked / naive)")
    print(
        "max |chunked - naive| (max |naive|): "
        + ", ".join(f"{k} {v:.3g} ({max_abs_naive[k]:.3g})" for k, v in max_abs_diff.items())
    )

    record = {
        "benchmark": "logprob_memory",
        "config": {
            "tokens": args.tokens,
            "hidden": args.hidden,
            "vocab": args.vocab,
            "dtype": "float32",
            "repeats": args.repeats,
        },
        "fp32_logits_mib": args.tokens * args.vocab * 4 / MIB,
        "providers": results,
        "ratio_chunked_over_naive": {"peak_extra_memory": ratio_mem, "time": ratio_time},
        "max_abs_diff": max_abs_diff,
        "max_abs_naive": max_abs_naive,
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "method": "fresh subprocess per provider; ru_maxrss minus RSS after inputs (see "
        "docstring of bench/logprob_memory.py)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
