"""MetricsLogger: the controller's one call per step that fans metrics out to every sink.

metrics.jsonl is always written and is the source of truth: its errors propagate. The
optional sinks (TensorBoard, W&B, MLflow) are conveniences whose failures (a full disk
for event files, an unreachable MLflow server) must not kill a multi-day run, so a
failing sink is reported with a warning and the step continues. Configuration problems
(a missing package, a W&B login that fails) are raised at construction, before step one.

Used in the controller process only; not thread-safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from dapo_megatron.config.schema_run import LoggerConfig
from dapo_megatron.logging.jsonl import (
    METRICS_FILENAME,
    SFT_METRICS_FILENAME,
    JsonlWriter,
    to_float_metrics,
)
from dapo_megatron.logging.sinks import (
    MlflowSink,
    Sink,
    TensorBoardSink,
    WandbSink,
    import_optional,
    load_logger_state,
    save_logger_state,
)

__all__ = ["MetricsLogger"]

_log = logging.getLogger(__name__)

# A sink that is down for hours would otherwise print one warning per step.
_WARN_EVERY_N_FAILURES = 100


class MetricsLogger:
    """Fans the metrics of each step out to metrics.jsonl and the enabled sinks.

    Layout: ``<run_dir>/metrics.jsonl``; TensorBoard under ``<log_dir>/tensorboard`` and
    W&B files under ``<log_dir>/wandb``, where ``log_dir`` is ``logger.log_dir`` or
    ``<run_dir>/logs``; plots (``logger.plots``) in ``<run_dir>/plots`` on ``close``.

    With ``resume=True`` the first step logged is taken as the resume point: lines and
    TensorBoard events at or after it from the earlier attempt are dropped, and the W&B /
    MLflow runs of the earlier attempt are reopened.

    The SFT warm-up's steps (``log_sft``) go to ``<run_dir>/sft_metrics.jsonl`` only: its
    step numbers would collide with the DAPO steps in every other sink. ``plot_labels``
    overrides legend labels of the plots (``keys.PLOT_LABELS``).
    """

    def __init__(
        self,
        config: LoggerConfig,
        *,
        run_dir: Path,
        run_name: str,
        resume: bool,
        plot_labels: Mapping[str, str] | None = None,
    ) -> None:
        # Import the optional packages before creating anything, so a config error leaves
        # no half-open W&B run or truncated metrics.jsonl behind.
        wandb = mlflow = None
        if config.wandb_enabled:
            wandb = import_optional("wandb", config_key="logger.wandb_enabled", pip_package="wandb")
        if config.mlflow_enabled:
            mlflow = import_optional(
                "mlflow", config_key="logger.mlflow_enabled", pip_package="mlflow"
            )

        self.config = config
        self.run_dir = Path(run_dir)
        self.log_dir = Path(config.log_dir) if config.log_dir else self.run_dir / "logs"
        self.metrics_path = self.run_dir / METRICS_FILENAME
        self.sft_metrics_path = self.run_dir / SFT_METRICS_FILENAME
        self.plots_dir = self.run_dir / "plots"
        self._plot_labels = dict(plot_labels or {})
        self._sft: JsonlWriter | None = None
        self._last_step: int | None = None
        self._failures: dict[str, int] = {}
        self._closed = False
        self._sinks: list[Sink] = []

        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._open_sinks(wandb, mlflow, run_name=run_name, resume=resume)
        except BaseException:
            self._close_sinks(failed=True)
            raise
        self._jsonl = JsonlWriter(self.metrics_path, resume=resume)

    def _open_sinks(self, wandb: Any, mlflow: Any, *, run_name: str, resume: bool) -> None:
        config = self.config
        if config.tensorboard_enabled:
            self._sinks.append(TensorBoardSink(self.log_dir / "tensorboard", resume=resume))
        if wandb is None and mlflow is None:
            return
        state = load_logger_state(self.run_dir) if resume else {}
        if wandb is not None:
            wandb_sink = WandbSink(
                wandb,
                project=config.wandb_project,
                run_name=run_name,
                wandb_dir=self.log_dir / "wandb",
                resume_id=state.get("wandb_run_id"),
            )
            self._sinks.append(wandb_sink)
            state["wandb_run_id"] = wandb_sink.run_id
        if mlflow is not None:
            mlflow_sink = MlflowSink(
                mlflow,
                tracking_uri=config.mlflow_tracking_uri,
                run_name=run_name,
                resume_id=state.get("mlflow_run_id"),
            )
            self._sinks.append(mlflow_sink)
            state["mlflow_run_id"] = mlflow_sink.run_id
        save_logger_state(self.run_dir, state)

    @property
    def tensorboard_dir(self) -> Path:
        """Where TensorBoard event files go (whether or not TensorBoard is enabled)."""
        return self.log_dir / "tensorboard"

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record the metrics of ``step`` in every sink.

        Log each step once with all its metrics (validation included); a second call for
        the same step is allowed and merged by ``read_metrics``. Steps must not decrease:
        that would mean the controller's step counter is wrong.
        """
        if self._closed:
            raise RuntimeError("MetricsLogger.log called after close()")
        if type(step) is not int or step < 0:
            raise TypeError(f"step must be a non-negative int, got {step!r}")
        if self._last_step is not None and step < self._last_step:
            raise ValueError(f"step {step} logged after step {self._last_step}")
        values = to_float_metrics(metrics)
        wall_time = time.time()
        self._jsonl.write(step, values, wall_time=wall_time)
        self._last_step = step
        for sink in self._sinks:
            try:
                sink.log(step, values, wall_time=wall_time)
            except Exception as err:
                self._warn_failure(sink.name, step, err)

    def log_sft(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record SFT warm-up step ``step`` (1-based) in sft_metrics.jsonl.

        The file starts afresh with the first call: a warm-up runs whole, only on a run's
        fresh start (a restart before the first checkpoint runs it again).
        """
        if self._closed:
            raise RuntimeError("MetricsLogger.log_sft called after close()")
        if self._sft is None:
            self._sft = JsonlWriter(self.sft_metrics_path, resume=False)
        self._sft.write(step, to_float_metrics(metrics), wall_time=time.time())

    def _warn_failure(self, name: str, step: int, err: Exception) -> None:
        count = self._failures.get(name, 0) + 1
        self._failures[name] = count
        if count == 1 or count % _WARN_EVERY_N_FAILURES == 0:
            _log.warning(
                "metrics sink %s failed at step %d (%d failure(s) so far; metrics.jsonl "
                "is unaffected): %s: %s",
                name,
                step,
                count,
                type(err).__name__,
                err,
            )

    def _close_sinks(self, *, failed: bool) -> None:
        for sink in self._sinks:
            try:
                sink.close(failed=failed)
            except Exception as err:
                _log.warning("closing metrics sink %s failed: %s", sink.name, err)
        self._sinks = []

    def close(self, *, failed: bool = False) -> None:
        """Close every sink and, if ``logger.plots``, write the PNG plots; idempotent.

        ``failed`` marks the W&B / MLflow runs as failed (the context manager sets it when
        the block raises). Plot errors are warnings: they must not mask the run's result.
        """
        if self._closed:
            return
        self._closed = True
        self._close_sinks(failed=failed)
        self._jsonl.close()
        if self._sft is not None:
            self._sft.close()
        if self.config.plots and (self.metrics_path.exists() or self.sft_metrics_path.exists()):
            # Imported here: matplotlib costs ~0.5 s and is needed once, at the end.
            from dapo_megatron.logging.plots import write_plots

            try:
                write_plots(self.metrics_path, self.plots_dir, self._plot_labels)
            except Exception as err:
                _log.warning("writing plots to %s failed: %s", self.plots_dir, err)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)
