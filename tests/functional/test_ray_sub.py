"""slurm/ray.sub with a fake Slurm (tests/functional/fake_slurm), for what the real Slurm of
tests/slurm cannot show on this machine: GPU counts (the fake nvidia-smi) and a different
network interface per node (the fake ip). Everything else runs under a real Slurm there.

The fake `srun` runs each job step as a local process in its own session and records the
session id, so after every case we can check that no process the job started is left
(Ray's workers change process group but not session). Two `ray start` processes on one
machine form a 2-node cluster; each advertises its Slurm node name as a custom resource.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import waits

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
FAKE_SLURM = Path(__file__).resolve().parent / "fake_slurm"
RAY_BIN = Path(sys.executable).parent / "ray"

CHECK_TWO_NODES = (
    f"{sys.executable} -c '"
    'import os, ray; ray.init(address=os.environ["RAY_ADDRESS"]); '
    'alive = [n for n in ray.nodes() if n["Alive"]]; '
    'print("ALIVE_NODES", len(alive)); assert len(alive) == 2\''
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is sid."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp session ...
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def job(tmp_path: Path):
    """Runs slurm/ray.sub under the fake Slurm; afterwards checks (and cleans) leftovers."""
    if not RAY_BIN.exists() or shutil.which("setsid") is None or shutil.which("pkill") is None:
        pytest.skip("needs the ray CLI next to the test's python, setsid and pkill")
    # Short: Ray's unix socket paths live under the temp dir and must stay < 108 bytes.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    sids_file = tmp_path / "sids"
    # ray.sub's own clock for the nodes to join: 60 s on a quiet machine, as long as the
    # same start takes here now (a test that fails fast must beat it by a margin).
    join_timeout_s = round(waits.scaled(60))

    def environment(command: str | None, **extra: str | None) -> dict[str, str]:
        """The job's environment; an extra set to None is removed from it."""
        env = dict(
            os.environ,
            PATH=f"{FAKE_SLURM}{os.pathsep}{os.environ.get('PATH', '')}",
            SLURM_JOB_ID="4242",
            SLURM_JOB_NODELIST="node[0-1]",
            GPUS_PER_NODE="0",
            CPUS_PER_NODE="1",
            RAY_AUTH_MODE="disabled",
            RAY_USAGE_STATS_ENABLED="0",
            RAY_PORT=str(_free_port()),
            HEAD_IP="127.0.0.1",
            RAY_TEMP_DIR=str(ray_tmp),
            RAY_START_ARGS="--object-store-memory=100000000",
            LOG_DIR=str(tmp_path / "logs"),
            PYTHON=sys.executable,
            RAY=str(RAY_BIN),
            JOIN_TIMEOUT_S=str(join_timeout_s),
            TEARDOWN_GRACE_S="15",
            FAKE_SRUN_SIDS=str(sids_file),
            FAKE_SRUN_GRACE_S="3",
        )
        env.pop("RAY_ADDRESS", None)
        env.pop("COMMAND", None)
        if command is not None:
            env["COMMAND"] = command
        for key, value in extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def run(command: str | None, **extra: str | None) -> subprocess.CompletedProcess:
        # Waited on by the job's output and logs: a job quiet for 90 s (scaled) is hung.
        return waits.run(
            ["bash", str(REPO / "slurm" / "ray.sub")], idle_s=90, what="ray.sub's exit",
            progress=waits.files_progress(tmp_path / "logs"), cwd=tmp_path,
            env=environment(command, **extra),
        )  # fmt: skip

    run.environment = environment
    run.join_timeout_s = join_timeout_s

    yield run

    sids = [int(x) for x in sids_file.read_text().split()] if sids_file.exists() else []
    assert sids, "the fake srun recorded no job steps"
    leftovers = {sid: _session_members(sid) for sid in sids}
    leftovers = {sid: pids for sid, pids in leftovers.items() if pids}
    for pids in leftovers.values():  # clean up what we started, by pid, before failing
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not leftovers, f"processes left behind by the job (session: pids): {leftovers}"


def _explain(result: subprocess.CompletedProcess) -> str:
    return f"rc={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def _gpu_env(job, gpus_per_node: int, **extra: str | None) -> dict[str, str | None]:
    """GPUS_PER_NODE declared to Ray, with the fake nvidia-smi (FAKE_GPUS*) first on PATH."""
    path = f"{FAKE_SLURM / 'gpu'}{os.pathsep}{job.environment(None)['PATH']}"
    return {"GPUS_PER_NODE": str(gpus_per_node), "PATH": path, **extra}


def test_step_that_sees_fewer_gpus_than_declared_refuses_to_start(job):
    """sbatch without --gpus-per-node: the steps get no CUDA_VISIBLE_DEVICES, and a node whose
    cgroup hides its GPUs (nvidia-smi finds none) must fail the job at once, in one line
    naming the node, what was declared and what the step sees, instead of Ray advertising
    GPUs that CUDA cannot open."""
    start = time.monotonic()
    result = job(
        CHECK_TWO_NODES,
        **_gpu_env(job, 2, CUDA_VISIBLE_DEVICES=None, FAKE_GPUS_node0="2", FAKE_GPUS_node1="0"),
    )
    assert result.returncode != 0, _explain(result)
    errors = [line for line in result.stderr.splitlines() if "ERROR:" in line]
    assert len(errors) == 1, _explain(result)
    assert "GPU check: node node1: GPUS_PER_NODE=2 requested" in errors[0], _explain(result)
    assert "the job step sees 0 GPU(s)" in errors[0], _explain(result)
    assert "sbatch --gpus-per-node=2" in errors[0], _explain(result)
    assert "node0" not in errors[0], _explain(result)
    assert "ALIVE_NODES" not in result.stdout, _explain(result)
    seconds = time.monotonic() - start
    assert seconds < 0.75 * job.join_timeout_s, f"not fail-fast: {seconds:.0f} s (JOIN_TIMEOUT_S)"


def test_gpu_count_follows_cuda_visible_devices_when_set(job):
    """Ray counts CUDA_VISIBLE_DEVICES when it is set (whatever nvidia-smi lists), and so
    does the check: one visible id against two declared is refused."""
    result = job(CHECK_TWO_NODES, **_gpu_env(job, 2, CUDA_VISIBLE_DEVICES="0", FAKE_GPUS="8"))
    assert result.returncode != 0, _explain(result)
    assert "the job step sees 1 GPU(s) (CUDA_VISIBLE_DEVICES='0'" in result.stderr, _explain(result)


def test_steps_that_see_the_declared_gpus_form_the_cluster(job):
    result = job(CHECK_TWO_NODES, **_gpu_env(job, 2, CUDA_VISIBLE_DEVICES=None, FAKE_GPUS="2"))
    assert result.returncode == 0, _explain(result)
    assert "ALIVE_NODES 2" in result.stdout, _explain(result)
    assert "have_GPU=4 want_GPU=4" in result.stderr, _explain(result)


# Prints, as JSON, the socket interfaces the driver (COMMAND, on the head) and a Ray worker
# process on each node see: Ray workers inherit the environment of their node's `ray start`.
REPORT_IFNAMES = """
import json, os, ray
keys = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
ray.init(address=os.environ["RAY_ADDRESS"])

@ray.remote(num_cpus=0)
def seen():
    return {k: os.environ.get(k) for k in keys}

nodes = {n: ray.get(seen.options(resources={f"slurm_node:{n}": 0.001}).remote())
         for n in ("node0", "node1")}
print("IFNAMES", json.dumps({"driver": {k: os.environ.get(k) for k in keys}, **nodes}))
"""


def test_each_node_exports_its_own_socket_interfaces_unless_the_user_set_them(job, tmp_path):
    """The fake ``ip`` gives each node its own interface: the head holds HEAD_IP on it (found
    by address), the worker reaches the head through it (found by route). NCCL_SOCKET_IFNAME,
    unset, is derived per node ("=": an exact name for NCCL); the user's GLOO_SOCKET_IFNAME
    wins everywhere."""
    script = tmp_path / "report_ifnames.py"
    script.write_text(REPORT_IFNAMES)
    env = job.environment(None)
    result = job(
        f"{sys.executable} {script}",
        PATH=f"{FAKE_SLURM / 'net'}{os.pathsep}{env['PATH']}",
        FAKE_IP_ADDR_node0=env["HEAD_IP"],
        NCCL_SOCKET_IFNAME="",
        GLOO_SOCKET_IFNAME="user-if",
    )
    assert result.returncode == 0, _explain(result)
    lines = [line for line in result.stdout.splitlines() if line.startswith("IFNAMES ")]
    assert lines, _explain(result)
    assert json.loads(lines[0].removeprefix("IFNAMES ")) == {
        "driver": {"NCCL_SOCKET_IFNAME": "=node0-if", "GLOO_SOCKET_IFNAME": "user-if"},
        "node0": {"NCCL_SOCKET_IFNAME": "=node0-if", "GLOO_SOCKET_IFNAME": "user-if"},
        "node1": {"NCCL_SOCKET_IFNAME": "=node1-if", "GLOO_SOCKET_IFNAME": "user-if"},
    }, _explain(result)
