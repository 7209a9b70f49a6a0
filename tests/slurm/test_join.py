"""How the cluster forms under a real Slurm: a node whose Ray fails to start fails the job
at once, a node that never joins is named when JOIN_TIMEOUT_S runs out, and a job without
COMMAND keeps the cluster up, attachable with the lines it prints (the token ray.sub made
included), until it is cancelled. Failures are injected with SETUP_COMMAND, which runs on
each node before `ray start`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import waits

pytestmark = pytest.mark.slurm

ON_N2 = 'if [[ "${SLURMD_NODENAME:-}" == n2 ]]; then '


def _errors(job) -> list[str]:
    return [x for x in job.output().splitlines() if "ERROR:" in x]


def test_a_node_whose_ray_fails_to_start_fails_the_job_at_once(new_job):
    job = new_job(nodes=2)
    job.submit(job.command(), SETUP_COMMAND=ON_N2 + 'echo "injected on n2" >&2; exit 1; fi')
    seconds = job.wait_end(idle_s=60)
    assert (job.info()["JobState"], job.info()["ExitCode"]) == ("FAILED", "1:0"), job.explain()
    assert [e.split("ERROR: ")[1] for e in _errors(job)] == [
        "node n2 failed to start Ray (see above)"
    ]
    assert "injected on n2" in job.output() and seconds < waits.scaled(30), job.explain()


def test_a_node_that_never_joins_is_named_at_the_join_timeout(new_job):
    job = new_job(nodes=2)
    # 10 s when quiet: n1 must have joined by then, on a busy machine too.
    join_s = round(waits.scaled(10))
    job.submit(
        job.command(), SETUP_COMMAND=ON_N2 + "exec sleep 600; fi", JOIN_TIMEOUT_S=str(join_s)
    )
    job.wait_end(idle_s=60)
    assert job.info()["JobState"] == "FAILED", job.explain()
    errors = _errors(job)
    assert len(errors) == 1 and f"timed out after {join_s}s" in errors[0], job.explain()
    assert "missing nodes: n2;" in errors[0] and "join-check.log" in errors[0], errors[0]


ATTACH = "import ray; ray.init(); print('ALIVE_NODES', sum(n['Alive'] for n in ray.nodes()))"


def test_without_command_the_cluster_stays_up_and_attachable_until_cancelled(new_job):
    job = new_job(nodes=2)
    job.submit(None)
    job.wait_line("then: export RAY_ADDRESS=", idle_s=90)
    line = next(x for x in job.output().splitlines() if "then: export " in x)
    attach_env = dict(re.findall(r"(\w+)=(\S+)", line.split("then: export ", 1)[1]))
    assert attach_env["RAY_AUTH_MODE"] == "token", line  # the token ray.sub made, 0600
    env = {k: v for k, v in job.environment(None).items() if not k.startswith("RAY_AUTH")}
    attach = waits.run([sys.executable, "-c", ATTACH], idle_s=60, env={**env, **attach_env})
    assert "ALIVE_NODES 2" in attach.stdout, attach.stderr[-3000:]
    subprocess.run(["scancel", job.job_id], check=True)
    job.wait_end(idle_s=60)
    assert job.info()["JobState"] == "CANCELLED", job.explain()
