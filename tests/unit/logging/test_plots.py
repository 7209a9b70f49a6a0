"""The plots (logging/plots.py): every figure drawn as PNG with Agg, missing metrics
skipped, and figures that read for people: labels, the validation band, fraction axes, SFT."""

from __future__ import annotations

import io
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

from dapo_megatron.logging import METRIC_KEYS, keys
from dapo_megatron.logging.plots import FIGURES, build_figures, write_plots


def write_run(run_dir: Path, steps: int = 20) -> Path:
    """A run whose accuracies sit near 0 (an untrained policy): the band and the
    autoscale margin would reach below 0 on an unclamped axis."""
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = run_dir / "metrics.jsonl"
    rows: list[dict[str, Any]] = [{"step": 0, keys.VAL_ACC: 0.01, keys.VAL_ACC_STDERR: 0.02}]
    for step in range(1, steps + 1):
        row: dict[str, Any] = {
            "step": step,
            keys.REWARD_RAW_MEAN: 0.02 * step,
            keys.REWARD_ACC: 0.02 * step,
            keys.DS_KEEP_RATE: 0.05,
            keys.RESPONSE_LENGTH_CLIP_RATIO: 0.0,
            keys.LOSS: math.sin(step),
        }
        if step % 5 == 0:
            row[keys.VAL_ACC] = 0.03 * step
            row[keys.VAL_ACC_STDERR] = 0.04
        rows.append(row)
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    sft = run_dir / "sft_metrics.jsonl"
    sft.write_text(
        "".join(json.dumps({"step": s, keys.SFT_NLL: 4.0 / s}) + "\n" for s in range(1, 31)),
        encoding="utf-8",
    )
    return metrics


def legend_labels(ax: Any) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_legends_use_human_labels_not_metric_keys(tmp_path):
    figures = build_figures(write_run(tmp_path / "run"))
    for name, fig in figures.items():
        for ax in fig.axes:
            for label in legend_labels(ax):
                assert label not in keys.METRIC_KEYS and "/" not in label, (name, label)
    (acc_ax,) = figures["accuracy.png"].axes
    labels = legend_labels(acc_ax)
    assert "training accuracy (sampled rollouts)" in labels
    assert any(label.startswith("validation accuracy") for label in labels)
    assert "±1 standard error (validation)" in labels


def test_validation_label_says_how_it_samples(tmp_path):
    metrics = write_run(tmp_path / "run")
    greedy = "validation accuracy (greedy, held-out prompts)"
    (acc_ax,) = build_figures(metrics, {keys.VAL_ACC: greedy})["accuracy.png"].axes
    assert greedy in legend_labels(acc_ax)


def test_validation_stderr_is_a_band_around_its_curve(tmp_path):
    (acc_ax,) = build_figures(write_run(tmp_path / "run"))["accuracy.png"].axes
    (band,) = acc_ax.collections  # fill_between's PolyCollection
    val_line = next(x for x in acc_ax.get_lines() if x.get_label().startswith("validation"))
    assert band.get_facecolor()[0][:3].tolist() == list(_rgb(val_line.get_color()))
    vertices = band.get_paths()[0].vertices
    # Steps 0, 5, 10, 15, 20; at step 20: 0.6 +- 0.04.
    assert vertices[:, 0].min() == 0 and vertices[:, 0].max() == 20
    assert math.isclose(vertices[:, 1].max(), 0.64)
    assert math.isclose(vertices[:, 1].min(), 0.01 - 0.02)  # below 0 in data ...


def test_fraction_axes_never_go_below_zero(tmp_path):
    figures = build_figures(write_run(tmp_path / "run"))
    fraction_titles = {
        (spec.filename, panel.title) for spec in FIGURES for panel in spec.panels if panel.fraction
    }
    accuracy = next(spec for spec in FIGURES if spec.filename == "accuracy.png")
    assert ("accuracy.png", accuracy.panels[0].title) in fraction_titles
    checked = 0
    for name, fig in figures.items():
        for ax in fig.axes:
            if (name, ax.get_title()) in fraction_titles:
                bottom, top = ax.get_ylim()
                assert bottom == 0.0 and top > 0, (name, ax.get_title())  # ... not on the axis
                checked += 1
    assert checked == 3  # accuracy, keep rate, clip ratio (all zero: still a visible axis)


def test_sft_warmup_has_its_own_plot(tmp_path):
    metrics = write_run(tmp_path / "run")
    figures = build_figures(metrics)
    (ax,) = figures["sft_warmup.png"].axes
    assert ax.get_xlabel() == "SFT step"
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == list(range(1, 31))
    assert legend_labels(ax) == ["answer NLL per token"]
    assert figures["accuracy.png"].axes[0].get_xlabel() == "DAPO step"
    written = write_plots(metrics, tmp_path / "plots")
    assert (tmp_path / "plots" / "sft_warmup.png") in written


def test_sft_plot_alone_when_no_dapo_step_was_logged(tmp_path):
    metrics = write_run(tmp_path / "run")
    metrics.unlink()  # stopped during the warm-up
    assert list(build_figures(metrics)) == ["sft_warmup.png"]


def _rgb(color: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(color)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --- plots -----------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def write_synthetic_run(path: Path, steps: int = 30) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for step in range(1, steps + 1):
            row: dict[str, Any] = {"step": step, "time": 1000.0 + step}
            for i, key in enumerate(METRIC_KEYS):
                row[key] = math.sin(step / 5 + i)
            row[keys.GRAD_NORM] = None if step == 7 else 1.0  # a NaN point
            if step % 10:
                del row[keys.VAL_ACC]  # validation every 10 steps only
            f.write(json.dumps(row) + "\n")


def test_write_plots_draws_every_figure_as_png_with_agg(tmp_path, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    agg_writes: list[str] = []
    real_print_png = FigureCanvasAgg.print_png

    # matplotlib passes extra savefig kwargs (orientation, ...) to print methods that are
    # not its own; the real one does not take them.
    def spy(self: FigureCanvasAgg, target: Any, *, metadata: Any = None, **_: Any) -> Any:
        if not isinstance(target, io.IOBase):  # constrained layout renders to a buffer first
            agg_writes.append(str(target))
        return real_print_png(self, target, metadata=metadata)

    monkeypatch.setattr(FigureCanvasAgg, "print_png", spy)
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    write_synthetic_run(metrics)
    written = write_plots(metrics, tmp_path / "plots")
    assert sorted(p.name for p in written) == [
        "accuracy.png",
        "dynamic_sampling.png",
        "optimization.png",
        "response_length.png",
        "reward.png",
        "step_time.png",
    ]
    for path in written:
        width, height = png_size(path)
        assert width >= 400 and height >= 200
    assert sorted(Path(w).name for w in agg_writes) == sorted(p.name + ".tmp" for p in written)
    assert sorted(os.listdir(tmp_path / "plots")) == sorted(p.name for p in written)


def test_write_plots_skips_missing_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(
            json.dumps({"step": s, keys.REWARD_RAW_MEAN: s / 10, keys.VAL_ACC: None}) + "\n"
            for s in range(1, 4)
        ),
        encoding="utf-8",
    )
    assert [p.name for p in write_plots(metrics, tmp_path / "plots")] == ["reward.png"]
    metrics.write_text("", encoding="utf-8")
    assert write_plots(metrics, tmp_path / "empty") == []


def tiny_cpu_history(run_dir: Path, steps: int = 20) -> Path:
    """metrics.jsonl as the tiny CPU recipe writes it (dapo-train, 20 steps): step 0 holds
    validation alone; no response ever reaches the 16-token cap, so the truncation rate is
    0.0 on every step."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = [{"step": 0, keys.VAL_ACC: 0.35, keys.VAL_ACC_STDERR: 0.024}]
    for step in range(1, steps + 1):
        rows.append(
            {
                "step": step,
                keys.REWARD_RAW_MEAN: 0.5,
                keys.REWARD_ACC: 0.5,
                keys.RESPONSE_LENGTH_MEAN: 2.8,
                keys.RESPONSE_LENGTH_MAX: 4.0 + step % 3,
                keys.RESPONSE_LENGTH_CLIP_RATIO: 0.0,
                "response_length/cap": 16.0,
                keys.STEP_TIME_S: 0.4,
            }
        )
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return metrics


def test_truncated_responses_panel_shows_its_zeros(tmp_path):
    # Before: the zero series lay on the x-axis of an axis starting at 0, clipped and under
    # the spine, so the panel of a run without truncation looked empty.
    fig = build_figures(tiny_cpu_history(tmp_path / "run"))["response_length.png"]
    ax = next(a for a in fig.axes if a.get_title() == "Truncated responses")
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "responses cut at the length cap"]
    assert list(line.get_xdata()) == list(range(1, 21))
    assert list(line.get_ydata()) == [0.0] * 20
    assert not line.get_clip_on() and line.get_zorder() > ax.spines["bottom"].get_zorder()
    assert [t.get_text() for t in ax.texts] == [
        "none: every response ended before generation.max_response_length"
    ]


def test_a_truncation_rate_above_zero_has_no_zero_note(tmp_path):
    metrics = tiny_cpu_history(tmp_path / "run")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows[-1][keys.RESPONSE_LENGTH_CLIP_RATIO] = 0.25
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    fig = build_figures(metrics)["response_length.png"]
    ax = next(a for a in fig.axes if a.get_title() == "Truncated responses")
    assert len(ax.texts) == 0 and ax.get_lines()[0].get_ydata()[-1] == 0.25


def test_each_figure_says_its_title_once(tmp_path):
    # Before: "Response length" (and "Reward") headed the figure and its first panel.
    figures = build_figures(tiny_cpu_history(tmp_path / "run"))
    assert {"reward.png", "response_length.png"} <= set(figures)
    for spec in FIGURES:
        fig = figures.get(spec.filename)
        if fig is None:
            continue
        texts = [fig.get_suptitle()] + [ax.get_title() for ax in fig.axes]
        assert sum(spec.title.lower() in t.lower().split(" - ")[0] for t in texts) == 1, (
            spec.filename,
            texts,
        )
