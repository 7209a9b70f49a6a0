"""The faults of scripts/reliability_cases.py that need a running job: each case starts the
tiny recipe, injects its fault for real (a signal, a stopped process, a full disk, a lost
node) and returns what the user sees: the exit status, the seconds from the fault to the
exit and the line that names the outcome.

Each case is a function (tmp directory, model directory) -> JobOutcome, listed in
JOB_CASES; reliability_cases.py runs them after the cases that fail before any worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
# A job that keeps running until the fault: long, no periodic checkpoint after step 1.
LONG_JOB = [
    "dapo.max_num_steps=1000",
    "sft_warmup.num_steps=30",
    "dapo.dynamic_sampling.max_gen_batches=0",
    "checkpointing.save_period=1",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "logger.progress_bar=false",
    "logger.plots=false",
    "checkpointing.export_hf=false",
]


@dataclass
class JobOutcome:
    rc: int
    seconds: float
    """From the fault to the exit."""
    output: str


def env() -> dict[str, str]:
    return dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


def start(
    run_dir: Path,
    model: Path,
    *overrides: str,
    wait: bool = True,
    python: str = sys.executable,
    recipe: Path = TINY,
    ray_address: str | None = None,
) -> subprocess.Popen[str]:
    """The tiny job in its own session, returned once it has logged a step (``wait``)."""
    cmd = [
        python,
        "-m",
        "dapo_megatron.cli",
        "--config",
        str(recipe),
        f"run.output_dir={run_dir}",
        f"policy.model_name_or_path={model}",
        *LONG_JOB,
        *overrides,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env() if ray_address is None else dict(env(), RAY_ADDRESS=ray_address),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + (600 if wait else 0)
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and metrics.read_text().strip():
            break
        time.sleep(0.1)
    return proc


def workers(proc: subprocess.Popen[str], actor_class: str = "PolicyWorker") -> list[int]:
    """Pids of this job's Ray actors of a class (other jobs on the machine may run some)."""
    return [
        p.pid
        for p in psutil.Process(proc.pid).children(recursive=True)
        if f"ray::{actor_class}" in " ".join(p.cmdline())
    ]


def finish(proc: subprocess.Popen[str], fault_at: float, timeout: float = 600) -> JobOutcome:
    output, _ = proc.communicate(timeout=timeout)
    return JobOutcome(proc.returncode, time.monotonic() - fault_at, output)


def preemption(tmp: Path, model: Path) -> JobOutcome:
    """SIGTERM to dapo-train in the middle of a run (what slurm/ray.sub forwards)."""
    proc = start(tmp / "preempted", model, "checkpointing.save_period=1000")
    fault_at = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    return finish(proc, fault_at)


def descendants(proc: subprocess.Popen[str], name: str) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if name in " ".join(p.cmdline()) or p.name() == name:
                found.append(p)
    return found


def rank_killed_in_collective(tmp: Path, model: Path) -> JobOutcome:
    """A policy rank killed while the other waits for it in an all-reduce (SFT warm-up),
    with the death report late (the raylet stopped for 4 s): the survivor's "Connection
    reset by peer" reaches the controller first (tests/functional/test_rank_death_race.py).
    The restart line is the outcome; Ctrl-C then ends the restarted run."""
    proc = start(
        tmp / "rank-race", model, "sft_warmup.num_steps=200", "run.max_restarts=1", wait=False
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("sft warm-up 10/"):
            break
    rank = workers(proc)[-1]
    raylet = descendants(proc, "raylet")[0]
    os.kill(rank, signal.SIGSTOP)
    time.sleep(2)  # the other rank now waits in the step's all-reduce
    raylet.send_signal(signal.SIGSTOP)
    fault_at = time.monotonic()
    try:
        os.kill(rank, signal.SIGKILL)
        time.sleep(4)
    finally:
        raylet.send_signal(signal.SIGCONT)
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(("[restart", "error:")):
            break
    seconds = time.monotonic() - fault_at
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    return JobOutcome(proc.returncode, seconds, "".join(seen) + rest)


def rank_stopped(tmp: Path, model: Path) -> JobOutcome:
    """A policy rank that stops responding (SIGSTOP) while the other waits for it in an
    all-reduce; run.collective_timeout_s=10 (tests/functional/test_hangs.py)."""
    proc = start(
        tmp / "rank-stopped",
        model,
        "sft_warmup.num_steps=300",
        "run.max_restarts=0",
        "run.collective_timeout_s=10",
        wait=False,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("sft warm-up 10/"):
            break
    rank = workers(proc)[-1]
    os.kill(rank, signal.SIGSTOP)
    fault_at = time.monotonic()
    try:
        outcome = finish(proc, fault_at, timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank, signal.SIGKILL)
    outcome.output = "".join(seen) + outcome.output
    return outcome


def full_disk_save(tmp: Path, model: Path) -> JobOutcome:
    """The checkpoint directory on a 256 KiB tmpfs: the first save fills it (root only;
    tests/functional/test_full_disk.py also covers dapo-export)."""
    disk = tmp / "full-disk"
    disk.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True
        ).returncode
    ):
        return JobOutcome(-1, 0.0, "skipped: mounting a tmpfs needs root")
    try:
        proc = start(
            tmp / "full-disk-run", model, "dapo.max_num_steps=1",
            f"checkpointing.checkpoint_dir={disk / 'checkpoints'}", wait=False,
        )  # fmt: skip
        return finish(proc, time.monotonic())
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def engine_killed_shm(tmp: Path, model: Path) -> JobOutcome:
    """A vLLM engine (TP2: three processes naming ~8 files in /dev/shm) SIGKILLed mid-run;
    the run restarts, then Ctrl-C stops it normally: /dev/shm must be as found (needs
    .venv-vllm; tests/vllm_backend/test_shm_cleanup.py)."""
    python = REPO / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        return JobOutcome(-1, 0.0, "skipped: needs .venv-vllm (bash scripts/setup_vllm_cpu.sh)")
    sys.path.insert(0, str(REPO / "tests"))
    import shm_hygiene  # type: ignore[import-not-found]

    before, seen = shm_hygiene.ours(), set()
    proc = start(
        tmp / "engine-killed", tmp / "model-hd32", "run.max_restarts=1", "sft_warmup.num_steps=0",
        python=str(python), recipe=REPO / "recipes" / "dapo-tiny-cpu-vllm.yaml",
    )  # fmt: skip
    seen |= shm_hygiene.ours() - before
    engine = workers(proc, "GenerationWorker")[0]
    fault_at = time.monotonic()
    os.kill(engine, signal.SIGKILL)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the restart, then the restarted run's next step
        lines.append(line)
        if line.startswith(("step ", "error:")) and any(x.startswith("[restart") for x in lines):
            break
    seen |= shm_hygiene.ours() - before
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    seconds = time.monotonic() - fault_at
    left = seen & shm_hygiene.ours()
    note = f"/dev/shm: {len(left)} of the {len(seen)} files the engines named left"
    return JobOutcome(proc.returncode, seconds, "".join(lines) + rest + note + "\n")


def node_lost(tmp: Path, model: Path) -> JobOutcome:
    """A node of a 2-node layout lost (its raylet and workers SIGKILLed) on a fake Ray
    cluster (a head without CPUs, two nodes of one CPU: one policy rank each); the node
    left cannot hold the layout (tests/functional/test_node_loss.py also restarts on a
    cluster that still fits it)."""
    sys.path.insert(0, str(REPO / "tests" / "functional"))
    from ray.cluster_utils import Cluster
    from test_node_loss import policy_node  # type: ignore[import-not-found]

    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    system = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    head = {"num_cpus": 0, "include_dashboard": False, "_system_config": system}
    fake = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(2):
            fake.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024)
        fake.wait_for_nodes()
        proc = start(
            tmp / "node-lost", model, "cluster.num_nodes=2", "cluster.gpus_per_node=1",
            "run.max_restarts=1", "sft_warmup.num_steps=0", ray_address=fake.address,
        )  # fmt: skip
        saved = tmp / "node-lost" / "checkpoints" / "step_000001" / "complete.json"
        while proc.poll() is None and not saved.exists():
            time.sleep(0.2)
        fake.remove_node(policy_node(fake), allow_graceful=False)
        fault_at = time.monotonic()
        try:
            return finish(proc, fault_at, timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        fake.shutdown()


JOB_CASES: list[tuple[str, Callable[[Path, Path], JobOutcome]]] = [
    ("SIGTERM mid-run (Slurm preemption / time limit)", preemption),
    ("policy rank killed in a collective, death reported late", rank_killed_in_collective),
    ("policy rank stopped (SIGSTOP) in a collective", rank_stopped),
    ("disk full during a checkpoint save (seconds: the whole run)", full_disk_save),
    ("vLLM engine SIGKILLed mid-run, then Ctrl-C (/dev/shm after)", engine_killed_shm),
    ("node lost, the nodes left do not fit the layout", node_lost),
]


def shown(outcome: JobOutcome) -> str:
    """The lines a user reads first: errors, preemption and restart lines."""
    keys: tuple[str, ...] = ("error:", "preempted:", "interrupted:", "[restart", "Traceback")
    keys += ("Unhandled", "skipped", "/dev/shm:")
    lines = [x for x in outcome.output.splitlines() if x.startswith(keys)]
    return " | ".join(lines[:3]) if lines else outcome.output.strip().splitlines()[-1]
