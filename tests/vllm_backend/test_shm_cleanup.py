"""/dev/shm is left as found by a vLLM engine actor (issue 30, case 9), stopped normally or
killed.

A TP2 engine (vLLM's multiprocessing executor: an engine-core process and two workers)
names ~8 files in /dev/shm: the shm-broadcast queues (``psm_*``, multiprocessing
shared_memory), the CPU all-reduce buffers of its TP group (``vllm_dist_*``) and
multiprocessing semaphores (``sem.mp-*``). The engines run as the controller runs them
(controller/actors/generation_group.py, split placement, Ray actors); the killed engine gets a
real SIGKILL, so nothing in its processes can clean up: the controller must.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray
import shm_hygiene

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors.generation_group import GenerationGroup
from dapo_megatron.data.tiny_model import create_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunPlan]:
    base = tmp_path_factory.mktemp("shm")
    model = base / "model"
    create_tiny_model(model, arch=PRESETS["tiny-qwen2-hd32"], seed=0)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        yield load_config(
            REPO / "recipes" / "dapo-tiny-cpu-vllm.yaml",
            # A module fixture runs in the checkout: the engine's log goes under tmp.
            [f"policy.model_name_or_path={model}", f"run.output_dir={base / 'run'}"],
        ).require_plan()
    finally:
        ray.shutdown()


def _engine_files(before: set[str]) -> set[str]:
    """The files of the kinds vLLM names that appeared since ``before`` (this engine's;
    another session's engine starting meanwhile would only make the test stricter)."""
    files = shm_hygiene.ours() - before
    assert files, "the TP2 engine named no file in /dev/shm: the test checks nothing"
    return files


def _left(files: set[str], timeout_s: float = 10.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while (left := files & shm_hygiene.ours()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_engine_stopped_leaves_dev_shm_as_found(plan: RunPlan) -> None:
    before = shm_hygiene.ours()
    engines = GenerationGroup(plan, None)  # type: ignore[arg-type]  # split: no policy used
    files = _engine_files(before)
    engines.shutdown()
    assert not _left(files)


def test_engine_killed_leaves_dev_shm_as_found(plan: RunPlan) -> None:
    before = shm_hygiene.ours()
    engines = GenerationGroup(plan, None)  # type: ignore[arg-type]
    files = _engine_files(before)
    (pid,) = engines.worker_pids()
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)], timeout=30)
    engines.shutdown()  # what the controller does after a death, before it restarts
    assert not _left(files)
