"""bench/rollout_efficiency.py's pure summary functions (issue 32): the run record's keys,
the ideal generated-per-trained formula on hand-computed numbers, and the goal ratio lines."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

_PATH = Path(__file__).resolve().parents[3] / "bench" / "rollout_efficiency.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rollout_efficiency_bench", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()


def _step(step: int, **metrics: float) -> dict[str, float]:
    return {"step": step, "timing/step_s": 1.0, **metrics}


def test_ideal_formula_on_hand_computed_numbers() -> None:
    # Without skipping: generated / kept.
    assert bench.ideal_generated_per_trained(25, 100) == pytest.approx(4.0)
    # 50 skipped at precision 0.8: 10 of them would have been kept;
    # k = (30 + 10) / (100 + 50) = 4 / 15.
    assert bench.ideal_generated_per_trained(30, 100, 50, 0.8) == pytest.approx(3.75)
    # A perfect prediction: the skipped prompts would all have been dropped.
    assert bench.ideal_generated_per_trained(30, 100, 50, 1.0) == pytest.approx(5.0)
    assert bench.ideal_generated_per_trained(0, 10) == math.inf


def test_audited_precision_weights_by_audits_scored() -> None:
    rows = [
        _step(1, **{"dynamic_sampling/num_audited": 4, "dynamic_sampling/num_audits_scored": 4,
                    "dynamic_sampling/predicted_zero_var_precision": 1.0}),
        _step(2, **{"dynamic_sampling/num_audited": 5, "dynamic_sampling/num_audits_scored": 2,
                    "dynamic_sampling/predicted_zero_var_precision": 0.5}),
        _step(3, **{"dynamic_sampling/num_audited": 0,
                    "dynamic_sampling/predicted_zero_var_precision": math.nan}),
    ]  # fmt: skip
    assert bench.audited_precision(rows) == pytest.approx(5 / 6)
    # Only the audits drawn logged: they weigh.
    drawn = [
        _step(1, **{"dynamic_sampling/num_audited": 1,
                    "dynamic_sampling/predicted_zero_var_precision": 0.0}),
        _step(2, **{"dynamic_sampling/num_audited": 3,
                    "dynamic_sampling/predicted_zero_var_precision": 1.0}),
    ]  # fmt: skip
    assert bench.audited_precision(drawn) == pytest.approx(0.75)
    assert bench.audited_precision([_step(1)]) == 1.0  # nothing audited


def _rows(skip: bool) -> list[dict[str, float]]:
    """Two steps of 4 prompts x 2 samples, evaluated at steps 0, 1, 2."""
    extra: list[dict[str, float]] = (
        [
            {"dynamic_sampling/num_skipped": 6, "dynamic_sampling/num_audited": 2,
             "dynamic_sampling/num_audits_scored": 2,
             "dynamic_sampling/predicted_zero_var_precision": 0.5},
            {"dynamic_sampling/num_skipped": 4, "dynamic_sampling/num_audited": 0,
             "dynamic_sampling/num_audits_scored": 0},
        ]
        if skip
        else [{}, {}]
    )  # fmt: skip
    return [
        {"step": 0, "val/acc": 0.1, "val/acc_stderr": 0.02},
        _step(
            1,
            **{
                "dynamic_sampling/num_prompts_generated": 6,
                "dynamic_sampling/num_kept_groups_generated": 4,
                "dynamic_sampling/keep_rate": 4 / 6,
                "num_generated_tokens": 120,
                "response_length/mean": 10.0,
                "timing/step_s": 2.0,
                "rollout/num_aborted_groups": 1,
                "val/acc": 0.2,
                "val/acc_stderr": 0.02,
            },
            **extra[0],
        ),
        _step(
            2,
            **{
                "dynamic_sampling/num_prompts_generated": 10,
                "dynamic_sampling/num_kept_groups_generated": 4,
                "dynamic_sampling/keep_rate": 0.4,
                "num_generated_tokens": 200,
                "response_length/mean": 5.0,
                "timing/step_s": 4.0,
                "val/acc": 0.3,
                "val/acc_stderr": 0.04,
            },
            **extra[1],
        ),
    ]


def test_summarise_run_keys_and_values() -> None:
    r = {"variant": "dapo", "seed": 42, **bench.summarise_run(_rows(False), 4, 2)}
    assert set(bench.RUN_KEYS) <= set(r)
    assert r["generated_per_trained"] == pytest.approx(16 / 8)
    assert r["generated_per_trained_with_aborted"] == pytest.approx(17 / 8)
    assert r["ideal_generated_per_trained"] == pytest.approx(16 / 8)
    # 320 generated tokens over (10 + 5) x 4 x 2 = 120 trained.
    assert r["generated_tokens_per_trained_token"] == pytest.approx(320 / 120)
    assert r["step_s"] == pytest.approx(3.0)
    assert r["final_acc"] == pytest.approx(0.2)
    assert r["final_acc_stderr"] == pytest.approx(0.08 / 3)

    s = bench.summarise_run(_rows(True), 4, 2)
    assert s["prompts_skipped"] == 10 and s["audited_precision"] == pytest.approx(0.5)
    # k = (8 + 10 x 0.5) / (16 + 10) = 0.5.
    assert s["ideal_generated_per_trained"] == pytest.approx(2.0)


def _run(variant: str, seed: int, gen: float, ideal: float, step_s: float, acc: float) -> dict:
    return {
        "variant": variant,
        "seed": seed,
        "generated_per_trained": gen,
        "ideal_generated_per_trained": ideal,
        "generated_tokens_per_trained_token": gen,
        "step_s": step_s,
        "final_acc": acc,
        "final_acc_stderr": 0.03,
    }


def test_ratio_lines_and_goals() -> None:
    runs = [
        _run("dapo", 1, 2.0, 2.0, 1.0, 0.20),
        _run("dapo", 2, 2.0, 2.0, 2.0, 0.20),
        _run("skip", 1, 1.5, 3.0, 1.0, 0.20),  # 0.5 of its ideal
        _run("skip", 2, 2.0, 2.5, 2.0, 0.10),  # 0.8; acc 0.1 below = -2.36 stderr
        _run("abort", 1, 2.0, 2.0, 0.7, 0.21),
        _run("abort", 2, 2.0, 2.0, 1.6, 0.20),  # step ratios 0.7 and 0.8
    ]
    summary = bench.summarise(runs, list(bench.VARIANTS))
    assert list(summary) == ["dapo", "skip", "abort"]
    assert summary["skip"]["generated_per_trained"]["mean"] == pytest.approx(1.75)
    assert summary["skip"]["generated_per_trained"]["sd"] == pytest.approx(math.sqrt(0.125))
    lines = bench.ratio_lines(summary)
    assert lines == [
        "skip: generated_per_trained / its ideal = 0.650 [0.500 (seed 1), 0.800 (seed 2)] "
        "(goal <= 0.75: met)",
        "skip: generated_per_trained / dapo's = 0.875 [0.750 (seed 1), 1.000 (seed 2)]",
        "skip: final acc - dapo's = -0.050, in standard errors [+0.00 (seed 1), -2.36 "
        "(seed 2)] (goal |z| <= 2 on every seed: NOT met)",
        "abort: median step_s / dapo's = 0.750 [0.700 (seed 1), 0.800 (seed 2)] "
        "(goal <= 0.80: met)",
        "abort: final acc - dapo's = +0.005, in standard errors [+0.24 (seed 1), +0.00 "
        "(seed 2)] (goal |z| <= 2 on every seed: met)",
    ]
    table = bench.report({"summary": summary})
    assert table.splitlines()[2].startswith("| dapo | 2 | 2.00 ± 0.00 |")
    assert table.endswith(lines[-1])


def test_failed_runs_are_left_out_and_named() -> None:
    runs = [
        _run("dapo", 1, 2.0, 2.0, 1.0, 0.20),
        _run("skip", 1, 1.5, 3.0, 1.0, 0.20),
        {**_run("skip", 2, 9.0, 9.0, 9.0, 0.0), "failed": "error: exhausted"},
    ]
    summary = bench.summarise(runs, list(bench.VARIANTS))
    assert summary["skip"]["seeds"] == [1] and summary["skip"]["failed"] == {2: "error: exhausted"}
    assert summary["skip"]["generated_per_trained"]["mean"] == pytest.approx(1.5)
    lines = bench.ratio_lines(summary)
    assert lines[0] == "skip: seed 2 FAILED (left out above): error: exhausted"
    assert "| skip | 1 (+1 failed) | 1.50 ± 0.00 |" in bench.report({"summary": summary})
    assert bench._error_line("x\nerror: Dynamic sampling exhausted\nTraceback") == (
        "error: Dynamic sampling exhausted"
    )
