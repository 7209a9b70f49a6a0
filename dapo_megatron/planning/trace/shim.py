"""The fake-CUDA shim the memory tracer preloads: its path, its build, and a load check.

fake_cuda_shim.cpp (beside this file) registers c10's FakeGuardImpl as the CUDA device guard
and CUDA hooks that report a device, so that autograd runs on fake CUDA tensors in a CPU-only
torch build. It uses torch internals (c10/core/impl/FakeGuardImpl.h, ATen/detail/
CUDAHooksInterface.h), so it is built against the installed torch and named after its
version: scripts/setup.sh builds it with the machine's g++ (a second or two), and a torch
upgrade builds a new one instead of loading a stale one. It must be LD_PRELOADed: torch
caches the CUDA hooks the first time anything asks for them, which importing torch does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_cuda_shim.cpp")


class ShimUnavailable(RuntimeError):
    """The shim cannot be built or found; the message says why and what to do."""


def torch_dir() -> Path:
    """The installed torch package, found without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ShimUnavailable("torch is not installed in this Python")
    return Path(list(spec.submodule_search_locations)[0])


def shim_path() -> Path:
    """Where the shim for the installed torch lives (inside the environment, not the
    checkout)."""
    version = importlib.metadata.version("torch").replace("+", "_")
    return Path(sys.prefix) / "lib" / f"dapo-fake-cuda-torch{version}.so"


def build_shim(force: bool = False) -> Path:
    """Build the shim for the installed torch (once); returns its path."""
    out = shim_path()
    if out.exists() and not force and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise ShimUnavailable(
            "no C++ compiler (g++) to build the memory tracer's shim: install g++ "
            "(Debian: apt-get install g++) and run bash scripts/setup.sh again"
        )
    torch = torch_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.so")
    cmd = [
        cxx, "-O1", "-shared", "-fPIC", "-std=c++20", "-w",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        f"-I{torch / 'include'}",
        str(SOURCE),
        f"-L{torch / 'lib'}", "-ltorch_cpu", "-lc10",
        f"-Wl,-rpath,{torch / 'lib'}",
        "-o", str(tmp),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["(no output)"])[0]
        raise ShimUnavailable(f"building the memory tracer's shim failed: {first}")
    tmp.replace(out)
    return out


def main() -> int:
    """``python -m dapo_megatron.planning.trace.shim``: build it (scripts/setup.sh)."""
    try:
        path = build_shim(force="--force" in sys.argv)
    except ShimUnavailable as error:
        print(f"[setup] {error}", file=sys.stderr)
        return 1
    print(f"[setup] memory tracer shim: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
