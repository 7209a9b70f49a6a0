"""The figures of bench/gpu_run.py, from a run's metrics rows: pure arithmetic, no torch.

Phase times are the loop's own (``timing/step_s``, ``timing/generate_s``,
``timing/logprob_s``, ``timing/train_s``: controller/loop.py, controller/rollouts/steps.py), as the
median over the timed steps (the first step, with its warm-ups and compilation, dropped
when there is more than one). Model FLOPs follow the usual dense-transformer count: per
token 2 x N forward and 6 x N forward + backward, N the parameters of the matrix products
(every weight but the input embedding; with tied embeddings the shared matrix is the
output layer's), plus the causal attention's QK^T and AV products, 4 x layers x query width
x (s / 2) per token forward for a sequence of s tokens (and 3x that with the backward).
Sequences are taken at the step's mean length, so the attention term is an estimate.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_KEYS: tuple[str, ...] = (
    "model",
    "params",
    "step_s",
    "generation_s",
    "logprob_s",
    "train_s",
    "generated_tokens_per_s",
    "train_tokens_per_s",
    "train_mfu",
    "logprob_mfu",
    "peak_gib_measured",
    "peak_gib_planned",
    "resume_bit_exact",
    "export_ok",
    "hf_generate_tokens_per_s",
    "phases_done",
    "partial",
)
"""Exactly the keys of each model's entry in the JSON (``models[<preset>]``). An entry is
written once its timed run is done; ``phases_done`` lists the phases done, in order
(``checkpoint``, ``kernel_check`` on CUDA, ``timed``, ``resume``, ``export``,
``hf_generate``; a figure of a phase not done is null) and ``partial`` is whether one of
timed, resume, export and hf_generate is missing (stopped, failed or skipped: ``details``
says why)."""

PHASES: tuple[str, ...] = ("generation", "logprob", "train")
"""The phases measured by the policy worker (device/phase_memory.py) and planned."""

RESUME_KEYS: tuple[str, ...] = (
    "loss",
    "grad_norm",
    "policy/entropy",
    "reward/acc",
    "reward/shaped_mean",
    "response_length/mean",
    "num_generated_tokens",
    "num_valid_tokens",
    "mismatch/abs_logprob_diff_mean",
    "mismatch/abs_logprob_diff_max",
)
"""Compared exactly between the resumed and the uninterrupted run: everything computed
from the sampled tokens, the trainer's logprobs and the update, not wall time."""


@dataclass(frozen=True)
class Peak:
    """A card's dense bf16 peak, the denominator of MFU."""

    name: str
    tflops: float


# NVIDIA's data-sheet figures, dense (without 2:4 sparsity) bf16 tensor-core throughput.
_PEAKS: tuple[tuple[str, Peak], ...] = (
    (r"H100.*PCIe", Peak("H100 PCIe dense bf16 (NVIDIA data sheet)", 756.0)),
    (r"H100|H800", Peak("H100 SXM dense bf16 (NVIDIA data sheet)", 989.0)),
    (r"H200", Peak("H200 dense bf16 (NVIDIA data sheet, as H100 SXM)", 989.0)),
    (r"A100", Peak("A100 dense bf16 (NVIDIA data sheet)", 312.0)),
)


def peak_for(device_name: str | None) -> Peak | None:
    """The dense bf16 peak of a CUDA device by name; None for a CPU or an unknown card."""
    if not device_name:
        return None
    for pattern, peak in _PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peak
    return None


def device_slug(device_name: str | None) -> str:
    """``bench/results/gpu_run_<slug>.json``: h100, h200, a100 or a slug of the name;
    ``cpu`` without a CUDA device."""
    if not device_name:
        return "cpu"
    for card in ("h200", "h100", "a100", "l40s", "b200"):
        if card in device_name.lower():
            return card
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_") or "gpu"


@dataclass(frozen=True)
class Shape:
    """What the FLOP count needs of a model."""

    matmul_params: int
    """Parameters of the matrix products (module docstring)."""
    num_layers: int
    query_width: int
    """Attention heads x head size."""


def matmul_params(total: int, vocab: int, hidden: int, tied: bool) -> int:
    """Matrix-product parameters: all but an untied input embedding (a lookup)."""
    return total if tied else total - vocab * hidden


def forward_flops(shape: Shape, tokens: float, mean_seq_len: float) -> float:
    """Forward FLOPs of ``tokens`` tokens in sequences of ``mean_seq_len`` tokens."""
    dense = 2.0 * shape.matmul_params * tokens
    attention = 4.0 * shape.num_layers * shape.query_width * (mean_seq_len / 2.0) * tokens
    return dense + attention


def train_flops(shape: Shape, tokens: float, mean_seq_len: float) -> float:
    """Forward + backward FLOPs (3x the forward; no recomputation)."""
    return 3.0 * forward_flops(shape, tokens, mean_seq_len)


def mfu(flops: float, seconds: float, peak: Peak | None) -> float | None:
    """Model FLOPs per second over the peak; None without a known peak or time."""
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / (peak.tflops * 1e12)


def timed_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The training steps of a metrics.jsonl, the first dropped when there are several."""
    steps = [r for r in rows if r.get("step", 0) > 0 and "timing/step_s" in r]
    return steps[1:] if len(steps) > 1 else steps


def median_of(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """Median of ``key`` over the rows that hold it; None when none does."""
    values = [float(r[key]) for r in rows if key in r]
    return statistics.median(values) if values else None


def step_figures(
    rows: Sequence[Mapping[str, Any]],
    *,
    shape: Shape,
    samples_per_step: int,
    mean_prompt_tokens: float,
    peak: Peak | None,
) -> dict[str, float | None]:
    """Phase times, throughputs and MFU of a run (median over the timed steps).

    Training tokens are the whole sequences (prompt + response) the trainer runs forward
    and backward: the step's response tokens plus ``samples_per_step`` prompts.
    """
    timed = timed_rows(rows)
    if not timed:
        raise ValueError("no training step in the metrics")
    step_s = median_of(timed, "timing/step_s")
    gen_s = median_of(timed, "timing/generate_s")
    logprob_s = median_of(timed, "timing/logprob_s")
    train_s = median_of(timed, "timing/train_s")
    generated = median_of(timed, "num_generated_tokens") or 0.0
    response = median_of(timed, "num_valid_tokens") or generated
    tokens = response + samples_per_step * mean_prompt_tokens
    seq_len = tokens / samples_per_step
    gen_tps = generated / gen_s if gen_s else None
    train_tps = tokens / train_s if train_s else None
    return {
        "step_s": step_s,
        "generation_s": gen_s,
        "logprob_s": logprob_s,
        "train_s": train_s,
        "generated_tokens_per_s": gen_tps,
        "train_tokens_per_s": train_tps,
        "train_mfu": mfu(train_flops(shape, tokens, seq_len), train_s or 0.0, peak),
        "logprob_mfu": mfu(forward_flops(shape, tokens, seq_len), logprob_s or 0.0, peak),
        "train_tokens_per_step": tokens,
        "mean_seq_len": seq_len,
    }


def measured_peaks(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]] | None:
    """Per phase, the largest allocated / reserved GiB the policy rank reported
    (``memory/<phase>_peak_*_gib``); None when the run logged none (CPU)."""
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        for kind in ("allocated", "reserved"):
            key = f"memory/{phase}_peak_{kind}_gib"
            values = [float(r[key]) for r in rows if key in r]
            if values:
                out.setdefault(phase, {})[kind] = round(max(values), 3)
    return out or None


def resume_mismatches(
    straight: Mapping[str, Any], resumed: Mapping[str, Any], keys: Sequence[str] = RESUME_KEYS
) -> list[str]:
    """The keys whose values differ between the same step of two runs (a key missing
    from both is skipped; missing from one is a mismatch)."""
    bad = []
    for key in keys:
        if key not in straight and key not in resumed:
            continue
        if straight.get(key) != resumed.get(key):
            bad.append(f"{key}: {straight.get(key)!r} != {resumed.get(key)!r}")
    return bad


def model_entry(values: Mapping[str, Any]) -> dict[str, Any]:
    """The model's JSON entry: exactly MODEL_KEYS, in order (a missing one is an error)."""
    missing = [k for k in MODEL_KEYS if k not in values]
    if missing:
        raise KeyError(f"figures missing: {', '.join(missing)}")
    return {k: values[k] for k in MODEL_KEYS}


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The JSON rows of a run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def by_step(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The training-step rows by step number (a resumed run's last row wins)."""
    return {int(r["step"]): r for r in rows if r.get("step", 0) > 0 and "loss" in r}


def fmt(value: Any) -> str:
    """One figure for the summary table (a dict: its values, or their allocated part)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return "/".join(
            fmt(v if not isinstance(v, dict) else v.get("allocated")) for v in value.values()
        )
    return str(value)


def summary_table(models: dict[str, dict[str, Any]]) -> str:
    """The per-model figures as a text table, one row per key."""
    names = list(models)
    rows = [["key", *names]] + [[k, *(fmt(models[m][k]) for m in names)] for k in MODEL_KEYS[1:]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
