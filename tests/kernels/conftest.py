"""Run Triton kernels in tests/kernels on the CPU with Triton's interpreter.

Triton decides at ``@triton.jit`` time whether a kernel is compiled or interpreted, so the
variable must be set before :mod:`dapo_megatron.kernels.triton_logprob` is imported (the
dispatcher imports it lazily, and this conftest loads before the test modules here). Spawned
worker processes inherit it through the environment. An explicit setting (e.g. ``0`` on a
GPU machine, to test the compiled kernels) is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
