"""Happy paths of `sbatch slurm/ray.sub` under a real Slurm: the tiny recipe on 1 and 2 nodes
ends COMPLETED with exit code 0 and DerivedExitCode 0 (the old ray.sub's teardown left 143
there: its Ray steps exited 143 when stopped), with the authentication a new user has:
RAY_AUTH_MODE unset, and on 2 nodes the README's shared RAY_AUTH_TOKEN (the old ray.sub
hung there until JOIN_TIMEOUT_S: the head took the token, the workers sent none). Ray's
workers run at the driver's priority (ray.sub sets RAY_worker_niceness; at Ray's default of
15 the ranks starve beside any other work on a node)."""

from __future__ import annotations

import secrets
import sys

import pytest

pytestmark = pytest.mark.slurm

STEPS = 2
# A Ray task's niceness, printed by a driver on the job's cluster before the run.
PROBE = (
    f'{sys.executable} -c "import os, ray; ray.init(); '
    "print('worker niceness', ray.get(ray.remote(lambda: os.nice(0)).remote()))\""
)


@pytest.mark.parametrize("nodes", [1, 2])
def test_tiny_recipe_completes_with_exit_code_0_everywhere(new_job, nodes):
    job = new_job(nodes=nodes)
    token = {"RAY_AUTH_TOKEN": secrets.token_hex(16)} if nodes == 2 else {}
    command = job.command("checkpointing.save_period=1", steps=STEPS)
    job.submit(f"{PROBE} && {command}", **token)
    job.wait_end()
    info = job.info()
    assert info["JobState"] == "COMPLETED", job.explain()
    assert info["ExitCode"] == "0:0", job.explain()
    record = job.final_record()
    assert record["DerivedExitCode"] == "0:0", (record, job.explain())
    assert job.last_step() == STEPS
    out = job.output()
    assert "Traceback" not in out, out[-4000:]
    assert (job.run_dir / "checkpoints" / f"step_{STEPS:06d}").is_dir()
    assert "auth token" in out  # the mode ray.sub settled for every node and the driver
    assert "worker niceness 0" in out, out[-4000:]
