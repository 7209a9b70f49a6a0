"""Optional metric sinks: TensorBoard (tensorboardX), Weights & Biases, MLflow.

Each sink is a small class with ``log(step, metrics, wall_time)`` and ``close(failed)``.
wandb and mlflow are not dependencies of dapo-megatron: ``import_optional`` imports them
only when enabled and turns a missing package into a one-line ``ConfigError`` that names
the config key and the pip package, at construction rather than at the first step. The
sinks take the imported module as an argument so tests can hand them a stand-in.

W&B and MLflow runs survive controller restarts: their run ids are kept in
``<run_dir>/logger_state.json`` and reopened when the run resumes.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from dapo_megatron.config.errors import ConfigError

__all__ = [
    "LOGGER_STATE_FILENAME",
    "MlflowSink",
    "Sink",
    "TensorBoardSink",
    "WandbSink",
    "import_optional",
    "load_logger_state",
    "save_logger_state",
]

LOGGER_STATE_FILENAME = "logger_state.json"


class Sink(Protocol):
    """A destination for metrics besides metrics.jsonl."""

    name: str

    def log(self, step: int, metrics: Mapping[str, float], *, wall_time: float) -> None:
        """Record the metrics of ``step`` (finite or not; see each sink for NaN handling)."""

    def close(self, *, failed: bool) -> None:
        """Flush and release; ``failed`` marks a run that ends with an exception."""


def import_optional(module: str, *, config_key: str, pip_package: str) -> ModuleType:
    """Import an optional logging backend, or raise a ``ConfigError`` saying how to fix it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise ConfigError(
                f"{config_key} is true but '{module}' failed to import: {err}; "
                f"repair its install (pip install -U {pip_package}) or set {config_key}=false"
            ) from err
        # The ImportError traceback says nothing the message does not.
        raise ConfigError(
            f"{config_key} is true but the '{module}' package is not installed; "
            f"run `pip install {pip_package}` or set {config_key}=false"
        ) from None
    except ImportError as err:
        raise ConfigError(
            f"{config_key} is true but '{module}' failed to import: {err}; "
            f"repair its install (pip install -U {pip_package}) or set {config_key}=false"
        ) from err


def load_logger_state(run_dir: Path) -> dict[str, str]:
    """Run ids saved by earlier attempts of this run; empty when there are none."""
    path = Path(run_dir) / LOGGER_STATE_FILENAME
    if not path.exists():
        return {}
    state = json.loads(path.read_text(encoding="utf-8"))
    return {str(k): str(v) for k, v in state.items()}


def save_logger_state(run_dir: Path, state: Mapping[str, str]) -> None:
    """Write the run ids atomically (a crash mid-write must not lose the W&B run)."""
    path = Path(run_dir) / LOGGER_STATE_FILENAME
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(state), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class TensorBoardSink:
    """Scalars in TensorBoard event files under ``log_dir``.

    The writer is created at the first ``log``: on resume that step becomes tensorboardX's
    ``purge_step``, which makes TensorBoard hide the events at or after it that the
    previous attempt wrote, so curves do not double back after a restart.
    """

    name = "tensorboard"

    def __init__(self, log_dir: Path, *, resume: bool) -> None:
        # tensorboardX is a dependency; importing here keeps `import dapo_megatron.logging`
        # fast (it pulls in protobuf and numpy) for processes that never log.
        from tensorboardX import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer_cls = SummaryWriter
        self._resume = resume
        self._writer: Any = None

    def log(self, step: int, metrics: Mapping[str, float], *, wall_time: float) -> None:
        """Add one scalar per metric; flushed now so a killed run keeps its curves."""
        if self._writer is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._writer = self._writer_cls(
                logdir=str(self.log_dir), purge_step=step if self._resume else None
            )
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step, walltime=wall_time)
        self._writer.flush()

    def close(self, *, failed: bool) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbSink:
    """A Weights & Biases run named after the dapo-megatron run.

    W&B drops points whose step is below the run's last logged step, so after a resume
    the steps between the checkpoint and the crash are not rewritten there (metrics.jsonl
    and TensorBoard are); new steps continue the same W&B run.
    """

    name = "wandb"

    def __init__(
        self,
        wandb: ModuleType,
        *,
        project: str,
        run_name: str,
        wandb_dir: Path,
        resume_id: str | None,
    ) -> None:
        kwargs: dict[str, Any] = {"project": project, "name": run_name, "dir": str(wandb_dir)}
        if resume_id is not None:
            # "allow": reopen the run if the server still has it, else start it afresh.
            kwargs.update(id=resume_id, resume="allow")
        Path(wandb_dir).mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(**kwargs)
        except Exception as err:
            raise RuntimeError(
                f"logger.wandb_enabled: wandb.init(project={project!r}) failed: {err}. "
                "Run `wandb login` (or set WANDB_API_KEY / WANDB_MODE=offline), "
                "or set logger.wandb_enabled=false"
            ) from err
        self.run_id: str = str(self._run.id)

    def log(self, step: int, metrics: Mapping[str, float], *, wall_time: float) -> None:
        """``run.log`` at ``step``; W&B stores NaN/inf as given."""
        self._run.log(dict(metrics), step=step)

    def close(self, *, failed: bool) -> None:
        """Finish the run, marking it failed when the run ends with an exception."""
        self._run.finish(exit_code=1 if failed else 0)


class MlflowSink:
    """An MLflow run in the tracking server's default experiment."""

    name = "mlflow"

    def __init__(
        self,
        mlflow: ModuleType,
        *,
        tracking_uri: str | None,
        run_name: str,
        resume_id: str | None,
    ) -> None:
        self._mlflow = mlflow
        try:
            if tracking_uri is not None:
                mlflow.set_tracking_uri(tracking_uri)
            if resume_id is not None:
                active = mlflow.start_run(run_id=resume_id)
            else:
                active = mlflow.start_run(run_name=run_name)
        except Exception as err:
            uri = tracking_uri or "MLflow's default (MLFLOW_TRACKING_URI or ./mlruns)"
            raise RuntimeError(
                f"logger.mlflow_enabled: could not start an MLflow run at {uri}: {err}. "
                "Check logger.mlflow_tracking_uri, or set logger.mlflow_enabled=false"
            ) from err
        self.run_id: str = str(active.info.run_id)

    def log(self, step: int, metrics: Mapping[str, float], *, wall_time: float) -> None:
        """``mlflow.log_metrics`` at ``step`` (one request per step, not per metric)."""
        self._mlflow.log_metrics(dict(metrics), step=step)

    def close(self, *, failed: bool) -> None:
        """End the run with status FINISHED or FAILED."""
        self._mlflow.end_run(status="FAILED" if failed else "FINISHED")
