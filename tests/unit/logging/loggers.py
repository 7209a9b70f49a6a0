"""A MetricsLogger over a temporary run directory, with every optional sink off unless a
test turns it on (import: ``unit.logging.loggers``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from dapo_megatron.config.schema_run import LoggerConfig
from dapo_megatron.logging import MetricsLogger

BASE = LoggerConfig(
    log_dir=None,
    tensorboard_enabled=False,
    wandb_enabled=False,
    wandb_project="dapo-test",
    mlflow_enabled=False,
    mlflow_tracking_uri=None,
    progress_bar=False,
    plots=False,
)


def make_logger(run_dir: Path, *, resume: bool = False, **overrides: Any) -> MetricsLogger:
    return MetricsLogger(replace(BASE, **overrides), run_dir=run_dir, run_name="t", resume=resume)
