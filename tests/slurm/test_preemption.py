"""Every SIGTERM a Slurm job can receive, under a real Slurm: dapo-train saves the step it is
in and prints the resume line, the job ends 143 (or CANCELLED after a plain scancel), and
nothing of it is left. A real srun answers SIGTERM by SIGKILLing its tasks, so ray.sub runs
the head's Ray and dapo-train in the batch shell: no srun stands between them and the
signal (the old ray.sub lost the step on 2 nodes, where it ran dapo-train through srun)."""

from __future__ import annotations

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
    return job.wait_end(timeout=90)


@pytest.mark.parametrize("nodes", [1, 2])
def test_sigterm_to_the_batch_shell_saves_the_step(new_job, nodes):
    """--signal=B:TERM@N at the time limit, `scancel --batch --signal=TERM`, a preemption
    with PreemptParameters=send_user_signal: the batch shell alone gets SIGTERM."""
    job = new_job(nodes=nodes)
    job.submit(job.command())
    seconds = _preempt(job, "--batch", "--signal=TERM")
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "143:0"), job.explain()
    job.assert_saved_current_step()
    assert "SIGTERM: passed on to COMMAND" in job.output()
    assert seconds < 30, f"{seconds:.0f} s from SIGTERM to the end: KillWait is 30 s"


def test_sigterm_to_every_process_with_full_saves_the_step(new_job):
    """`scancel --signal=TERM --full`: the batch shell, its children and every step. On one
    node no srun is left to turn it into a SIGKILL (the relay's own is, harmlessly)."""
    job = new_job(nodes=1)
    job.submit(job.command())
    _preempt(job, "--full", "--signal=TERM")
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "143:0"), job.explain()
    job.assert_saved_current_step()


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
