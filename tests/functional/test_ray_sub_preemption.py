"""slurm/ray.sub under preemption, with the fake Slurm of test_ray_sub.py and 2 fake nodes,
COMMAND = dapo-train on the tiny recipe (one policy rank per node, DP2 across the nodes).

Two ways Slurm signals a job:

* ``--signal=B:TERM@300`` (or ``PreemptParameters=send_user_signal``): SIGTERM to the batch
  shell only. ray.sub forwards it to dapo-train, which saves a checkpoint at the end of the
  current step and exits 143 with the resume line; the job exits 143.
* its own job-wide SIGTERM (time limit, preemption, scancel): every process of every step,
  the Ray steps' GCS, raylets and workers included, then SIGKILL after KillWait (the fake
  srun's FAKE_SRUN_GRACE_S, 30 s here as Slurm's default). ray.sub starts `ray start` with
  SIGTERM blocked: the mask survives exec and fork, so every Ray process keeps it (a
  blocked signal stays pending whatever handler the raylet's and GCS's boost::asio
  signal_set or a Ray worker's main loop installs; SIG_IGN from a `trap '' TERM` would
  not survive those handlers). The cluster outlives the signal, dapo-train (not blocked)
  ends its step with a checkpoint, exits 143 with the resume line, and the teardown stops
  Ray (SIGUSR1 to the steps).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import test_ray_sub
from test_ray_sub import REPO, _session_members

from dapo_megatron.storage.checkpoint_dirs import verify_checkpoint

pytestmark = pytest.mark.functional

job = test_ray_sub.job  # the fake Slurm job fixture (and its leftover check), shared

OVERRIDES = [
    "cluster.num_nodes=2",
    "cluster.gpus_per_node=1",
    "dapo.max_num_steps=1000",
    "sft_warmup.num_steps=30",
    "dapo.dynamic_sampling.max_gen_batches=0",
    "checkpointing.save_period=1000",  # no periodic save: the preemption's is the one
    "checkpointing.export_hf=false",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "logger.progress_bar=false",
    "logger.plots=false",
    "run.preemption_grace_s=25",
]
STEPS_BEFORE_SIGNAL = 2
KILL_WAIT_S = 30  # Slurm's default KillWait: SIGKILL this long after the job-wide SIGTERM


def _start(job, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """ray.sub running dapo-train, returned once STEPS_BEFORE_SIGNAL steps are logged."""
    run_dir = tmp_path / "run"
    command = (
        f"{sys.executable} -c 'import sys; from dapo_megatron.cli import train_main; "
        f"sys.exit(train_main())' --config {REPO / 'recipes' / 'dapo-tiny-cpu.yaml'} "
        f"run.output_dir={run_dir} policy.model_name_or_path={tmp_path / 'model'} "
        + " ".join(OVERRIDES)
    )
    env = job.environment(command, FAKE_SRUN_GRACE_S=str(KILL_WAIT_S))
    with (tmp_path / "job.out").open("w") as out, (tmp_path / "job.err").open("w") as err:
        proc = subprocess.Popen(
            ["bash", str(REPO / "slurm" / "ray.sub")],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= STEPS_BEFORE_SIGNAL:
            return proc, run_dir
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    raise AssertionError(f"the job logged no {STEPS_BEFORE_SIGNAL} steps:\n{_output(tmp_path)}")


def _output(tmp_path: Path) -> str:
    return (tmp_path / "job.out").read_text() + (tmp_path / "job.err").read_text()


def _wait(proc: subprocess.Popen, tmp_path: Path, timeout: float) -> float:
    """Seconds until the job exited (killed and failed after timeout)."""
    started = time.monotonic()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the job hung {timeout:.0f} s:\n{_output(tmp_path)}") from None
    return time.monotonic() - started


def _assert_saved_current_step(run_dir: Path, tmp_path: Path) -> None:
    """The last logged step has a verified checkpoint and the resume line names it."""
    output = _output(tmp_path)
    assert "Traceback" not in output, output[-4000:]
    last = max(json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open())
    assert last >= STEPS_BEFORE_SIGNAL
    step_dir = run_dir / "checkpoints" / f"step_{last:06d}"
    lines = [x for x in output.splitlines() if x.startswith("preempted:")]
    assert len(lines) == 1, output[-4000:]
    assert lines[0].startswith(
        f"preempted: SIGTERM; saved step {last}; the last checkpoint is {step_dir}; "
        "`dapo-train --config"
    ), lines[0]
    assert lines[0].endswith("resumes from it"), lines[0]
    assert verify_checkpoint(step_dir) is None, verify_checkpoint(step_dir)


def _job_processes(proc: subprocess.Popen, tmp_path: Path) -> list[psutil.Process]:
    """Every process of the job: the batch shell, its descendants (sruns, Ray's GCS,
    raylets and workers of both nodes, the driver) and whatever else lives in a step."""
    procs = {proc.pid: psutil.Process(proc.pid)}
    for child in procs[proc.pid].children(recursive=True):
        procs[child.pid] = child
    for sid in (tmp_path / "sids").read_text().split():
        for pid in _session_members(int(sid)):
            try:
                procs.setdefault(pid, psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
    return list(procs.values())


def test_sigterm_to_the_batch_shell_saves_the_step_and_the_job_exits_143(job, tmp_path):
    proc, run_dir = _start(job, tmp_path)
    proc.send_signal(signal.SIGTERM)  # --signal=B:TERM: the batch shell only
    seconds = _wait(proc, tmp_path, timeout=60)
    assert proc.returncode == 143, _output(tmp_path)[-4000:]
    _assert_saved_current_step(run_dir, tmp_path)
    err = (tmp_path / "job.err").read_text()
    assert "SIGTERM: forwarded to COMMAND" in err, err
    assert err.index("COMMAND exited with status 143") < err.index("stopping Ray on 2 node(s)")
    assert seconds < 45, f"{seconds:.0f} s from SIGTERM to the job's exit"


def test_sigterm_to_every_process_of_the_job_still_saves_the_step(job, tmp_path):
    proc, run_dir = _start(job, tmp_path)
    everyone = _job_processes(proc, tmp_path)
    names = " ".join(p.name() for p in everyone)
    assert "raylet" in names and "gcs_server" in names, names
    for p in everyone:  # Slurm's job-wide signal: every process of every step
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    seconds = _wait(proc, tmp_path, timeout=KILL_WAIT_S + 30)
    assert proc.returncode == 143, _output(tmp_path)[-4000:]
    _assert_saved_current_step(run_dir, tmp_path)
    assert seconds < KILL_WAIT_S, f"{seconds:.0f} s: the SIGKILL after KillWait comes first"
    logs = [(tmp_path / "logs" / f"ray-node{i}.log").read_text() for i in (0, 1)]
    assert all("SIGTERM: Ray keeps running" in log for log in logs), logs
    _, alive = psutil.wait_procs(everyone[1:], timeout=20)
    assert alive == [], f"processes of the job still running after its exit: {alive}"
