"""The few lines a finished run ends with: what was done, how well, and where it is.

Read from the run directory (metrics.jsonl and the paths the caller found), not from the
controller's last step, so a resumed run reports its whole validation history and the
summary says the same thing the files do::

    dapo-train: finished 150/150 steps in 0:42:10
      validation accuracy  0.96 ± 0.0098 at step 150 (0.12 ± 0.016 before training)
      last checkpoint      runs/dapo-tiny-cpu/checkpoints/step_000150
      Hugging Face export  runs/dapo-tiny-cpu/hf/step_000150
      metrics and plots    runs/dapo-tiny-cpu/metrics.jsonl, runs/dapo-tiny-cpu/plots
      worker logs          runs/dapo-tiny-cpu/logs/workers
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from dapo_megatron.logging.jsonl import METRICS_FILENAME, read_metrics
from dapo_megatron.logging.keys import VAL_ACC, VAL_ACC_STDERR
from dapo_megatron.logging.progress import format_val

__all__ = ["Validation", "format_summary", "last_validations"]


@dataclass(frozen=True)
class Validation:
    """One validation measurement: the policy version (step) and its accuracy."""

    step: int
    acc: float
    stderr: float | None

    def text(self) -> str:
        """``0.96 ± 0.0098``: the accuracy and its standard error when known."""
        return format_val(self.acc, self.stderr).replace("±", " ± ")


def last_validations(metrics_jsonl: Path) -> tuple[Validation | None, Validation | None]:
    """(the validation before training, the last validation) in a metrics.jsonl; either
    is None when the run has none (the first when the last is the one at step 0)."""
    if not metrics_jsonl.exists():
        return None, None
    found = []
    for row in read_metrics(metrics_jsonl):
        acc = row.get(VAL_ACC)
        if acc is None or not math.isfinite(acc):
            continue
        stderr = row.get(VAL_ACC_STDERR)
        found.append(Validation(int(row["step"]), float(acc), stderr))
    if not found:
        return None, None
    first = found[0] if found[0].step == 0 and len(found) > 1 else None
    return first, found[-1]


def format_summary(
    run_dir: Path,
    *,
    total_steps: int,
    wall_s: float,
    checkpoint: Path | None,
    export: Path | None,
    worker_logs: Path | None = None,
    plots: Path | None = None,
) -> str:
    """The closing lines of a finished run (see the module docstring).

    ``checkpoint`` / ``export`` / ``worker_logs`` / ``plots``: the paths to name, None
    when the run wrote none (checkpointing or the export disabled).
    """
    metrics = run_dir / METRICS_FILENAME
    rows = read_metrics(metrics) if metrics.exists() else []
    last_step = max((int(r["step"]) for r in rows), default=0)
    lines = [
        f"dapo-train: finished {last_step}/{total_steps} steps in "
        f"{timedelta(seconds=round(wall_s))}"
    ]
    first, last = last_validations(metrics)
    if last is not None:
        val = f"{last.text()} at step {last.step}"
        if first is not None:
            val += f" ({first.text()} before training)"
        lines.append(f"  validation accuracy  {val}")
    lines.append(f"  last checkpoint      {checkpoint if checkpoint else 'none saved'}")
    if export is not None:
        lines.append(f"  Hugging Face export  {export}")
    if plots is not None:
        lines.append(f"  metrics and plots    {metrics}, {plots}")
    else:
        lines.append(f"  metrics              {metrics}")
    if worker_logs is not None:
        lines.append(f"  worker logs          {worker_logs}")
    return "\n".join(lines)
