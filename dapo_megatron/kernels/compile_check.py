"""Ahead-of-time compilation of the Triton kernels for GPU targets, on a machine without a GPU.

Triton compiles without a driver when it is given a target:
``triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90,
32))`` lowers the kernel to PTX and assembles it with the ``ptxas`` bundled in the triton
wheel. This module runs that for a list of :class:`KernelSpec` (each kernel module states
the specs of the launches it makes:
:func:`dapo_megatron.kernels.triton_logprob_kernels.compile_specs` and
:func:`dapo_megatron.kernels.triton_pg_loss.compile_specs`), then reads back what a GPU
run would only reveal at launch time:

  * registers per thread, spill stores/loads and stack frame (``ptxas -v``, run again on the
    PTX with Triton's own flags, so a cache hit reports the same numbers);
  * tensor-core instructions in the SASS (``HGMMA`` = wgmma on sm_90, ``HMMA`` = mma.sync),
    GPU-scope memory barriers (``MEMBAR``) and global atomics/reductions (``ATOM``/``RED``);
  * shared memory per program against the SM's limit.

Compilation must see real ``@triton.jit`` functions, so it runs in a child process with
``TRITON_INTERPRET=0`` (the CPU test suite interprets the same kernels):
:func:`compile_in_subprocess` is what tests and benchmarks call.
``python -m dapo_megatron.kernels.compile_check --out table.json`` prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Opt-in shared memory per thread block (bytes): CUDA programming guide, compute capabilities.
SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
TARGETS = (90, 80)
KERNEL_MODULES = (
    "dapo_megatron.kernels.triton_logprob_kernels",
    "dapo_megatron.kernels.triton_pg_loss",
)


@dataclass(frozen=True)
class KernelSpec:
    """One launch configuration of one kernel, as the launch code would pick it."""

    label: str
    """Short name, unique per (label, arch, dtype): kernel plus variant."""
    module: str
    """Module that defines the kernel."""
    kernel: str
    """Name of the ``@triton.jit`` function in ``module``."""
    arch: int
    """Compute capability, e.g. 90 or 80."""
    dtype: str
    """Input dtype of the launch (``"bf16"``, ``"fp32"``, ...), for the table."""
    args: dict[str, str]
    """Triton type of every runtime argument (``"*bf16"``, ``"i32"``, ``"fp32"``)."""
    constexprs: dict[str, Any]
    """Value of every ``tl.constexpr`` argument."""
    divisible: tuple[str, ...] = ()
    """Runtime arguments specialised as 16-divisible (16-byte aligned pointers, ints % 16 ==
    0), as Triton does at launch for such values."""
    num_warps: int = 4
    num_stages: int = 3
    production: bool = True
    """A configuration the GPU path launches with bf16 inputs (the no-spill gate applies)."""


@dataclass
class CompileReport:
    """What :func:`compile_spec` found for one :class:`KernelSpec`."""

    label: str
    arch: int
    dtype: str
    num_warps: int
    num_stages: int
    constexprs: dict[str, Any]
    production: bool
    ok: bool = False
    error: str | None = None
    registers: int | None = None
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    stack_bytes: int | None = None
    shared_bytes: int | None = None
    shared_limit: int | None = None
    sass_counts: dict[str, int] = field(default_factory=dict)
    """Instruction counts in the SASS: HGMMA, HMMA, MEMBAR, ATOM, RED, LDL, STL."""
    compile_s: float | None = None

    @property
    def key(self) -> str:
        return f"{self.label}@sm_{self.arch}/{self.dtype}"

    @property
    def spills(self) -> int:
        return (self.spill_store_bytes or 0) + (self.spill_load_bytes or 0)

    @property
    def tensor_core_ops(self) -> int:
        return self.sass_counts.get("HGMMA", 0) + self.sass_counts.get("HMMA", 0)


def bundled_ptxas(arch: int) -> str | None:
    """Path of the ptxas in the triton wheel that Triton uses for ``arch``, if present."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        path = get_ptxas(arch).path
    except Exception:
        return None
    return path if path and os.path.exists(path) else None


def _cuobjdump() -> str | None:
    try:
        from triton import knobs

        path = knobs.nvidia.cuobjdump.path
    except Exception:
        return None
    return path if path and os.path.exists(path) else None


_PTXAS_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "spill_store_bytes": r"(\d+) bytes spill stores",
    "spill_load_bytes": r"(\d+) bytes spill loads",
    "stack_bytes": r"(\d+) bytes stack frame",
}
# Instruction families counted in the SASS (a mnemonic counts for the family it starts
# with: REDG and RED.E both count as RED, ATOMG as ATOM).
_SASS_OPS = ("HGMMA", "HMMA", "MEMBAR", "ATOM", "RED", "LDL", "STL")


def _ptxas_resources(ptx: str, arch: int) -> tuple[dict[str, int], str]:
    """Resource usage from ``ptxas -v`` with Triton's flags, and the SASS of the cubin."""
    from triton.backends.nvidia.compiler import sm_arch_from_capability

    ptxas = bundled_ptxas(arch)
    assert ptxas is not None
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        src.write_text(ptx)
        cmd = [
            ptxas, "-lineinfo", "-v", "--regAllocOptLevel=2",
            f"--gpu-name={sm_arch_from_capability(arch)}", str(src), "-o", str(out),
        ]  # fmt: skip
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
        res = {}
        for key, pattern in _PTXAS_PATTERNS.items():
            found = re.findall(pattern, log)
            res[key] = max(int(x) for x in found) if found else 0
        sass = ""
        tool = _cuobjdump()
        if tool is not None:
            sass = subprocess.run(
                [tool, "-sass", str(out)], check=True, capture_output=True, text=True
            ).stdout
    return res, sass


def _sass_counts(sass: str) -> dict[str, int]:
    counts = dict.fromkeys((*_SASS_OPS, "MEMBAR_GPU"), 0)
    for line in sass.splitlines():
        # "        /*0120*/                   HGMMA.64x128x16.F32.BF16 gdesc[UR4], ..."
        match = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)(\.[A-Z0-9_.]+)?", line)
        if match is None:
            continue
        for op in _SASS_OPS:
            if match.group(1).startswith(op):
                counts[op] += 1
                break
        # A GPU- or system-scope barrier (what an acq_rel atomic costs); CTA-scope fences
        # of the async proxy (wgmma, TMA) are MEMBAR too but cheap.
        modifiers = match.group(2) or ""
        if match.group(1) == "MEMBAR" and (".GPU" in modifiers or ".SYS" in modifiers):
            counts["MEMBAR_GPU"] += 1
    return counts


def compile_spec(spec: KernelSpec) -> CompileReport:
    """Compile ``spec`` for its target and inspect the result (in this process: the kernel
    module must have been imported with ``TRITON_INTERPRET`` unset or 0)."""
    report = CompileReport(
        label=spec.label, arch=spec.arch, dtype=spec.dtype, num_warps=spec.num_warps,
        num_stages=spec.num_stages, constexprs=dict(spec.constexprs),
        production=spec.production, shared_limit=SMEM_LIMIT.get(spec.arch),
    )  # fmt: skip
    t0 = time.perf_counter()
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        fn = getattr(importlib.import_module(spec.module), spec.kernel)
        if not hasattr(fn, "arg_names"):
            raise RuntimeError(f"{spec.kernel} is not a compiled @triton.jit (TRITON_INTERPRET?)")
        missing = [
            n for n in fn.arg_names if n not in spec.args and n not in spec.constexprs
        ]  # fmt: skip
        if missing:
            raise ValueError(f"spec gives no type or value for arguments {missing}")
        signature = {
            n: spec.args.get(n, "constexpr") for n in fn.arg_names
        }  # fmt: skip
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in spec.divisible}
        src = ASTSource(fn, signature, constexprs=dict(spec.constexprs), attrs=attrs)
        compiled = triton.compile(
            src,
            target=GPUTarget("cuda", spec.arch, 32),
            options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
        )
        resources, sass = _ptxas_resources(compiled.asm["ptx"], spec.arch)
        for key, value in resources.items():
            setattr(report, key, value)
        report.shared_bytes = int(compiled.metadata.shared)
        report.sass_counts = _sass_counts(sass)
        report.ok = True
    except Exception as exc:  # reported, and asserted on by the caller
        report.error = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    report.compile_s = time.perf_counter() - t0
    return report


def collect_specs(
    archs: Sequence[int] = TARGETS, modules: Sequence[str] = KERNEL_MODULES
) -> list[KernelSpec]:
    """Every launch configuration the kernel modules declare for ``archs``."""
    specs: list[KernelSpec] = []
    for name in modules:
        module = importlib.import_module(name)
        for arch in archs:
            specs.extend(module.compile_specs(arch))
    keys = [(s.label, s.arch, s.dtype) for s in specs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate (label, arch, dtype) among the compile specs")
    return specs


def compile_all(specs: Sequence[KernelSpec], jobs: int = 1) -> list[CompileReport]:
    """Compile ``specs`` (``jobs`` worker processes), reports in the same order."""
    if jobs <= 1 or len(specs) <= 1:
        return [compile_spec(s) for s in specs]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(compile_spec, specs))


def compile_in_subprocess(
    archs: Sequence[int] = TARGETS,
    *,
    jobs: int | None = None,
    timeout: float = 600.0,
    extra_args: Sequence[str] = (),
) -> list[CompileReport]:
    """Run this module in a child process with ``TRITON_INTERPRET=0``; its reports.

    Raises:
        RuntimeError: the child failed (not a kernel compile error: those are reported).
    """
    jobs = jobs if jobs is not None else max(1, min(4, os.cpu_count() or 1))
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "reports.json")
        cmd = [
            sys.executable, "-m", __name__, "--arch", *map(str, archs), "--jobs", str(jobs),
            "--out", str(out), "--quiet", *extra_args,
        ]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"compile_check child failed ({proc.returncode}): {proc.stderr[-3000:]}"
            )
        return [CompileReport(**r) for r in json.loads(out.read_text())["reports"]]


def format_table(reports: Sequence[CompileReport]) -> str:
    """One line per report: registers, spills, tensor-core ops, barriers, shared memory."""
    head = (
        f"{'kernel':<28}{'sm':>4}{'dtype':>6}{'warps':>6}{'stg':>4}{'regs':>6}{'spill st/ld':>12}"
        f"{'HGMMA':>7}{'HMMA':>6}{'MEMBAR(GPU)':>12}{'ATOM+RED':>9}{'smem KiB':>10}{'limit':>7}"
    )
    lines = [head]
    for r in reports:
        if not r.ok:
            lines.append(f"{r.label:<28}{r.arch:>4}{r.dtype:>6}  FAILED: {(r.error or '')[:80]}")
            continue
        c = r.sass_counts
        membar = f"{c.get('MEMBAR', 0)}({c.get('MEMBAR_GPU', 0)})"
        spill = f"{r.spill_store_bytes}/{r.spill_load_bytes}"
        lines.append(
            f"{r.label:<28}{r.arch:>4}{r.dtype:>6}{r.num_warps:>6}{r.num_stages:>4}"
            f"{r.registers:>6}{spill:>12}{c.get('HGMMA', 0):>7}{c.get('HMMA', 0):>6}"
            f"{membar:>12}{c.get('ATOM', 0) + c.get('RED', 0):>9}"
            f"{(r.shared_bytes or 0) / 1024:>10.1f}{(r.shared_limit or 0) // 1024:>7}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(TARGETS))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--module", action="append", default=None, help="kernel module(s)")
    parser.add_argument("--production-only", action="store_true", help="bf16 launch tiles")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("run with TRITON_INTERPRET=0 (compilation needs real @triton.jit kernels)")
    missing = [a for a in args.arch if bundled_ptxas(a) is None]
    if missing:
        parser.error(f"no bundled ptxas for sm_{missing}")
    specs = collect_specs(args.arch, args.module or KERNEL_MODULES)
    if args.production_only:
        specs = [s for s in specs if s.production]
    with contextlib.redirect_stdout(sys.stderr if args.quiet else sys.stdout):
        reports = compile_all(specs, args.jobs)
    if not args.quiet:
        print(format_table(reports))
    if args.out is not None:
        record = {"reports": [dataclasses.asdict(r) for r in reports]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
