"""The run's own sections: its identity (run), where it executes (cluster), how it saves
(checkpointing) and reports (logger).

Part of the run's schema (config/schema.py joins the sections into DapoMegatronConfig);
as there, fields carry no defaults (configs/dapo_base.yaml holds them) and each field's
docstring is the reference documentation of its key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class RunConfig:
    """Identity and location of a run."""

    name: str
    """Run name, used for the run directory and by loggers."""
    output_dir: str
    """Run directory: checkpoints, metrics.jsonl, plots (relative to the cwd)."""
    seed: int
    """Global seed: data order, sampling, initialisation of a fresh model."""
    max_restarts: int
    """Restarts from the last checkpoint after a worker dies.

    How many times the controller restarts from the last checkpoint after a worker dies."""
    preemption_grace_s: float
    """After SIGTERM: save at the next step end within this, exit 143.

    After a SIGTERM to dapo-train (a Slurm preemption or time limit, ``kill``): how long the
    run may take to reach its next safe point (the end of a step), save a checkpoint there
    and exit with status 143 and a resume line. Past it, the run stops at once without
    saving (the last checkpoint stays the resume point), so keep it below the time between
    the signal and the SIGKILL that follows (slurm/ray.sub asks Slurm for SIGTERM 300 s
    before the time limit)."""
    collective_timeout_s: float
    """A policy collective waiting longer on a peer fails (rank named; restart).

    How long a collective of the policy ranks may wait for a peer (a stuck or stopped rank)
    before it fails; the run then names the rank that did not answer and restarts from the
    last checkpoint. Generous: a collective also waits out the slowest rank's compute before
    it, and a checkpoint save."""
    call_timeout_s: float
    """A worker call answering later than this fails (worker named; restart).

    How long the controller waits for any one call to its workers (a generation round, a
    train step, a refit, a save) before it names the worker that did not answer and restarts
    from the last checkpoint: the backstop for a hang outside a collective. Far above the
    longest call of a real run."""


@dataclass
class ClusterConfig:
    """Where the run executes."""

    num_nodes: int
    """Nodes in the Ray cluster."""
    gpus_per_node: int
    """Devices per node; on CPU, the number of worker processes per node."""
    device: Literal["auto", "cuda", "cpu"]
    """auto picks cuda when available, else cpu (gloo)."""
    colocated: bool
    """Policy and engines share all devices (engine asleep while training)."""
    generation_num_devices: int
    """Split mode only: devices given to generation; the policy gets the rest."""
    ray_address: str | None
    """Ray cluster to join; null: RAY_ADDRESS if set, else a local one.

    Ray cluster to join; null uses RAY_ADDRESS when set (slurm/ray.sub), else starts a local
    cluster bound to loopback."""


@dataclass
class CheckpointingConfig:
    """Checkpoints of the full run state (model, optimizer, scheduler, data, sampler, RNG)."""

    enabled: bool
    """Write checkpoints."""
    checkpoint_dir: str | None
    """Checkpoint directory; null uses <run.output_dir>/checkpoints."""
    save_period: int
    """Save every this many steps (and at the end)."""
    keep_last: int
    """Keep only the newest this many complete checkpoints."""
    resume: Literal["auto", "never"]
    """auto: resume from the newest complete checkpoint; never: start anew.

    The checkpoints are looked for in checkpoint_dir."""
    export_hf: bool
    """Write the final policy as an HF checkpoint (<run.output_dir>/hf/step_<N>).

    At the end of the run, write the final policy as a Hugging Face checkpoint to
    <run.output_dir>/hf/step_<N> (config.json, safetensors, tokenizer); other steps'
    checkpoints export with ``dapo-export``."""
    allow_data_change: bool = False
    """Resume although data.train_path's content changed since the checkpoint.

    Resume even though data.train_path's content differs from the data the checkpoint was
    trained on (its SHA-256 is recorded in every checkpoint; a change is refused before
    anything starts unless this is true). With a different number of prompts the sampler
    starts a new epoch over the new data."""


@dataclass
class LoggerConfig:
    """Metrics sinks; metrics.jsonl in the run directory is always written."""

    log_dir: str | None
    """Log directory; null uses <run.output_dir>/logs."""
    tensorboard_enabled: bool
    """Write TensorBoard event files."""
    wandb_enabled: bool
    """Log to Weights & Biases (needs wandb installed and configured)."""
    wandb_project: str
    """W&B project name."""
    mlflow_enabled: bool
    """Log to MLflow (needs mlflow installed)."""
    mlflow_tracking_uri: str | None
    """MLflow tracking URI; null uses MLflow's own default."""
    progress_bar: bool
    """Show a progress bar over steps with the headline metrics."""
    plots: bool
    """Write PNG plots of the main curves to the run directory on exit."""
