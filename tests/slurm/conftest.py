"""Fixtures of the real-Slurm tests: skipped (with the reason) unless scripts/test_slurm.sh
started a Slurm for them; one Job per test in its own directory, checked for leftovers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from slurm_job import Job, slurm_up


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: runs sbatch slurm/ray.sub under a real Slurm")
    config.addinivalue_line("markers", "slurm_long: the longer real-Slurm set (--slurm-long)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = slurm_up()
    for item in items:
        if "slurm" not in item.keywords and "slurm_long" not in item.keywords:
            continue
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        elif "slurm_long" in item.keywords and os.environ.get("DAPO_SLURM_LONG") != "1":
            item.add_marker(pytest.mark.skip(reason="the longer set: scripts/test.sh --slurm-long"))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, created by the session's first run (init_model_if_missing) and read
    by every later one."""
    return tmp_path_factory.mktemp("slurm-model") / "model"


@pytest.fixture
def new_job(tmp_path: Path, model_dir: Path) -> Iterator[Callable[..., Job]]:
    """new_job(nodes=1, script=...) -> a Job not submitted yet; every job made here is
    cancelled if still running at the end and must have left no process or /dev/shm file."""
    jobs: list[Job] = []

    def make(nodes: int = 1, **kwargs: object) -> Job:
        root = tmp_path / f"job{len(jobs)}"
        root.mkdir()
        job = Job(root=root, model_dir=model_dir, nodes=nodes, **kwargs)  # type: ignore[arg-type]
        jobs.append(job)
        return job

    yield make
    problems = []
    for job in jobs:
        if job.job_id:
            job.cancel()
            problems += job.leftovers()
        job.cleanup()
    assert not problems, f"left behind by the job(s): {problems}"
