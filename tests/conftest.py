"""Shared pytest set-up: GPU-only tests are skipped (and counted) without CUDA; shared-memory
files left in /dev/shm by processes the tests killed are removed at the end (shm_hygiene);
every test runs in a working directory of its own and fails if it changes the checkout's
runs/ (the main job's, which CI runs before the tests)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import shm_hygiene
import torch
from checkout_guard import CHECKOUT_RUNS, runs_changes, runs_snapshot

# Ray fixes its authentication mode when it is imported; with RAY_AUTH_MODE unset, an
# in-process ray.init switches this process to token mode (and writes RAY_AUTH_MODE=token
# into os.environ), so a later test that sets "disabled" after ray was imported runs a
# driver and a cluster that disagree, and the cluster's workers are refused. Decided once
# here, before any test module imports ray. Runs of dapo-train pass their own environment
# (tests/functional/tiny_job.py; test_tiny_run.py runs with Ray's default mode).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_shm_before: set[str] = set()


def _xdist_worker(session: pytest.Session) -> bool:
    """True in a pytest-xdist worker (scripts/test.sh runs the suite on two): only the
    controlling process, which starts before and ends after every worker, cleans up, or a
    worker that finishes first would remove the files of a test another worker still runs."""
    return hasattr(session.config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _xdist_worker(session):
        _shm_before.update(shm_hygiene.ours())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _xdist_worker(session):
        return
    removed = shm_hygiene.remove_leftovers(_shm_before)
    if removed:
        print(f"\n[shm] removed {len(removed)} shared-memory file(s) left by killed processes")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A test module must leave no Ray connected in the pytest process once its fixtures are
    torn down: the next module's ``ray.init`` would fail ("called ray.init twice"), and
    which module runs next depends on the order (the suite runs on two workers). A call
    such as ``ray.get_runtime_context()`` starts a local cluster silently when none is
    connected; this names the module that left one behind."""
    if nextitem is not None and nextitem.module is item.module:
        return  # module-scoped fixtures may hold a cluster across the module's tests
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(
            f"{item.nodeid}: Ray is still initialized in the pytest process after this "
            "module's tests (shut it down in the fixture that started it, or find the call "
            "that started it implicitly)",
            pytrace=False,
        )


# --- The checkout's run directories are the user's, never a test's -----------------------
# Recipes name relative run directories (runs/dapo-tiny-cpu/...), resolved against the
# working directory. A test run from the checkout would otherwise read what the main job
# left there (its model's config.json wins over the preset a test sets) or write beside it.
# Every test therefore runs in a working directory of its own, and a test that changes the
# checkout's runs/ anyway (a subprocess started with cwd=REPO and a relative path) fails.
@pytest.fixture(autouse=True)
def _outside_the_checkout_runs(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    before = runs_snapshot()
    yield
    changed = runs_changes(before, runs_snapshot())
    if changed:
        shown = ", ".join(changed[:5]) + (
            f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        )
        pytest.fail(
            f"this test changed the checkout's run directory {CHECKOUT_RUNS}: {shown}; tests "
            "must write under tmp_path (pass run.output_dir and policy.model_name_or_path)",
            pytrace=False,
        )
