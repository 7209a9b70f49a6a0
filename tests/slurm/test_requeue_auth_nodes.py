"""Requeue, authentication and a lost node under a real Slurm.

- `scontrol requeue` of a running job (submitted with --requeue): dapo-train saves the step
  it is in, Slurm starts the job again, the new attempt resumes from that step, and the
  output file still holds the first attempt's lines (ray.sub's --open-mode=append; without
  it Slurm truncates slurm-%j.out at the second start).
- Authentication: RAY_AUTH_MODE unset is the happy paths' case (test_happy.py); a driver
  whose mode differs from the cluster's is refused in seconds, in one line naming the
  variable (Ray's own join retries 20 s and ends in a ConnectionError traceback; the old
  ray.sub's join check waited JOIN_TIMEOUT_S); RAY_AUTH_MODE=token without a token is
  refused by ray.sub before Ray starts.
- A raylet killed on one node of two: dapo-train stops with one line naming the lost node
  and the resume command, and the job leaves nothing behind.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import waits

pytestmark = pytest.mark.slurm

STEPS_BEFORE_REQUEUE = 2


def test_scontrol_requeue_resumes_from_the_saved_step_keeping_the_first_output(new_job):
    job = new_job(nodes=1)
    # A tiny step takes 0.15 s: the step count is read when each attempt starts (bash -c
    # runs COMMAND's $(cat ...) then), so the first attempt runs until the requeue and the
    # second one ends a few steps after the one it resumes from.
    steps_file = job.root / "max_steps"
    steps_file.write_text("1000")
    job.submit(job.command(steps=f"$(cat {steps_file})"), "--requeue")
    job.wait_steps(STEPS_BEFORE_REQUEUE)
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    job.wait_line("preempted: SIGTERM", idle_s=60)
    first = job.output()
    saved = [x for x in first.splitlines() if x.startswith("preempted: SIGTERM; saved step ")]
    assert len(saved) == 1, job.explain()
    step = int(saved[0].split("saved step ")[1].split(";")[0])
    steps_file.write_text(str(step + 2))
    out = job.assert_resumed_after_requeue(step, first)
    before, after = out.split("attempt 1:", 1)
    assert "attempt 0:" in before, out[-4000:]
    assert f"[resume] {job.run_dir / 'checkpoints' / f'step_{step:06d}'}" in after, after
    assert "Traceback" not in out, out[-4000:]


def test_a_driver_with_another_auth_mode_is_refused_at_once_in_one_line(new_job):
    job = new_job(nodes=1)
    # COMMAND drops the mode ray.sub exported: as a driver started by hand with it unset.
    job.submit("env -u RAY_AUTH_MODE -u RAY_AUTH_TOKEN " + job.command())
    job.wait_end(idle_s=120)
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "1:0"), job.explain()
    out = job.output()
    errors = [x for x in out.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and "RAY_AUTH_MODE=unset" in errors[0], job.explain()
    assert "refused this driver's authentication" in errors[0], errors[0]
    assert "Traceback" not in out, out[-4000:]
    seconds = _seconds_between(out, "running COMMAND", "COMMAND exited")
    assert seconds < waits.scaled(15), out[-3000:]


def test_token_mode_without_a_token_is_refused_before_ray_starts(new_job, tmp_path):
    job = new_job(nodes=1)
    job.submit(job.command(), RAY_AUTH_MODE="token", HOME=str(tmp_path))
    seconds = job.wait_end(idle_s=60)
    assert (job.info()["JobState"], job.info()["ExitCode"]) == ("FAILED", "1:0"), job.explain()
    lines = [x for x in job.output().splitlines() if "ERROR:" in x]
    assert len(lines) == 1 and "RAY_AUTH_MODE=token but no token" in lines[0], job.explain()
    assert "RAY_AUTH_TOKEN" in lines[0] and seconds < waits.scaled(15)


def _seconds_between(out: str, first: str, second: str) -> int:
    """Seconds between the ray.sub log lines holding first and second ([ray.sub HH:MM:SS])."""

    def at(text: str) -> int:
        line = next(x for x in out.splitlines() if x.startswith("[ray.sub ") and text in x)
        h, m, s = (int(v) for v in line[9:17].split(":"))
        return h * 3600 + m * 60 + s

    return at(second) - at(first)


def _raylet_of(job_id: str, node: str) -> int:
    """The raylet Slurm started for this job on that node (its environment says both)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if (entry / "comm").read_text().strip() != "raylet":
                continue
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ and (
            f"SLURMD_NODENAME={node}".encode() in environ
        ):
            return int(entry.name)
    raise AssertionError(f"no raylet of job {job_id} on {node}")


def test_a_raylet_killed_on_one_node_of_two_stops_with_one_line(new_job):
    job = new_job(nodes=2)
    job.submit(job.command())
    job.wait_steps(1)
    subprocess.run(["kill", "-KILL", str(_raylet_of(job.job_id, "n2"))], check=True)
    job.wait_end(idle_s=120)
    info = job.info()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "1:0"), job.explain()
    out = job.output()
    errors = [x for x in out.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: node "), job.explain()
    error = errors[0]
    assert " was lost " in error and re.search(r"`\S*/dapo-train --config ", error), error
    assert "Traceback" not in out, out[-4000:]
