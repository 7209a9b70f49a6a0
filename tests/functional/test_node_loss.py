"""A node lost mid-run (issue 30, case 11), on a multi-node Ray cluster on one CPU machine.

``ray.cluster_utils.Cluster`` starts a head without CPUs (the controller's node: no worker
lands there) and two worker nodes; dapo-train joins it through RAY_ADDRESS. Once the run
has saved a checkpoint, the node holding the policy ranks is removed for real: its raylet
and every worker process on it killed (``remove_node(allow_graceful=False)``, no goodbye to
the GCS, as when a machine dies). Then:

* the other node still holds the layout (cluster.num_nodes = 1): the run restarts there
  from its last checkpoint, says which node was lost, and finishes;
* it does not (cluster.num_nodes = 2, one rank per node): the run stops at once with one
  line naming the lost node and the command that resumes, instead of waiting for a
  placement group the cluster can no longer give.
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
from ray.cluster_utils import Cluster
from tiny_job import job_env, metrics_by_step, train_command

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


def _cluster(cpus_per_node: int) -> Cluster:
    # Node deaths detected within ~2 s (Ray's default: about 30 s without heartbeats).
    system = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    fake = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": system},
    )
    for _ in range(2):
        fake.add_node(num_cpus=cpus_per_node, object_store_memory=80 * 1024 * 1024)
    fake.wait_for_nodes()
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
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Start the run, remove the node of its policy ranks once step 1 is saved; the
    finished process and the lost node's label."""
    run_dir = tmp / "run"
    cmd = train_command(run_dir, tmp / "model", *RUN, *overrides)
    proc = subprocess.Popen(
        cmd, env={**env, "RAY_ADDRESS": fake.address}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "step_000001" / "complete.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.2)
        node = policy_node(fake)
        fake.remove_node(node, allow_graceful=False)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # before the fix: waiting for a placement group
            os.killpg(proc.pid, signal.SIGKILL)
    label = f"{node.node_ip_address}/{node.node_id[:8]}"  # as the run's lines name it
    return subprocess.CompletedProcess(cmd, proc.returncode, out), label


def test_node_lost_restarts_on_the_nodes_left(tmp_path, env):
    fake = _cluster(cpus_per_node=2)  # both ranks on one node; the other can take them
    try:
        done, lost = _run_and_remove_node(fake, tmp_path, env, "dapo.max_num_steps=3")
    finally:
        fake.shutdown()
    out = done.stdout
    assert done.returncode == 0, out[-3000:]
    (restart,) = [x for x in out.splitlines() if x.startswith("[restart")]
    assert restart.startswith("[restart 1/1] policy rank "), restart
    assert f"(node {lost} lost; 1 node(s) with CPUs left" in restart, restart
    assert "Traceback" not in out, out[-3000:]
    assert sorted(metrics_by_step(tmp_path / "run")) == [1, 2, 3]


def test_node_lost_stops_with_one_line_when_the_layout_no_longer_fits(tmp_path, env):
    fake = _cluster(cpus_per_node=1)  # one rank per node
    try:
        started = time.monotonic()
        done, lost = _run_and_remove_node(
            fake, tmp_path, env, "dapo.max_num_steps=1000", "cluster.num_nodes=2",
            "cluster.gpus_per_node=1",
        )  # fmt: skip
        seconds = time.monotonic() - started
    finally:
        fake.shutdown()
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    (error,) = [x for x in out.splitlines() if x.startswith("error:")]
    assert error.startswith(f"error: node {lost} was lost (policy rank "), error
    assert "no longer fits the layout (1 node(s) with CPUs left, cluster.num_nodes = 2)" in error
    assert error.endswith("resumes from it"), error
    assert "Traceback" not in out and "[restart" not in out, out[-3000:]
    assert seconds < 120
