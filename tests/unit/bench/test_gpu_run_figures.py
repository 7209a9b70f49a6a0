"""bench/gpu_run_figures.py: the FLOP count, MFU, peaks, step figures and the resume check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import gpu_run_figures as figures  # noqa: E402


def test_peaks_and_slugs_by_device_name():
    assert figures.peak_for("NVIDIA H100 80GB HBM3").tflops == 989.0
    assert figures.peak_for("NVIDIA H100 PCIe").tflops == 756.0
    assert figures.peak_for("NVIDIA H200").tflops == 989.0
    assert figures.peak_for("Some Future GPU") is None
    assert figures.peak_for(None) is None
    assert figures.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert figures.device_slug("NVIDIA H200") == "h200"
    assert figures.device_slug("Tesla V100-SXM2-16GB") == "tesla_v100_sxm2_16gb"
    assert figures.device_slug(None) == "cpu"


def test_flops_follow_6n_plus_attention():
    shape = figures.Shape(matmul_params=1000, num_layers=2, query_width=8)
    # forward: 2 N T + 4 L q (s / 2) T
    assert (
        figures.forward_flops(shape, tokens=10, mean_seq_len=4)
        == 2 * 1000 * 10 + 4 * 2 * 8 * 2 * 10
    )
    assert figures.train_flops(shape, 10, 4) == 3 * figures.forward_flops(shape, 10, 4)
    assert figures.matmul_params(100, vocab=5, hidden=4, tied=True) == 100
    assert figures.matmul_params(100, vocab=5, hidden=4, tied=False) == 80


def test_mfu_needs_a_peak_and_a_time():
    peak = figures.Peak("test", 1.0)  # 1 TFLOP/s
    assert figures.mfu(5e11, 1.0, peak) == pytest.approx(0.5)
    assert figures.mfu(5e11, 1.0, None) is None
    assert figures.mfu(5e11, 0.0, peak) is None


def _row(step, **kw):
    base = {
        "step": step,
        "timing/step_s": 10.0 + step,
        "timing/generate_s": 6.0,
        "timing/logprob_s": 1.0,
        "timing/train_s": 2.0,
        "num_generated_tokens": 600.0,
        "num_valid_tokens": 600.0,
    }
    return {**base, **kw}


def test_step_figures_drop_the_warm_up_step_and_take_medians():
    rows = [{"step": 0, "val/acc": 0.0}, _row(1, **{"timing/train_s": 100.0}), _row(2), _row(3)]
    shape = figures.Shape(matmul_params=1000, num_layers=2, query_width=8)
    peak = figures.Peak("test", 1.0)
    got = figures.step_figures(
        rows, shape=shape, samples_per_step=10, mean_prompt_tokens=4.0, peak=peak
    )
    assert got["step_s"] == 12.5 and got["train_s"] == 2.0  # step 1 (100 s) dropped
    assert got["generated_tokens_per_s"] == 100.0
    tokens = 600.0 + 10 * 4.0
    assert got["train_tokens_per_step"] == tokens and got["mean_seq_len"] == 64.0
    assert got["train_tokens_per_s"] == tokens / 2.0
    assert got["train_mfu"] == pytest.approx(figures.train_flops(shape, tokens, 64.0) / 2.0 / 1e12)
    assert got["logprob_mfu"] == pytest.approx(figures.forward_flops(shape, tokens, 64.0) / 1e12)
    with pytest.raises(ValueError):
        figures.step_figures(
            [{"step": 0}], shape=shape, samples_per_step=1, mean_prompt_tokens=1.0, peak=None
        )


def test_measured_peaks_are_the_largest_per_phase_or_none():
    rows = [
        {"step": 1, "memory/train_peak_allocated_gib": 3.0, "memory/train_peak_reserved_gib": 4.0},
        {
            "step": 2,
            "memory/train_peak_allocated_gib": 5.0,
            "memory/train_peak_reserved_gib": 4.5,
            "memory/generation_peak_allocated_gib": 2.0,
        },
    ]
    assert figures.measured_peaks(rows) == {
        "train": {"allocated": 5.0, "reserved": 4.5},
        "generation": {"allocated": 2.0},
    }
    assert figures.measured_peaks([{"step": 1, "loss": 0.0}]) is None


def test_resume_mismatches_name_each_differing_key():
    a = {"loss": 1.0, "grad_norm": 2.0, "policy/entropy": 3.0}
    assert figures.resume_mismatches(a, dict(a)) == []
    b = {**a, "loss": 1.0000001}
    assert [m.split(":")[0] for m in figures.resume_mismatches(a, b)] == ["loss"]
    c = {k: v for k, v in a.items() if k != "grad_norm"}
    assert [m.split(":")[0] for m in figures.resume_mismatches(a, c)] == ["grad_norm"]


def test_model_entry_has_exactly_the_keys_in_order():
    values = {k: 1 for k in figures.MODEL_KEYS} | {"extra": 2}
    assert list(figures.model_entry(values)) == list(figures.MODEL_KEYS)
    del values["export_ok"]
    with pytest.raises(KeyError, match="export_ok"):
        figures.model_entry(values)
