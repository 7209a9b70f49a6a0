"""A node lost mid-run (issue 30, case 11), on a multi-node Ray cluster on one CPU machine.

``ray.cluster_utils.Cluster`` starts a head without CPUs (the controller's node: no worker
lands there) and worker nodes; dapo-train joins it through RAY_ADDRESS. The cluster keeps
Ray's default health check (slurm/ray.sub sets none either: Ray 2.60 checks every 3 s, 10 s
deadline, a node dead after 5 failures), so the controller sees the workers die some 15 s
before the GCS marks their node dead. Once the run has saved a checkpoint, the node holding
the policy ranks is removed for real: its raylet and every worker process on it killed
(``remove_node(allow_graceful=False)``, no goodbye to the GCS, as when a machine dies). Then:

* the other node still holds the layout (cluster.num_nodes = 1): the run restarts there
  from its last checkpoint, says which node was lost, and finishes;
* it does not (cluster.num_nodes = 2, one rank per node): the run stops with one line
  naming the lost node and the command that resumes, as soon as the GCS marks the node
  dead (the health check's time plus a few seconds), instead of restarting and waiting
  for a placement group the cluster can no longer give;
* a 1-node cluster loses its only worker node: the same line, never a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import waits
from ray.cluster_utils import Cluster
from tiny_job import finish, job_env, metrics_by_step, start_and_wait_for, train_command

pytestmark = pytest.mark.functional

RUN = [
    "sft_warmup.num_steps=0",
    "dapo.num_prompts_per_step=8",
    "policy.train_global_batch_size=64",
    "dapo.dynamic_sampling.max_gen_batches=0",
    "checkpointing.save_period=1",
    "checkpointing.export_hf=false",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "logger.progress_bar=false",
    "logger.plots=false",
    "run.max_restarts=1",
]


# Ray 2.60's defaults (src/ray/common/ray_config_def.h): a killed raylet refuses every
# check at once, so the GCS marks its node dead within period x threshold (+ one period).
PERIOD_S, THRESHOLD = 3.0, 5


def stop_bound_s() -> float:
    """From the node's removal to the run's exit: the GCS's verdict (Ray's clock), then
    stopping the workers and the CLI's exit (a few seconds of work, as slow as the machine)."""
    return PERIOD_S * (THRESHOLD + 1) + waits.scaled(12.0)


def _cluster(cpus_per_node: int, worker_nodes: int = 2) -> Cluster:
    # Ray's default health check. The workers get the driver's priority, as in dapo-train's
    # own local cluster (controller/actors/cluster.py): at Ray's default nice 15, any other work on
    # the machine starves the ranks (4% of a core each beside two busy loops).
    fake = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0, "include_dashboard": False,
            "_system_config": {"worker_niceness": 0},
        },
    )  # fmt: skip
    for _ in range(worker_nodes):
        # Not Ray's own 30 s wait per node: a busy machine starts a raylet slower.
        fake.add_node(wait=False, num_cpus=cpus_per_node, object_store_memory=80 * 1024 * 1024)
    fake.wait_for_nodes(timeout=waits.scaled(60.0))
    return fake


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    yield job_env()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def policy_node(fake: Cluster) -> Any:
    """The worker node whose raylet started the (first) policy rank."""
    raylets = {n.all_processes["raylet"][0].process.pid: n for n in fake.worker_nodes}
    for p in psutil.process_iter(["cmdline"]):
        if "ray::PolicyWorker" in " ".join(p.info["cmdline"] or ()) and p.ppid() in raylets:
            return raylets[p.ppid()]
    raise AssertionError("no policy rank on a worker node")


def _run_and_remove_node(
    fake: Cluster, tmp: Path, env: dict[str, str], *overrides: str
) -> tuple[subprocess.CompletedProcess[str], str, float]:
    """Start the run, remove the node of its policy ranks once step 1 is saved; the
    finished process, the lost node's label and the seconds from the removal to the exit."""
    run_dir = tmp / "run"
    cmd = train_command(run_dir, tmp / "model", *RUN, *overrides)
    saved = run_dir / "checkpoints" / "step_000001" / "complete.json"
    proc = start_and_wait_for(cmd, saved, capture=True, env={**env, "RAY_ADDRESS": fake.address})
    try:
        assert saved.exists(), finish(proc)[-6000:]
        node = policy_node(fake)
        fake.remove_node(node, allow_graceful=False)
        removed = time.monotonic()
        out = finish(proc, "the run's exit after the node's loss")
        seconds = time.monotonic() - removed
        print(f"[test] from the node's removal to the run's exit: {seconds:.1f} s")
    finally:
        if proc.poll() is None:  # before the fix: waiting for a placement group
            os.killpg(proc.pid, signal.SIGKILL)
    label = f"{node.node_ip_address}/{node.node_id[:8]}"  # as the run's lines name it
    return subprocess.CompletedProcess(cmd, proc.returncode, out), label, seconds


def _tail(out: str) -> str:
    """The run's last lines without the raylet's log dump Ray prints for a killed raylet."""
    return "\n".join(x for x in out.splitlines() if "[state-dump]" not in x)[-6000:]


def test_node_lost_restarts_on_the_nodes_left(tmp_path, env):
    fake = _cluster(cpus_per_node=2)  # both ranks on one node; the other can take them
    try:
        done, lost, _ = _run_and_remove_node(fake, tmp_path, env, "dapo.max_num_steps=3")
    finally:
        fake.shutdown()
    out = done.stdout
    assert done.returncode == 0, _tail(out)
    (restart,) = [x for x in out.splitlines() if x.startswith("[restart")]
    assert restart.startswith("[restart 1/1] policy rank "), restart
    assert f"(node {lost} lost; 1 node(s) with CPUs left" in restart, restart
    assert "Traceback" not in out, out[-3000:]
    assert sorted(metrics_by_step(tmp_path / "run")) == [1, 2, 3]


def _assert_stopped(done: subprocess.CompletedProcess[str], lost: str, counted: str) -> None:
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    (error,) = [x for x in out.splitlines() if x.startswith("error:")]
    assert error.startswith(f"error: node {lost} was lost (policy rank "), error
    assert f"no longer fits the layout ({counted})" in error, error
    assert error.endswith("resumes from it"), error
    assert "Traceback" not in out and "[restart" not in out, out[-3000:]


def test_node_lost_stops_with_one_line_when_the_layout_no_longer_fits(tmp_path, env):
    fake = _cluster(cpus_per_node=1)  # one rank per node
    try:
        done, lost, seconds = _run_and_remove_node(
            fake, tmp_path, env, "dapo.max_num_steps=1000", "cluster.num_nodes=2",
            "cluster.gpus_per_node=1",
        )  # fmt: skip
    finally:
        fake.shutdown()
    _assert_stopped(done, lost, "1 node(s) with CPUs left, cluster.num_nodes = 2")
    assert seconds < stop_bound_s(), seconds


def test_one_node_cluster_losing_its_worker_node_stops_with_one_line(tmp_path, env):
    fake = _cluster(cpus_per_node=2, worker_nodes=1)  # the head holds no CPUs
    try:
        done, lost, seconds = _run_and_remove_node(fake, tmp_path, env, "dapo.max_num_steps=1000")
    finally:
        fake.shutdown()
    _assert_stopped(done, lost, "0 node(s) with CPUs left, cluster.num_nodes = 1")
    assert seconds < stop_bound_s(), seconds
