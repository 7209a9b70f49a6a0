"""PNG plots of a run's main curves, drawn from its metrics.jsonl (and sft_metrics.jsonl).

One file per topic (SFT warm-up, reward, accuracy, dynamic sampling, response length,
optimisation, step time), each panel one or more metrics against the step. Metrics a run
did not log are skipped, and so are panels and figures left empty, so the same code serves
a tiny CPU run that logs five metrics and a cluster run that logs fifty.

The figures are for people, not for the key list: legends use ``keys.PLOT_LABELS`` (the
caller may override labels, e.g. to say whether validation is greedy), the accuracy plot
tells the sampled training accuracy from the validation accuracy and shades one standard
error around the latter, and a panel of fractions never shows a y-axis below 0 (a band or
the autoscale margin would otherwise suggest negative accuracies).

Rendering uses matplotlib's Agg canvas directly, never pyplot: pyplot would pick (and
switch) the process-global backend, which needs no display here but can still surprise a
caller running in a notebook or a GUI session.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dapo_megatron.logging import keys
from dapo_megatron.logging.jsonl import SFT_METRICS_FILENAME, read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["FIGURES", "build_figures", "write_plots"]

# Below this many points a series gets markers: validation curves have few, sparse points
# that a bare line would hide.
_MARKER_MAX_POINTS = 50


@dataclass(frozen=True)
class Panel:
    """One axes: the metrics drawn on it and the y-axis label.

    ``fraction``: the values lie in [0, 1], so the axis starts at 0. ``bands`` maps a
    metric to the metric holding its standard error, drawn as a shaded band of +-1 SE.
    ``zero_note``: written on the panel when every value is 0 (the common, good case of a
    rate such as truncation), so a flat line on the x-axis does not read as "no data".
    """

    title: str
    metrics: tuple[str, ...]
    ylabel: str
    fraction: bool = False
    bands: Mapping[str, str] = field(default_factory=dict)
    zero_note: str = ""


@dataclass(frozen=True)
class FigureSpec:
    """One PNG file: its name and its panels, stacked top to bottom over a shared step axis.

    ``source``: ``"metrics"`` (metrics.jsonl, DAPO steps) or ``"sft"`` (sft_metrics.jsonl,
    SFT warm-up steps).
    """

    filename: str
    title: str
    panels: tuple[Panel, ...]
    source: str = "metrics"
    xlabel: str = "DAPO step"


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec(
        "sft_warmup.png",
        "SFT warm-up",
        (Panel("Supervised loss on the reference answers", (keys.SFT_NLL,), "nats / token"),),
        source="sft",
        xlabel="SFT step",
    ),
    FigureSpec(
        "reward.png",
        "Reward",
        (
            Panel(
                "Mean score of the samples trained on (raw and shaped)",
                (keys.REWARD_RAW_MEAN, keys.REWARD_SHAPED_MEAN),
                "reward",
            ),
        ),
    ),
    FigureSpec(
        "accuracy.png",
        "Accuracy",
        (
            Panel(
                "Sampled training rollouts vs validation (shaded: ±1 standard error)",
                (keys.REWARD_ACC, keys.VAL_ACC),
                "fraction correct",
                fraction=True,
                bands={keys.VAL_ACC: keys.VAL_ACC_STDERR},
            ),
        ),
    ),
    FigureSpec(
        "dynamic_sampling.png",
        "Dynamic sampling",
        (
            Panel(
                "Keep rate (groups whose rewards vary)",
                (keys.DS_KEEP_RATE,),
                "fraction of groups",
                fraction=True,
            ),
            Panel("Generation rounds per step", (keys.DS_NUM_GEN_BATCHES,), "rounds"),
        ),
    ),
    FigureSpec(
        "response_length.png",
        "Response length",
        (
            Panel(
                "Mean and longest response",
                (keys.RESPONSE_LENGTH_MEAN, keys.RESPONSE_LENGTH_MAX),
                "tokens",
            ),
            Panel(
                "Truncated responses",
                (keys.RESPONSE_LENGTH_CLIP_RATIO,),
                "fraction of responses",
                fraction=True,
                zero_note="none: every response ended before generation.max_response_length",
            ),
        ),
    ),
    FigureSpec(
        "optimization.png",
        "Optimization",
        (
            Panel("Loss", (keys.LOSS,), "loss"),
            Panel("Policy entropy", (keys.POLICY_ENTROPY,), "nats / token"),
            Panel("Gradient norm", (keys.GRAD_NORM,), "norm"),
            Panel("Learning rate", (keys.LR,), "learning rate"),
        ),
    ),
    FigureSpec(
        "step_time.png",
        "Step time",
        (Panel("Wall-clock time per step", (keys.STEP_TIME_S,), "seconds"),),
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


def _band(
    rows: list[dict[str, float]], metric: str, stderr: str
) -> tuple[list[int], list[float], list[float]]:
    """Steps, lower and upper edges of ``metric`` +- its standard error where both are
    finite."""
    steps: list[int] = []
    low: list[float] = []
    high: list[float] = []
    for row in rows:
        value, err = row.get(metric), row.get(stderr)
        if value is None or err is None or not (math.isfinite(value) and math.isfinite(err)):
            continue
        steps.append(int(row["step"]))
        low.append(value - err)
        high.append(value + err)
    return steps, low, high


def _label(metric: str, labels: Mapping[str, str]) -> str:
    return labels.get(metric) or keys.PLOT_LABELS.get(metric, metric)


def build_figure(
    spec: FigureSpec,
    rows: list[dict[str, float]],
    run_label: str = "",
    labels: Mapping[str, str] | None = None,
) -> Figure | None:
    """The figure of ``spec`` drawn from ``rows``, or None when none of its metrics has data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = labels or {}
    panels = []
    for panel in spec.panels:
        series = [(m, *_series(rows, m)) for m in panel.metrics]
        series = [s for s in series if s[1]]
        if series:
            panels.append((panel, series))
    if not panels:
        return None

    fig = Figure(figsize=(8, 2.8 * len(panels) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (panel, series) in zip(axes, panels, strict=True):
        for metric, steps, values in series:
            marker = "o" if len(steps) <= _MARKER_MAX_POINTS else None
            (line,) = ax.plot(
                steps,
                values,
                label=_label(metric, labels),
                marker=marker,
                markersize=3,
                linewidth=1.2,
                # A fraction axis starts at 0: a series of zeros (no truncated response)
                # lies on the x-axis, where clipping halves it and the spine hides it.
                clip_on=not panel.fraction,
                zorder=3,
            )
            if metric in panel.bands:
                b_steps, low, high = _band(rows, metric, panel.bands[metric])
                if b_steps:
                    ax.fill_between(
                        b_steps,
                        low,
                        high,
                        color=line.get_color(),
                        alpha=0.2,
                        linewidth=0,
                        label="±1 standard error (validation)",
                    )
        if panel.fraction:
            # Set after drawing: the band and the autoscale margin may reach below 0.
            ax.set_ylim(bottom=0.0, top=max(ax.get_ylim()[1], 0.05))
        if panel.zero_note and all(v == 0 for _, _, values in series for v in values):
            ax.text(0.5, 0.5, panel.zero_note, transform=ax.transAxes, ha="center", fontsize=9)
        if panel.title != spec.title:  # one figure, one title: the suptitle says it already
            ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    axes[-1].set_xlabel(spec.xlabel)
    fig.suptitle(f"{spec.title} - {run_label}" if run_label else spec.title)
    return fig


def build_figures(
    metrics_jsonl: Path,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Figure]:
    """The figures of ``FIGURES`` that have data, by file name, from a run's metrics.jsonl
    and the sft_metrics.jsonl beside it (when the run had an SFT warm-up)."""
    metrics_jsonl = Path(metrics_jsonl)
    sources = {
        "metrics": read_metrics(metrics_jsonl) if metrics_jsonl.exists() else [],
        "sft": _read_if_present(metrics_jsonl.parent / SFT_METRICS_FILENAME),
    }
    run_label = metrics_jsonl.resolve().parent.name
    figures = {}
    for spec in FIGURES:
        fig = build_figure(spec, sources[spec.source], run_label, labels)
        if fig is not None:
            figures[spec.filename] = fig
    return figures


def _read_if_present(path: Path) -> list[dict[str, float]]:
    return read_metrics(path) if path.exists() else []


def write_plots(
    metrics_jsonl: Path, out_dir: Path, labels: Mapping[str, str] | None = None
) -> list[Path]:
    """Draw the figures of ``FIGURES`` that have data into ``out_dir``; return their paths.

    Tolerant of partial logs: missing metrics, NaN values and sparse (validation-only)
    steps are fine; a run with no metrics yet writes nothing. ``labels`` overrides legend
    labels of ``keys.PLOT_LABELS``.
    """
    figures = build_figures(Path(metrics_jsonl), labels)
    if not figures:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, fig in figures.items():
        path = out_dir / filename
        # Write then rename: a dashboard or viewer polling the file never sees half a PNG.
        tmp = path.with_name(path.name + ".tmp")
        fig.savefig(tmp, format="png", dpi=100)
        os.replace(tmp, path)
        written.append(path)
    return written
