"""The fake-CUDA shim builds against the installed torch and loads: without it the tracer
cannot run a backward pass (it uses torch internals, so a torch change must fail here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

from dapo_megatron.planning.trace.shim import build_shim, shim_path

REPO = Path(__file__).resolve().parents[4]


def test_the_shim_is_built_for_the_pinned_torch() -> None:
    # scripts/setup.sh installs torch==2.13.0; the shim's name carries the version it was
    # built against, so another torch gets a new build instead of a stale library.
    pinned = next(
        line.split("torch==")[1].split('"')[0]
        for line in (REPO / "scripts" / "setup.sh").read_text().splitlines()
        if "torch==" in line and "install" in line
    )
    assert version("torch").split("+")[0] == pinned
    path = build_shim()
    assert path == shim_path() and path.is_file()
    assert pinned in path.name


def test_autograd_runs_on_fake_cuda_tensors_only_with_the_shim() -> None:
    program = textwrap.dedent(
        """
        import ctypes, torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            x = torch.empty(8, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            w = torch.empty(16, 4, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            (x @ w).float().sum().backward()
            print(x.grad.device, tuple(w.grad.shape))
        print(ctypes.CDLL(None).dapo_fake_cuda_shim_loaded(), flush=True)
        # As the trace process does (fake_trace/__main__.py): autograd's device threads
        # are not joined at a CPU build's exit.
        import os
        os._exit(0)
        """
    )
    env = dict(os.environ, LD_PRELOAD=str(build_shim()))
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["cuda:0", "(16,", "4)", "1"]
    # Without the shim the same backward is an uncatchable abort: the shim is what the
    # tracer stands on.
    bare = dict(os.environ)
    bare.pop("LD_PRELOAD", None)
    done = subprocess.run(
        [sys.executable, "-c", program], env=bare, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
