"""Every SIGTERM a Slurm job can receive, under a real Slurm: dapo-train saves the step it is
in and prints the resume line, the job ends 143 (or CANCELLED after a plain scancel), and
nothing of it is left. A real srun answers SIGTERM by SIGKILLing its tasks, so ray.sub runs
the head's Ray and dapo-train in the batch shell: no srun stands between them and the
signal (the old ray.sub lost the step on 2 nodes, where it ran dapo-train through srun)."""

from __future__ import annotations

import re
import subprocess

import pytest

pytestmark = pytest.mark.slurm

STEPS_BEFORE_SIGNAL = 2


def _scancel(job, *flags: str) -> None:
    subprocess.run(["scancel", *flags, job.job_id], check=True)


def _preempt(job, *flags: str) -> float:
    """Signal the job after STEPS_BEFORE_SIGNAL steps; seconds from the signal to its end."""
    job.wait_steps(STEPS_BEFORE_SIGNAL)
    _scancel(job, *flags)
    return job.wait_end(idle_s=90)


def test_sigterm_to_the_batch_shell_on_two_nodes_saves_the_step(new_job):
    """--signal=B:TERM@N at the time limit, `scancel --batch --signal=TERM`, a preemption
    with PreemptParameters=send_user_signal: the batch shell alone gets SIGTERM. Without
    --requeue the job ends there, 143."""
    job = new_job(nodes=2)
    job.submit(job.command())
    seconds = _preempt(job, "--batch", "--signal=TERM")
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "143:0"), job.explain()
    job.assert_saved_current_step()
    assert "SIGTERM: passed on to COMMAND" in job.output()
    assert seconds < 30, f"{seconds:.0f} s from SIGTERM to the end: KillWait is 30 s"


def test_sigterm_to_the_batch_shell_with_requeue_requeues_and_resumes(new_job):
    """The same signal on a job submitted with --requeue: ray.sub requeues the job itself
    once the step is saved (Slurm requeues neither a 143 nor a timeout), the next attempt
    resumes from that step and the job ends COMPLETED, 0:0, DerivedExitCode 0:0."""
    job = new_job(nodes=1)
    # The step count is read as each attempt starts (bash -c runs COMMAND's $(cat ...)):
    # the first attempt runs until the signal, the second ends 2 steps after its resume.
    steps_file = job.root / "max_steps"
    steps_file.write_text("1000")
    job.submit(job.command(steps=f"$(cat {steps_file})"), "--requeue")
    job.wait_steps(STEPS_BEFORE_SIGNAL)
    _scancel(job, "--batch", "--signal=TERM")
    job.wait_line("requeued job", idle_s=60)
    step = job.assert_saved_current_step()
    steps_file.write_text(str(step + 2))
    job.assert_resumed_after_requeue(step, first=job.output())


def test_sigterm_to_every_process_with_full_saves_the_step_on_one_node(new_job):
    """`scancel --signal=TERM --full`: the batch shell, its children and every step. On one
    node no srun stands before Ray (the relay's own turns it into a SIGKILL, harmlessly)."""
    job = new_job(nodes=1)
    job.submit(job.command())
    _preempt(job, "--full", "--signal=TERM")
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "143:0"), job.explain()
    job.assert_saved_current_step()


def test_sigterm_to_every_process_with_full_on_two_nodes_says_so_in_one_line(new_job):
    """With --full on 2 nodes Slurm signals the srun that holds the other node's Ray, and a
    real srun SIGKILLs its tasks at once: no time to save. The run says so in one line,
    naming the last complete checkpoint, and ends at once instead of at KillWait."""
    job = new_job(nodes=2)
    job.submit(job.command("checkpointing.save_period=1"))
    seconds = _preempt(job, "--full", "--signal=TERM")
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "143:0"), job.explain()
    out = job.output()
    lines = [x for x in out.splitlines() if x.startswith("preempted: SIGTERM;")]
    assert len(lines) == 1 and "the last checkpoint is " in lines[0], job.explain()
    assert re.search(r"`\S*/dapo-train --config", lines[0]) and "Traceback" not in out, lines[0]
    assert seconds < 25, f"{seconds:.0f} s from the signal to the end"


def test_sigterm_to_the_steps_only_reaches_the_driver_through_the_relay(new_job):
    """`scancel --signal=TERM` without flags signals the job steps, not the batch shell: the
    Ray steps keep running (SIGTERM blocked) and the relay step passes it on."""
    job = new_job(nodes=2)
    job.submit(job.command())
    _preempt(job, "--signal=TERM")
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "143:0"), job.explain()
    job.assert_saved_current_step()
    logs = job.root / "logs"
    assert "passed on to the batch shell" in (logs / "relay.log").read_text()
    assert "SIGTERM: Ray keeps running" in (logs / "ray-n2.log").read_text()


def test_plain_scancel_on_two_nodes_saves_the_step(new_job):
    """`scancel JOB`: SIGTERM to every process of the job, SIGKILL after KillWait (30 s)."""
    job = new_job(nodes=2)
    job.submit(job.command())
    seconds = _preempt(job)
    assert job.info()["JobState"] == "CANCELLED", job.explain()
    job.assert_saved_current_step()
    assert seconds < 30, f"{seconds:.0f} s: the SIGKILL after KillWait came first"
