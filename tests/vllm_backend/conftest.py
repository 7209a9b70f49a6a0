"""tests/vllm_backend run the vLLM generation backend against a real vLLM engine.

vllm is not installed in the main .venv (it would replace torch and transformers), so every
test of this directory is reported as skipped there. On CPU they run in the separate
environment made by scripts/setup_vllm_cpu.sh:

    bash scripts/setup_vllm_cpu.sh && .venv-vllm/bin/python -m pytest tests/vllm_backend
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SKIP_REASON = (
    "vllm is not importable in this environment; run these tests in the vLLM environment: "
    "bash scripts/setup_vllm_cpu.sh && .venv-vllm/bin/python -m pytest tests/vllm_backend"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # find_spec, not an import: importing vllm costs seconds and this hook runs in every
    # test session. A vllm that is present but broken then fails the tests loudly, as it
    # should, instead of skipping them. has_location: with tests/ on sys.path (pytest puts
    # it there) this very directory is found as a namespace package named vllm.
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.has_location:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        # This hook sees the items of the whole session: mark only this directory's.
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)


# The loop tests start dapo-train like the functional tests do (tests/functional/tiny_job.py).
sys.path.insert(0, str(HERE.parent / "functional"))
