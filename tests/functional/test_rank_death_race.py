"""A policy rank killed in a collective: the surviving rank's gloo error ("Connection reset by
peer") may reach the controller before Ray reports the death. It must still count as the
death of the killed rank (a restart), not as a bug of the survivor.

The race is made certain with real signals: rank 1 is stopped while the ranks train (SFT
warm-up: an all-reduce per step), so rank 0 waits for it in the all-reduce; the job's
raylet is stopped (Ray learns of a worker's death through it), rank 1 is killed (rank 0's
collective fails at once and its error goes straight to the controller), and the raylet
resumes seconds later, reporting the death.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import waits
from tiny_job import finish, start_and_wait_for, train_command, wait_line

pytestmark = pytest.mark.functional


def _descendants(pid: int, needle: str) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if needle in " ".join(p.cmdline()) or p.name() == needle:
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_survivor_error_before_the_death_report_restarts_and_names_the_dead_rank(tmp_path):
    run_dir = tmp_path / "run"
    cmd = train_command(
        run_dir,
        tmp_path / "model",
        "dapo.max_num_steps=1",
        "sft_warmup.num_steps=200",
        "checkpointing.save_period=1",
        "validation.val_at_start=false",
        "logger.progress_bar=false",
        "logger.plots=false",
        "run.max_restarts=1",
    )
    # The first SFT lines: the ranks are in their warm-up steps.
    proc = start_and_wait_for(cmd, run_dir / "config.yaml", capture=True)
    wait_line(proc, "sft warm-up 10/")
    # One of the two ranks (which one is not visible from outside; the line must name it).
    rank1 = _descendants(proc.pid, "ray::PolicyWorker")[-1]
    raylet = _descendants(proc.pid, "raylet")[0]
    rank1.send_signal(signal.SIGSTOP)
    # Rank 0 now reaches the step's all-reduce and waits for rank 1 (later on a busy machine;
    # rank 1 may stay stopped far longer than its collective needs).
    time.sleep(min(waits.scaled(2), 20))
    raylet.send_signal(signal.SIGSTOP)
    try:
        rank1.send_signal(signal.SIGKILL)
        # Rank 0's error reaches the controller; Ray cannot report yet. Not scaled: a raylet
        # stopped for ~15 s has its node declared dead by the GCS's health check (a clock).
        time.sleep(4)
    finally:
        raylet.send_signal(signal.SIGCONT)
    restart = wait_line(proc, ("[restart", "error:"))
    os.killpg(proc.pid, signal.SIGINT)  # enough: Ctrl-C stops the restarted run
    output = finish(proc, "the exit after Ctrl-C")
    assert restart.startswith("[restart 1/1] policy rank "), output[-3000:]
    assert " died: " in restart and "raised" not in restart, restart
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
