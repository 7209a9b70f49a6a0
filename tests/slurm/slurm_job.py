"""`sbatch slurm/ray.sub` under the real Slurm of scripts/slurm_local.sh, for tests/slurm.

A ``Job`` is one submission: its own directory (output, Ray logs, run directory), its own
Ray temp dir and port (other tests on this machine may run Ray too), the job's state and
exit codes read from ``scontrol show job`` (no accounting daemon here, so no sacct), and
waits sized by progress (tests/waits.py): every wait polls the job's state or a file, and
fails only once the job has shown no progress (its state, its output, a file of its
directory) for an idle limit scaled by the machine's speed, never at a fixed time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import waits

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
VENV_BIN = Path(sys.executable).parent
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}

# The tiny recipe at its fastest: no warm-up, no dynamic sampling (a random model's groups
# would all be filtered), no validation, no periodic save (the preemption's is the one the
# tests look for), no HF export. One policy rank per Ray CPU.
FAST = [
    "sft_warmup.num_steps=0",
    "dapo.dynamic_sampling.enabled=false",
    "dapo.num_prompts_per_step=8",
    "policy.train_global_batch_size=64",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "checkpointing.save_period=1000",
    "checkpointing.export_hf=false",
    "logger.progress_bar=false",
    "logger.plots=false",
    "run.preemption_grace_s=25",  # below KillWait (30 s): the save must beat the SIGKILL
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_up() -> str | None:
    """None when tests/slurm can run, else why not (the skip reason)."""
    if os.environ.get("DAPO_SLURM_TESTS") != "1":
        return "real-Slurm tests run under scripts/test_slurm.sh (DAPO_SLURM_TESTS=1 unset)"
    if shutil.which("sbatch") is None:
        return "no sbatch on PATH"
    probe = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"sinfo failed: {probe.stderr.strip()}"
    return None


def job_processes(job_id: str) -> list[int]:
    """Live processes Slurm started for this job (they carry SLURM_JOB_ID in their
    environment, Ray's GCS, raylets and workers included): none may outlive the job."""
    pids = []
    needle = f"\0SLURM_JOB_ID={job_id}\0".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in b"\0" + (entry / "environ").read_bytes():
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] != "Z":
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def shm_files() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir()} if Path("/dev/shm").is_dir() else set()


@dataclass
class Job:
    """One `sbatch slurm/ray.sub` in ``root``; ``submit`` starts it."""

    root: Path
    model_dir: Path
    nodes: int = 1
    # DAPO_RAY_SUB: another ray.sub to test (the one before a fix, to see a test fail).
    script: Path = Path(os.environ.get("DAPO_RAY_SUB", REPO / "slurm" / "ray.sub"))
    job_id: str = ""
    run_dir: Path = field(init=False)
    ray_tmp: Path = field(init=False)
    shm_before: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.run_dir = self.root / "run"
        # Short: Ray's unix socket paths live under it and must stay < 108 bytes.
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))

    def command(self, *overrides: str, steps: int | str = 1000) -> str:
        """dapo-train on the tiny recipe (this checkout's package, through this Python)."""
        ranks = ["cluster.num_nodes=2", "cluster.gpus_per_node=1"] if self.nodes == 2 else []
        args = [
            f"{sys.executable} -c 'import sys; from dapo_megatron.cli import train_main; "
            "sys.exit(train_main())'",
            f"--config {TINY}",
            f"run.output_dir={self.run_dir}",
            f"policy.model_name_or_path={self.model_dir}",
            f"dapo.max_num_steps={steps}",
            *FAST,
            *ranks,
            *overrides,
        ]
        return " ".join(args)

    def environment(self, command: str | None, **extra: str | None) -> dict[str, str]:
        """What sbatch passes on to the job (--export=ALL, Slurm's default). RAY_AUTH_MODE
        is left unset, as a new user has it; an extra set to None is removed."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RAY_", "SLURM_JOB", "PYTEST", "COMMAND"))
        }
        env.update(
            # A HOME of its own: Ray finds a token in ~/.ray/auth_token (a local ray.init in
            # token mode writes one there), and which of ray.sub's auth paths a job takes
            # must not depend on what ran on this machine before.
            HOME=str(self.root),
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHON=sys.executable,
            RAY=str(VENV_BIN / "ray"),
            GPUS_PER_NODE="0",
            CPUS_PER_NODE=str(2 // self.nodes),
            RAY_USAGE_STATS_ENABLED="0",
            RAY_PORT=str(free_port()),
            RAY_TEMP_DIR=str(self.ray_tmp),
            RAY_START_ARGS="--object-store-memory=100000000",
            LOG_DIR=str(self.root / "logs"),
            # ray.sub's own clock for the nodes to join: 120 s when quiet, scaled.
            JOIN_TIMEOUT_S=str(round(waits.scaled(120))),
            TEARDOWN_GRACE_S="15",
        )
        if command is not None:
            env["COMMAND"] = command
        if os.environ.get("DAPO_SLURM_RAY_AUTH_MODE"):  # to get an old ray.sub past its auth
            env["RAY_AUTH_MODE"] = os.environ["DAPO_SLURM_RAY_AUTH_MODE"]
        for key, value in extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def submit(self, command: str | None, *sbatch_args: str, **extra: str | None) -> Job:
        self.shm_before = shm_files()
        out = subprocess.run(
            [
                "sbatch",
                "--parsable",
                f"--nodes={self.nodes}",
                f"--chdir={self.root}",
                f"--output={self.root}/slurm-%j.out",
                *sbatch_args,
                str(self.script),
            ],
            env=self.environment(command, **extra),
            capture_output=True,
            text=True,
            check=True,
        )
        self.job_id = out.stdout.strip().split(";")[0]
        return self

    # --- what Slurm says ---------------------------------------------------------------
    def info(self) -> dict[str, str]:
        """`scontrol show job` as key=value pairs (JobState, ExitCode, DerivedExitCode...)."""
        text = subprocess.run(
            ["scontrol", "-o", "show", "job", self.job_id], capture_output=True, text=True
        ).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def completions(self) -> list[dict[str, str]]:
        """This job's records in the jobcomp/filetxt file (one per end of an attempt): the
        only place without accounting that holds DerivedExitCode."""
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
        found = re.search(r"^JobCompLoc\s*=\s*(\S+)", config.stdout, re.M)
        path = Path(found.group(1)) if found else None
        if path is None or not path.exists():
            return []
        records = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in path.read_text().splitlines()]
        return [r for r in records if r.get("JobId") == self.job_id]

    def final_record(self, idle_s: float = 30) -> dict[str, str]:
        """The jobcomp record of the job's last end (written as the job completes)."""
        self.wait_for("jobcomp record", lambda: bool(self.completions()), idle_s)
        return self.completions()[-1]

    def state(self) -> str:
        return self.info().get("JobState", "UNKNOWN")

    def output(self) -> str:
        path = self.root / f"slurm-{self.job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def explain(self) -> str:
        info = self.info()
        keys = ("JobState", "Reason", "ExitCode", "DerivedExitCode", "Restarts", "RunTime")
        return " ".join(f"{k}={info.get(k)}" for k in keys) + "\n" + self.output()[-6000:]

    # --- waits, sized by progress --------------------------------------------------------
    def progress(self) -> tuple:
        """Changes whenever the job does something visible: its state, its output, a file
        of its directory (run directory, logs)."""
        return self.state(), waits.files_progress(self.root)()

    def wait_for(self, what: str, ready, idle_s: float = 120) -> float:
        """Poll ready() until true; seconds waited. Fails (and cancels the job) once the job
        showed no progress for idle_s (scaled by the machine's speed)."""
        try:
            return waits.wait_until(
                ready, what=f"job {self.job_id}: {what}", idle_s=idle_s, progress=self.progress,
                poll_s=0.25, details=self.explain,
            )  # fmt: skip
        except waits.WaitTimeout:
            subprocess.run(["scancel", "--full", "--signal=KILL", self.job_id], check=False)
            raise

    def wait_steps(self, n: int, idle_s: float = 120) -> float:
        metrics = self.run_dir / "metrics.jsonl"

        def logged() -> bool:
            if self.state() in FINAL_STATES:
                raise AssertionError(f"job ended before {n} steps:\n{self.explain()}")
            return metrics.exists() and len(metrics.read_text().splitlines()) >= n

        return self.wait_for(f"{n} steps", logged, idle_s)

    def ended(self) -> bool:
        """In a final state and done completing: after `scancel` the state is CANCELLED at
        once, while the job's processes still have KillWait to end (squeue shows CG)."""
        if self.state() not in FINAL_STATES:
            return False
        flags = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", self.job_id, "-o", "%t"],
            capture_output=True,
            text=True,
        ).stdout.split()
        return "CG" not in flags

    def wait_end(self, idle_s: float = 120) -> float:
        return self.wait_for("end", self.ended, idle_s)

    def wait_line(self, text: str, idle_s: float = 120) -> float:
        return self.wait_for(f"line {text!r}", lambda: text in self.output(), idle_s)

    # --- what the run left --------------------------------------------------------------
    def assert_saved_current_step(self) -> int:
        """The run stopped on SIGTERM at its last logged step: a verified checkpoint of it
        and one resume line naming it, no traceback. Returns that step."""
        from dapo_megatron.storage.checkpoint_dirs import verify_checkpoint

        out = self.output()
        assert "Traceback" not in out, self.explain()
        last = self.last_step()
        step_dir = self.run_dir / "checkpoints" / f"step_{last:06d}"
        lines = [x for x in out.splitlines() if x.startswith("preempted:")]
        assert len(lines) == 1, self.explain()
        assert lines[0].startswith(
            f"preempted: SIGTERM; saved step {last}; the last checkpoint is {step_dir}; `"
        ), lines[0]
        # The tool as a path that runs from the job's directory (shared/commands.py).
        assert re.search(r"; `\S*/dapo-train --config", lines[0]), lines[0]
        assert lines[0].endswith("resumes from it"), lines[0]
        assert verify_checkpoint(step_dir) is None, verify_checkpoint(step_dir)
        return last

    def assert_resumed_after_requeue(self, step: int, first: str) -> str:
        """The requeued attempt (held by BeginTime, cred_expire) resumed from the saved
        ``step``, ran to ``step + 2`` and the job ended COMPLETED 0:0, DerivedExitCode
        0:0, with the first attempt's output ``first`` kept. Returns the whole output."""
        self.wait_line("[resume] ")
        self.wait_end()
        info = self.info()
        assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1")
        assert self.final_record()["DerivedExitCode"] == "0:0", self.completions()
        out = self.output()
        assert out.startswith(first), "the first attempt's lines were not kept"
        resumed = out[len(first) :]
        assert f"[resume] {self.run_dir / 'checkpoints' / f'step_{step:06d}'}" in resumed, resumed
        assert self.last_step() == step + 2
        return out

    def last_step(self) -> int:
        rows = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return max(json.loads(line)["step"] for line in rows)

    def leftovers(self) -> list[str]:
        """Processes of the job still alive, and /dev/shm files that appeared during it and
        that no live process holds (Ray's object store), after the job ended."""
        # Slurm reaps a finished job's steps within seconds; each exit is progress.
        with contextlib.suppress(waits.WaitTimeout):
            waits.wait_until(
                lambda: not job_processes(self.job_id), what="the job's processes to end",
                idle_s=20, progress=lambda: len(job_processes(self.job_id)), poll_s=0.25,
            )  # fmt: skip
        problems = [f"pid {pid} of job {self.job_id}" for pid in job_processes(self.job_id)]
        # Only the kinds a job of ours makes (Ray's object store, our buffers): other tests
        # on this machine may leave their own files meanwhile.
        new = {n for n in shm_files() - self.shm_before if n.startswith(("plasma", "ray", "dapo-"))}
        if new:
            sys.path.insert(0, str(REPO / "tests"))
            import shm_hygiene

            in_use = shm_hygiene.paths_in_use()
            problems += [f"/dev/shm/{n}" for n in new if f"/dev/shm/{n}" not in in_use]
        return problems

    def cancel(self) -> None:
        """Kill a job a failed test left running (then leftovers() waits for it to go)."""
        if self.job_id and self.state() not in FINAL_STATES:
            subprocess.run(["scancel", "--full", "--signal=KILL", self.job_id], check=False)
            with contextlib.suppress(waits.WaitTimeout):  # leftovers() names what is left
                waits.wait_until(
                    self.ended, what="the cancelled job's end", idle_s=60,
                    progress=self.progress, poll_s=0.5,
                )  # fmt: skip

    def cleanup(self) -> None:
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
