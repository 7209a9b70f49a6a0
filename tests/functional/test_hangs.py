"""A rank that stops responding (SIGSTOP) ends the run within its timeouts, with one line
naming it, instead of a hang: in a collective (its peers' collective times out after
run.collective_timeout_s, and the stopped rank is the one that never answers), and in any
call to a worker (run.call_timeout_s)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import ray
import waits
from tiny_job import finish, start_and_wait_for, train_command, wait_line

from dapo_megatron.controller.actors.remote import WorkerHung, gather

pytestmark = pytest.mark.functional


def _policy_workers(pid: int) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(pid).children(recursive=True)
        if "ray::PolicyWorker" in " ".join(p.cmdline())
    ]


def test_a_rank_stopped_in_a_collective_ends_the_run_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    cmd = train_command(
        run_dir,
        tmp_path / "model",
        "dapo.max_num_steps=1",
        "sft_warmup.num_steps=300",
        "validation.val_at_start=false",
        "logger.progress_bar=false",
        "logger.plots=false",
        "run.max_restarts=0",
        "run.collective_timeout_s=10",
    )
    proc = start_and_wait_for(cmd, run_dir / "config.yaml", capture=True)
    wait_line(proc, "sft warm-up 10/")  # the ranks are in their SFT steps (an all-reduce each)
    stopped = _policy_workers(proc.pid)[-1]
    stopped.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        output = finish(proc, "the exit after a rank stopped")
    finally:
        if stopped.is_running():
            stopped.send_signal(signal.SIGKILL)
    seconds = time.monotonic() - started
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [x for x in output.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, output[-3000:]
    line = errors[0]
    assert line.startswith("error: policy rank "), line
    assert " stopped responding: the collective of policy rank " in line, line
    assert "failed waiting for it (10 s, run.collective_timeout_s)" in line, line
    assert "restarts exhausted (run.max_restarts = 0" in line, line
    # The collective's timeout (a clock), then the stop (work, as slow as the machine).
    assert seconds < 10 + waits.scaled(50), f"{seconds:.0f} s from SIGSTOP to the exit"


@ray.remote(num_cpus=0)
class _Sleeper:
    def pid(self) -> int:
        return os.getpid()

    def work(self) -> str:
        time.sleep(0.5)
        return "done"


def test_a_stopped_worker_fails_the_call_after_its_timeout_naming_it():
    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        workers = [_Sleeper.remote(), _Sleeper.remote()]
        pids = ray.get([w.pid.remote() for w in workers])
        os.kill(pids[1], signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(WorkerHung) as caught:
                gather([w.work.remote() for w in workers], lambda i: f"engine {i}", timeout_s=3)
            seconds = time.monotonic() - started
        finally:
            os.kill(pids[1], signal.SIGKILL)
        assert str(caught.value) == (
            "engine 1 gave no answer within 3 s (run.call_timeout_s); killed with its group"
        )
        assert 3 <= seconds < 3 + waits.scaled(7)
    finally:
        ray.shutdown()
