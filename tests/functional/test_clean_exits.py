"""Clean exits of dapo-train: Ctrl-C and exhausted restarts end with one line, no traceback,
naming the last checkpoint and the command that resumes."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import waits
from tiny_job import REPO, actor_pids, finish, run_job, start_and_wait_for, train_command

from dapo_megatron.cli import train_main

pytestmark = pytest.mark.functional

COMMON = [
    "dapo.max_num_steps=6",
    "sft_warmup.num_steps=30",
    "checkpointing.save_period=1",
    "validation.val_period=0",
    "validation.val_at_start=false",
    "logger.progress_bar=false",
    "logger.plots=false",
    "checkpointing.export_hf=false",
]


def _args(process: psutil.Process) -> str:
    """A process's command line; "" for one that exited meanwhile (zombie, gone)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _command(run_dir, *extra):
    return train_command(run_dir, run_dir.parent / "model", *COMMON, *extra)


def test_ctrl_c_stops_the_workers_and_exits_130_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    marker = run_dir / "checkpoints" / "step_000001" / "complete.json"
    # Long enough to be still running when interrupted (the second process needs seconds).
    proc = start_and_wait_for(_command(run_dir, "dapo.max_num_steps=1000"), marker, capture=True)
    assert marker.exists(), "the run never wrote its step-1 checkpoint"
    # A second dapo-train on the same directory is refused at once, leaving it untouched.
    config_before = (run_dir / "config.yaml").read_bytes()
    second = run_job(_command(run_dir))
    assert second.returncode == 2, second.stderr[-2000:]
    assert "Traceback" not in second.stderr
    assert f"run.output_dir = {run_dir} is in use by another dapo-train (pid {proc.pid}" in (
        second.stderr
    )
    assert (run_dir / "config.yaml").read_bytes() == config_before
    # This run's Ray workers descend from its driver (other tests may run workers too).
    workers = [
        p for p in psutil.Process(proc.pid).children(recursive=True) if "PolicyWorker" in _args(p)
    ]
    assert workers, "no policy worker found under the driver"
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole group
    # A run that goes quiet instead of exiting is killed with its group (never left behind
    # for the later tests: their workers would be found), and the wait fails.
    output = finish(proc, "the exit after Ctrl-C")
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    line = next(x for x in output.splitlines() if x.startswith("interrupted:"))
    assert "the workers were stopped; the last checkpoint is" in line
    assert str(run_dir / "checkpoints" / "step_0000") in line and "resumes from it" in line
    assert "dapo-train --config" in line and f"run.output_dir={run_dir}" in line
    alive = waits.wait_exited(workers, what="the policy workers' exit", idle_s=30)
    assert alive == [], f"policy workers still running after the exit: {alive}"
    # The directory now holds a run: resume=never refuses it instead of mixing two runs.
    never = run_job(_command(run_dir, "checkpointing.resume=never"))
    assert never.returncode == 2 and "Traceback" not in never.stderr, never.stderr[-2000:]
    assert "checkpointing.resume = never, but run.output_dir" in never.stderr
    assert "already holds a run" in never.stderr


def test_exhausted_restarts_name_the_last_checkpoint_and_the_command(tmp_path):
    run_dir = tmp_path / "run"
    marker = run_dir / "checkpoints" / "step_000002" / "complete.json"
    proc = start_and_wait_for(_command(run_dir, "run.max_restarts=0"), marker, capture=True)
    pids = actor_pids("PolicyWorker", proc.pid)
    assert marker.exists() and pids, "no checkpoint or no worker to kill"
    os.kill(pids[-1], signal.SIGKILL)
    output = finish(proc)
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    line = next(x for x in output.splitlines() if x.startswith("error:"))
    assert "died" in line and "restarts exhausted (run.max_restarts = 0" in line
    assert "the last checkpoint is" in line and "resumes from it" in line


def test_overrides_may_follow_flags(tmp_path, capsys):
    # `a=1 --dry-run b=2`: both overrides apply (argparse alone rejects the second one).
    rc = train_main(
        ["run.name=first", "--dry-run", f"run.output_dir={tmp_path}", "dapo.max_num_steps=7"]
    )
    assert rc == 0
    rc = train_main(
        [
            "--print-config",
            "dapo.max_num_steps=7",
            "--config",
            str(REPO / "recipes" / "dapo-tiny-cpu.yaml"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "max_num_steps: 7" in out


def test_help_documents_run_dir_resume_exit_codes_and_overrides():
    out = run_job([*train_command(REPO / "unused", REPO / "unused")[:3], "--help"]).stdout
    for needle in ("run directory", "metrics.jsonl", "checkpointing.resume=never",
                   "exit status", "130 interrupted", "anywhere on the command"):  # fmt: skip
        assert needle in out, needle
