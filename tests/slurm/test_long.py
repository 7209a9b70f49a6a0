"""The longer real-Slurm set (`bash scripts/test.sh --slurm-long`): a time limit and a dead
slurmd, each a few minutes of wall time (Slurm checks time limits every 30-60 s, and marks
a node whose slurmd stopped answering DOWN after SlurmdTimeout, 20 s here)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm_long

STATE = Path(os.environ.get("SLURM_LOCAL_DIR", "/tmp/dapo-slurm"))


def _started(job) -> float:
    """When the current attempt's Ray came up (monotonic clock of this test)."""
    job.wait_line("Ray cluster is up", idle_s=120)
    return time.monotonic()


def test_time_limit_warning_saves_requeues_and_resumes(new_job):
    """`--time=3 --requeue` with the script's own --signal=B:TERM@120: the warning comes
    120-180 s before the limit (Slurm may send it up to 60 s early), not at the start as
    the old @300 did for a job this short; dapo-train saves the step it is in, ray.sub
    requeues the job (Slurm itself would not requeue a 143 or a timeout) and the second
    attempt resumes from it and finishes."""
    job = new_job(nodes=1)
    steps_file = job.root / "max_steps"
    steps_file.write_text("100000")
    job.submit(job.command(steps=f"$(cat {steps_file})"), "--time=3", "--requeue")
    up = _started(job)
    job.wait_line("preempted: SIGTERM", idle_s=200)
    warned_after = time.monotonic() - up
    step = job.assert_saved_current_step()
    steps_file.write_text(str(step + 2))
    job.wait_line("requeued job", idle_s=30)
    job.wait_line("[resume] ", idle_s=150)
    job.wait_end(idle_s=120)
    info = job.info()
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1")
    assert job.final_record()["DerivedExitCode"] == "0:0", job.completions()
    assert warned_after > 30, f"the time-limit warning came {warned_after:.0f} s after the start"
    print(f"[long] time-limit warning {warned_after:.0f} s after Ray was up; saved step {step}")


def _slurmd_pid(node: str) -> int:
    return int((STATE / f"slurmd-{node}.pid").read_text())


def _reboot_node(job_id: str, node: str) -> None:
    """A node coming back from a reboot: nothing of the job left there (its step's
    slurmstepd, Ray's processes), then its slurmd started again. With slurmd killed
    alone they keep running, and a requeued attempt with the same step ids would meet them
    (Slurm stops them only once that slurmd is back, possibly in the new attempt's steps)."""
    doomed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        on_node = f"SLURM_JOB_ID={job_id}".encode() in environ and (
            f"SLURMD_NODENAME={node}".encode() in environ
        )
        if on_node or cmdline.startswith(f"slurmstepd: [{job_id}.0]".encode()):  # n2's Ray
            doomed.append(int(entry.name))
    subprocess.run(["kill", "-KILL", *map(str, doomed)], check=False)
    subprocess.run(["slurmd", "-f", os.environ["SLURM_CONF"], "-N", node], check=True)


def test_a_dead_slurmd_fails_the_node_and_the_job_requeues_and_resumes(new_job):
    """slurmd of n2 killed mid-run: Slurm marks n2 DOWN and the job NODE_FAIL, and requeues
    it (--requeue); dapo-train, on n1, gets the job's SIGTERM and saves its step. Once n2
    is back (rebooted: ReturnToService=2) the job runs again and resumes from that step."""
    job = new_job(nodes=2)
    job.submit(job.command("checkpointing.save_period=1000", steps=100000), "--requeue")
    job.wait_steps(2)
    subprocess.run(["kill", "-KILL", str(_slurmd_pid("n2"))], check=True)
    try:
        job.wait_for(
            "NODE_FAIL requeue",
            lambda: "DUE TO NODE FAILURE" in job.output() and "COMMAND exited" in job.output(),
            idle_s=150,
        )
        step = job.assert_saved_current_step()  # before the next attempt logs its steps
    finally:
        _reboot_node(job.job_id, "n2")
    job.wait_line("[resume] ", idle_s=240)
    job.wait_steps(step + 1)
    subprocess.run(["scancel", job.job_id], check=True)
    job.wait_end(idle_s=90)
    out = job.output()
    resumed = out.split("attempt 1:", 1)[1]
    assert f"[resume] {job.run_dir / 'checkpoints' / f'step_{step:06d}'}" in resumed, resumed
    print(f"[long] NODE_FAIL: saved step {step}, requeued, resumed from it")
