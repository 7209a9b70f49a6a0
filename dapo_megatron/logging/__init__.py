"""Metrics of a run: sinks (metrics.jsonl always; TensorBoard, W&B, MLflow optional),
progress display, PNG plots, the closing summary, and the workers' output files.

Typical controller use::

    with MetricsLogger(cfg.logger, run_dir=run_dir, run_name=cfg.run.name, resume=resumed) as ml, \\
         StepProgress(total, start_step=first_step - 1, enabled=cfg.logger.progress_bar) as bar:
        for step in range(first_step, total + 1):
            metrics = dapo_step(...)
            ml.log(step, metrics)
            bar.update(step, metrics)

Heavy packages (tensorboardX, matplotlib, tqdm, wandb, mlflow) are imported only when
used, so importing this package is cheap.
"""

from dapo_megatron.logging import keys
from dapo_megatron.logging.jsonl import METRICS_FILENAME, SFT_METRICS_FILENAME, read_metrics
from dapo_megatron.logging.keys import DEFAULT_HEADLINE, METRIC_KEYS
from dapo_megatron.logging.metrics_logger import MetricsLogger
from dapo_megatron.logging.plots import write_plots
from dapo_megatron.logging.progress import StepProgress
from dapo_megatron.logging.summary import format_summary
from dapo_megatron.logging.worker_logs import redirect_worker_output, worker_log_dir

__all__ = [
    "DEFAULT_HEADLINE",
    "METRICS_FILENAME",
    "METRIC_KEYS",
    "SFT_METRICS_FILENAME",
    "MetricsLogger",
    "StepProgress",
    "format_summary",
    "keys",
    "read_metrics",
    "redirect_worker_output",
    "worker_log_dir",
    "write_plots",
]
