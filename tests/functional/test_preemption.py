"""SIGTERM to dapo-train (a Slurm preemption or time limit; slurm/ray.sub forwards it): the
run saves a checkpoint at the end of the current step and exits 143 with one line naming it
and the command that resumes; a step that cannot end within run.preemption_grace_s (a rank
stopped with SIGSTOP) ends the run at the deadline, without a new checkpoint. The signal may
reach the whole job: the driver's process group (a terminal, `timeout`) spares the local
cluster, which lives in its own session; every process of the job (Slurm) stops Ray too, and
the driver still exits 143 with the line at once."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest
import waits
from tiny_job import IDLE_S, finish, metrics_by_step, start_and_wait_for, train_command

pytestmark = pytest.mark.functional

COMMON = [
    "dapo.max_num_steps=1000",
    "sft_warmup.num_steps=30",
    "dapo.dynamic_sampling.max_gen_batches=0",
    "checkpointing.save_period=1000",  # no periodic save: the preemption's is the one
    "validation.val_period=0",
    "validation.val_at_start=false",
    "logger.progress_bar=false",
    "logger.plots=false",
    "checkpointing.export_hf=false",
]


def _start(run_dir: Path, *extra: str):
    """The tiny job, returned once it has logged its first step."""
    metrics = run_dir / "metrics.jsonl"
    cmd = train_command(run_dir, run_dir.parent / "model", *COMMON, *extra)
    proc = start_and_wait_for(cmd, metrics, capture=True)
    waits.wait_until(
        lambda: proc.poll() is not None or (metrics.exists() and metrics.read_text().strip()),
        what="the first step's metrics", idle_s=IDLE_S, progress=waits.files_progress(run_dir),
    )  # fmt: skip
    if proc.poll() is not None:
        raise AssertionError(f"the job logged no step: {finish(proc)[-3000:]}")
    return proc


def _gone(processes: list[psutil.Process], what: str) -> list[psutil.Process]:
    """Those of processes still running once each stopped exiting for a while."""
    return waits.wait_exited(processes, what=what, idle_s=30)


def _workers(proc) -> list[psutil.Process]:
    """This job's policy ranks (other jobs on the machine may run some too)."""
    return [
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "PolicyWorker" in " ".join(p.cmdline())
    ]


def test_sigterm_saves_at_the_step_end_and_exits_143_with_a_resume_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "run.preemption_grace_s=120")
    workers = _workers(proc)
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # the driver only, as ray.sub forwards it
    output = finish(proc, "the exit after SIGTERM")
    seconds = time.monotonic() - started
    assert proc.returncode == 143, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    last = max(metrics_by_step(run_dir))
    step_dir = run_dir / "checkpoints" / f"step_{last:06d}"
    line = next(x for x in output.splitlines() if x.startswith("preempted:"))
    assert line == (
        f"preempted: SIGTERM; saved step {last}; the last checkpoint is {step_dir}; "
        f"`{line.split('`')[1]}` resumes from it"
    ), line
    # The tool as a path that runs (shared/commands.py): .venv/bin/dapo-train here.
    assert re.match(r"\S*/dapo-train --config", line.split("`")[1]), line
    assert (step_dir / "complete.json").is_file()
    assert seconds < waits.scaled(120), f"{seconds:.0f} s from SIGTERM to exit"
    alive = _gone(workers, "the policy workers' exit")
    assert alive == [], f"policy workers still running after the exit: {alive}"


def test_a_step_that_cannot_end_in_the_grace_period_stops_at_the_deadline(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "run.preemption_grace_s=8")
    stopped = _workers(proc)[-1].pid
    os.kill(stopped, signal.SIGSTOP)  # this rank never reaches the end of its step
    try:
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        output = finish(proc, "the exit at the grace period's end")
        seconds = time.monotonic() - started
    finally:
        if psutil.pid_exists(stopped):
            os.kill(stopped, signal.SIGKILL)
    assert proc.returncode == 143, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    line = next(x for x in output.splitlines() if x.startswith("preempted:"))
    assert line.startswith(
        "preempted: SIGTERM; no safe point within run.preemption_grace_s = 8 s, so the "
        "workers were stopped without a new checkpoint; no checkpoint was saved yet; "
    ), line
    # At least the grace period (a clock), at most that plus the stop (work, scaled).
    assert 8 <= seconds < 8 + waits.scaled(52), f"{seconds:.0f} s from SIGTERM to exit"
    assert not (run_dir / "checkpoints").exists() or not list(
        (run_dir / "checkpoints").glob("step_*")
    )


def _ray_processes(proc) -> list[psutil.Process]:
    """The driver's descendants: its local cluster's GCS, raylet and workers."""
    return psutil.Process(proc.pid).children(recursive=True)


def test_sigterm_to_the_whole_process_group_still_saves_and_exits_143(tmp_path):
    """A terminal's, `timeout`'s or `kill -TERM -PGID`'s signal reaches every process of
    the driver's group: the local cluster's node processes live in their own session
    (controller/actors/cluster.py), so the step's checkpoint completes and the driver exits 143
    with the resume line, without waiting on a dead GCS."""
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "run.preemption_grace_s=60")
    pgid = os.getpgid(proc.pid)
    assert pgid == proc.pid  # the job leads its own group: the signal reaches only it
    in_group = [p for p in _ray_processes(proc) if os.getpgid(p.pid) == pgid]
    assert in_group == [], f"Ray processes in the driver's process group: {in_group}"
    started = time.monotonic()
    os.killpg(pgid, signal.SIGTERM)
    output = finish(proc, "the exit after SIGTERM to the group")
    seconds = time.monotonic() - started
    assert proc.returncode == 143, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "Failed to connect to GCS" not in output, output[-3000:]
    last = max(metrics_by_step(run_dir))
    step_dir = run_dir / "checkpoints" / f"step_{last:06d}"
    line = next(x for x in output.splitlines() if x.startswith("preempted:"))
    assert line.startswith(
        f"preempted: SIGTERM; saved step {last}; the last checkpoint is {step_dir}; `"
    ), line
    assert re.search(r"; `\S*/dapo-train --config", line), line
    assert (step_dir / "complete.json").is_file()
    assert seconds < waits.scaled(60), f"{seconds:.0f} s from SIGTERM to exit"


def test_sigterm_to_every_process_of_the_job_exits_143_without_waiting_for_ray(tmp_path):
    """Slurm at a preemption or the time limit signals every process of the job: the GCS,
    raylet and workers stop at once (Ray's own SIGTERM handlers), so the step cannot end;
    the driver still exits 143 with the resume line, and never waits out Ray's 60 s GCS
    reconnect (controller/actors/preemption.py's exit watchdog)."""
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "run.preemption_grace_s=60")
    everyone = [psutil.Process(proc.pid), *_ray_processes(proc)]
    started = time.monotonic()
    for p in everyone:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    output = finish(proc, "the exit after SIGTERM to every process")
    seconds = time.monotonic() - started
    assert proc.returncode == 143, output[-3000:]
    assert "Failed to connect to GCS" not in output, output[-3000:]
    line = next(x for x in output.splitlines() if x.startswith("preempted:"))
    assert line.startswith("preempted: SIGTERM; "), line
    assert line.endswith("resumes from it") or "no checkpoint was saved yet" in line, line
    assert seconds < waits.scaled(40), f"{seconds:.0f} s from SIGTERM to exit"
    alive = _gone(everyone[1:], "the Ray processes' exit")
    assert alive == [], f"Ray processes still running after the exit: {alive}"
