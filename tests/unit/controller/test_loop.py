"""controller/loop.train's lifecycle: a crash reaches the experiment loggers as a failure,
the progress bar is closed and the workers are stopped on every exit path (no Ray, no
workers: stand-ins)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dapo_megatron.config.loader import load_config
from dapo_megatron.controller import loop

REPO = Path(__file__).resolve().parents[3]


class RecordingLogger:
    closed: list[bool] = []

    def __init__(self, *args, **kwargs):
        pass

    def log(self, step, metrics):
        pass

    def close(self, *, failed: bool = False):
        RecordingLogger.closed.append(failed)


class RecordingProgress:
    closed = 0

    def __init__(self, *args, **kwargs):
        pass

    def update(self, step, metrics):
        pass

    def close(self):
        RecordingProgress.closed += 1


class RecordingWorkers:
    """Stand-ins for the policy group and the engines; counts shutdowns."""

    stopped: list[str] = []

    def __init__(self, name: str) -> None:
        self.name = name

    def refit(self, policy) -> float:
        return 0.0

    def shutdown(self) -> None:
        RecordingWorkers.stopped.append(self.name)


@pytest.fixture()
def fake_run(monkeypatch, tmp_path):
    RecordingLogger.closed = []
    RecordingProgress.closed = 0
    RecordingWorkers.stopped = []
    ctx = SimpleNamespace(
        reset_state=lambda: None,
        close=lambda: None,
        checkpoint_dir=tmp_path / "checkpoints",
    )
    monkeypatch.setattr(loop, "build_context", lambda plan: ctx)
    monkeypatch.setattr(loop, "start_ray", lambda cluster, device: None)
    monkeypatch.setattr(loop, "PolicyGroup", lambda plan: RecordingWorkers("policy"))
    monkeypatch.setattr(loop, "build_engines", lambda plan, policy: RecordingWorkers("engines"))
    monkeypatch.setattr(loop, "MetricsLogger", RecordingLogger)
    monkeypatch.setattr(loop, "StepProgress", RecordingProgress)
    plan = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml", [f"run.output_dir={tmp_path}"]
    ).require_plan()
    return plan, ctx, tmp_path


def test_a_crash_closes_the_loggers_as_failed(fake_run, monkeypatch):
    plan, _, run_dir = fake_run

    def crash(ctx, workers, logger):
        raise RuntimeError("boom in step 3")

    monkeypatch.setattr(loop, "_run_steps", crash)
    with pytest.raises(RuntimeError, match="boom"):
        loop.train(plan)
    assert RecordingLogger.closed == [True]
    assert RecordingWorkers.stopped == ["engines", "policy"]


def test_a_finished_run_closes_the_loggers_as_successful(fake_run, monkeypatch):
    plan, _, run_dir = fake_run
    monkeypatch.setattr(loop, "_run_steps", lambda ctx, workers, logger: {"loss": 0.0})
    assert loop.train(plan) == {"loss": 0.0}
    assert RecordingLogger.closed == [False]
    assert RecordingWorkers.stopped == ["engines", "policy"]


def test_the_progress_bar_closes_when_a_step_raises(fake_run, monkeypatch):
    plan, ctx, run_dir = fake_run
    monkeypatch.setattr(loop, "_resume", lambda ctx, policy: {"step": 5})
    ctx.plan, ctx.config = plan, plan.config

    def failing_rollouts(planner, engines, step):
        raise RuntimeError("generation failed")

    monkeypatch.setattr(loop.steps, "collect_rollouts", failing_rollouts)
    with pytest.raises(RuntimeError, match="generation failed"):
        loop.train(plan)
    assert RecordingProgress.closed == 1 and RecordingLogger.closed == [True]
    assert RecordingWorkers.stopped == ["engines", "policy"]


def test_a_dead_worker_restarts_with_new_workers_and_stops_each_set(fake_run, monkeypatch):
    plan, _, run_dir = fake_run
    attempts = []

    def dies_once(ctx, workers, logger):
        attempts.append(workers)
        if len(attempts) == 1:
            raise loop.WorkerDied("policy rank 1 died")
        return {"loss": 0.0}

    monkeypatch.setattr(loop, "_run_steps", dies_once)
    assert loop.train(plan) == {"loss": 0.0}
    assert attempts[0] is not attempts[1] and attempts[0].policy is not attempts[1].policy
    assert RecordingWorkers.stopped == ["engines", "policy"] * 2
    assert RecordingLogger.closed == [True, False]


def test_engines_that_fail_to_start_stop_the_policy(fake_run, monkeypatch):
    plan, _, run_dir = fake_run

    def no_engines(plan, policy):
        raise RuntimeError("the Ray cluster cannot place 1 generation engines")

    monkeypatch.setattr(loop, "build_engines", no_engines)
    with pytest.raises(RuntimeError, match="cannot place"):
        loop.train(plan)
    assert RecordingWorkers.stopped == ["policy"] and RecordingLogger.closed == [True]
