"""Run Triton kernels in tests/kernels on the CPU with Triton's interpreter.

Triton decides at ``@triton.jit`` time whether a kernel is compiled or interpreted, so the
variable must be set before :mod:`dapo_megatron.kernels.triton_logprob` is imported (the
dispatcher imports it lazily, and this conftest loads before the test modules here). Spawned
worker processes inherit it through the environment. An explicit setting (e.g. ``0`` on a
GPU machine, to test the compiled kernels) is kept. The ahead-of-time compile test
(test_compile.py) compiles in a child process with ``TRITON_INTERPRET=0``.

``@pytest.mark.slow`` tests here (the full compile table: alternative tiles, fp32) run only
with ``DAPO_RUN_SLOW=1``, so the default suite stays short on a 2-core CI machine.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long-running; only with DAPO_RUN_SLOW=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DAPO_RUN_SLOW", "0") not in ("", "0"):
        return
    skip = pytest.mark.skip(reason="slow; set DAPO_RUN_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
