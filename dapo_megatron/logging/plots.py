"""PNG plots of a run's main curves, drawn from its metrics.jsonl.

One file per topic (reward, accuracy, dynamic sampling, response length, optimisation,
step time), each panel one or more metrics against the step. Metrics a run did not log
are skipped, and so are panels and figures left empty, so the same code serves a tiny
CPU run that logs five metrics and a cluster run that logs fifty.

Rendering uses matplotlib's Agg canvas directly, never pyplot: pyplot would pick (and
switch) the process-global backend, which needs no display here but can still surprise a
caller running in a notebook or a GUI session.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from dapo_megatron.logging import keys
from dapo_megatron.logging.jsonl import read_metrics

__all__ = ["FIGURES", "write_plots"]

# Below this many points a series gets markers: validation curves have few, sparse points
# that a bare line would hide.
_MARKER_MAX_POINTS = 50


@dataclass(frozen=True)
class Panel:
    """One axes: the metrics drawn on it and the y-axis label."""

    title: str
    metrics: tuple[str, ...]
    ylabel: str


@dataclass(frozen=True)
class FigureSpec:
    """One PNG file: its name and its panels, stacked top to bottom over a shared step axis."""

    filename: str
    title: str
    panels: tuple[Panel, ...]


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec(
        "reward.png",
        "Reward",
        (Panel("Reward", (keys.REWARD_RAW_MEAN, keys.REWARD_SHAPED_MEAN), "reward"),),
    ),
    FigureSpec(
        "accuracy.png",
        "Accuracy",
        (Panel("Accuracy (train and validation)", (keys.REWARD_ACC, keys.VAL_ACC), "accuracy"),),
    ),
    FigureSpec(
        "dynamic_sampling.png",
        "Dynamic sampling",
        (
            Panel("Keep rate", (keys.DS_KEEP_RATE,), "fraction of groups kept"),
            Panel("Generation rounds per step", (keys.DS_NUM_GEN_BATCHES,), "rounds"),
        ),
    ),
    FigureSpec(
        "response_length.png",
        "Response length",
        (
            Panel(
                "Response length", (keys.RESPONSE_LENGTH_MEAN, keys.RESPONSE_LENGTH_MAX), "tokens"
            ),
            Panel("Clip ratio", (keys.RESPONSE_LENGTH_CLIP_RATIO,), "fraction truncated"),
        ),
    ),
    FigureSpec(
        "optimization.png",
        "Optimization",
        (
            Panel("Loss", (keys.LOSS,), "loss"),
            Panel("Policy entropy", (keys.POLICY_ENTROPY,), "nats / token"),
            Panel("Gradient norm", (keys.GRAD_NORM,), "norm"),
            Panel("Learning rate", (keys.LR,), "lr"),
        ),
    ),
    FigureSpec(
        "step_time.png",
        "Step time",
        (Panel("Step time", (keys.STEP_TIME_S,), "seconds"),),
    ),
)
"""Every figure ``write_plots`` may draw; edit here to add a curve."""


def _series(rows: list[dict[str, float]], metric: str) -> tuple[list[int], list[float]]:
    """Steps and finite values of ``metric`` (NaN/inf points are left out, not zeroed)."""
    steps: list[int] = []
    values: list[float] = []
    for row in rows:
        value = row.get(metric)
        if value is not None and math.isfinite(value):
            steps.append(int(row["step"]))
            values.append(float(value))
    return steps, values


def _draw(spec: FigureSpec, rows: list[dict[str, float]], path: Path, run_label: str) -> bool:
    """Render ``spec`` to ``path``; False (and no file) when none of its metrics has data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = []
    for panel in spec.panels:
        series = [(m, *_series(rows, m)) for m in panel.metrics]
        series = [s for s in series if s[1]]
        if series:
            panels.append((panel, series))
    if not panels:
        return False

    fig = Figure(figsize=(8, 2.8 * len(panels) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (panel, series) in zip(axes, panels, strict=True):
        for metric, steps, values in series:
            marker = "o" if len(steps) <= _MARKER_MAX_POINTS else None
            ax.plot(steps, values, label=metric, marker=marker, markersize=3, linewidth=1.2)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    axes[-1].set_xlabel("step")
    fig.suptitle(f"{spec.title} - {run_label}" if run_label else spec.title)
    # Write then rename: a dashboard or viewer polling the file never sees half a PNG.
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, path)
    return True


def write_plots(metrics_jsonl: Path, out_dir: Path) -> list[Path]:
    """Draw the figures of ``FIGURES`` that have data into ``out_dir``; return their paths.

    Tolerant of partial logs: missing metrics, NaN values and sparse (validation-only)
    steps are fine; a run with no metrics yet writes nothing.
    """
    metrics_jsonl = Path(metrics_jsonl)
    out_dir = Path(out_dir)
    rows = read_metrics(metrics_jsonl)
    if not rows:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    run_label = metrics_jsonl.resolve().parent.name
    written = []
    for spec in FIGURES:
        path = out_dir / spec.filename
        if _draw(spec, rows, path, run_label):
            written.append(path)
    return written
