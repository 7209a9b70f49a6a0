"""Pre-flight: what the run directory holds, and the checkpoint a run would resume from.

Found from files alone, before Ray and the workers start (the dry run and the real run
alike), instead of after ~20 s of starting them:

* ``checkpointing.resume=never`` over a used directory, and ``auto`` over a directory that
  holds a run's outputs but no checkpoint to continue it from (storage/run_dir.py);
* checkpoints of which none verifies (sizes and SHA-256 against each ``complete.json``:
  storage/checkpoint_dirs.py ``find_resumable``, which hashes; the controller's resume in
  the same process reuses the verdict);
* a checkpoint trained on other data: its controller state records the training file's
  fingerprint (data/fingerprint.py), compared with the file now unless
  ``checkpointing.allow_data_change``;
* an HF export of the final step that the run would write again (a stale one, not this
  run's: never kept silently);
* a run already finished: ``finished_run`` says so, and dapo-train exits 0 without
  starting anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.data.fingerprint import DATA_STATE_KEY, data_fingerprint, same_data
from dapo_megatron.storage.checkpoint_dirs import (
    NoVerifiedCheckpointError,
    find_resumable,
    read_marker,
)
from dapo_megatron.storage.run_dir import unresumable_run_problem, used_dir_problem

EXTRA_STATE_FILE = "extra_state.pt"
"""The controller state of a checkpoint (megatron/checkpoint.py writes it with torch.save)."""


@dataclass
class ResumePoint:
    """Where a run would start: the checkpoint it resumes from, or none."""

    path: Path | None = None
    """The newest checkpoint that verifies; None: the run starts afresh."""
    step: int = 0
    """Its step (0 without one)."""
    notes: list[str] = field(default_factory=list)
    """find_resumable's lines about newer checkpoints it skipped."""
    problems: list[str] = field(default_factory=list)
    """Why the run may not start here, one line each."""


def resume_point(config: DapoMegatronConfig, run_dir: Path, checkpoint_dir: Path) -> ResumePoint:
    """The checkpoint the run would resume from and every problem of resuming it."""
    if config.checkpointing.resume == "never":
        problem = used_dir_problem(run_dir, checkpoint_dir)
        return ResumePoint(problems=[problem] if problem else [])
    try:
        path, notes = find_resumable(checkpoint_dir)
    except NoVerifiedCheckpointError as e:
        return ResumePoint(problems=[f"checkpointing.checkpoint_dir: {e}"])
    if path is None:
        problem = unresumable_run_problem(run_dir, checkpoint_dir)
        return ResumePoint(notes=notes, problems=[problem] if problem else [])
    marker = read_marker(path) or {}
    point = ResumePoint(path, int(marker.get("step", 0)), notes)
    if not config.checkpointing.allow_data_change:
        point.problems += _data_problems(config, path)
    point.problems += _stale_export(config, run_dir, point)
    return point


def finished_run(config: DapoMegatronConfig, run_dir: Path, point: ResumePoint) -> str | None:
    """The line saying the run has nothing left to do (its checkpoint is at
    dapo.max_num_steps and its final export, if asked for, is written), or None."""
    last = config.dapo.max_num_steps
    if point.path is None or point.problems or point.step < last:
        return None
    if config.checkpointing.export_hf and not (run_dir / "hf" / f"step_{last:06d}").is_dir():
        return None  # the export is still to write
    return (
        f"the run in {run_dir} is already finished: {point.path} is step {point.step} of "
        f"dapo.max_num_steps = {last}; nothing to do (raise dapo.max_num_steps to train "
        f"further, or set run.output_dir to a new directory for a new run)"
    )


def _data_problems(config: DapoMegatronConfig, checkpoint: Path) -> list[str]:
    """The training file against the fingerprint the checkpoint recorded."""
    now = data_fingerprint(config.data)
    if now is None:
        return []
    recorded = _recorded_fingerprint(checkpoint)
    if recorded is None or same_data(recorded, now):
        return []  # checkpoints of older versions recorded none
    return [
        f"data.train_path: {now['path']} is not the data {checkpoint} was trained on "
        f"(sha256 {now['sha256'][:12]}, {now['bytes']} bytes now; {recorded['sha256'][:12]}, "
        f"{recorded['bytes']} bytes recorded from {recorded.get('path')}): resume with that "
        f"file, set run.output_dir to a new directory for a new run, or set "
        f"checkpointing.allow_data_change=true to continue on the changed data on purpose"
    ]


def _recorded_fingerprint(checkpoint: Path) -> dict[str, Any] | None:
    """The data fingerprint in a checkpoint's controller state, or None."""
    # torch only here, when there is a checkpoint to resume: the state is a torch.save
    # pickle (the controller's resume unpickles the same file, trusted the same way).
    import torch

    try:
        state = torch.load(checkpoint / EXTRA_STATE_FILE, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, ValueError, EOFError):
        return None  # verified a moment ago: a checkpoint of a layout without this file
    recorded = state.get(DATA_STATE_KEY) if isinstance(state, dict) else None
    return recorded if isinstance(recorded, dict) and "sha256" in recorded else None


def _stale_export(config: DapoMegatronConfig, run_dir: Path, point: ResumePoint) -> list[str]:
    """An HF export of the final step written before the checkpoint the run resumes from
    (an earlier attempt's): the run would write that step again."""
    last = config.dapo.max_num_steps
    out = run_dir / "hf" / f"step_{last:06d}"
    if not config.checkpointing.export_hf or point.step >= last or not out.exists():
        return []
    return [
        f"checkpointing.export_hf: {out} already exists, but this run resumes from step "
        f"{point.step} ({point.path}) and will train step {last} again, so it is not this "
        f"run's export: move or delete it, or set run.output_dir to a new directory"
    ]
