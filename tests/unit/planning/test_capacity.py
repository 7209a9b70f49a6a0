"""dapo-plan against what a card reports (planning/capacity.py): card names, the default
capacity and the safety margin."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron import cli
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import load_config
from dapo_megatron.planning.capacity import (
    CARDS,
    DEFAULT_GPU_MEM_GIB,
    default_margin_gib,
    parse_gpu_mem,
    reported_cuda_gib,
)
from dapo_megatron.planning.memory import Phase, memory_inputs, plan_memory
from dapo_megatron.planning.memory_terms import GIB
from unit.planning.tiny_inputs import tiny_inputs

REPO = Path(__file__).resolve().parents[3]
ONE_GPU = REPO / "recipes" / "dapo-qwen3-1.7b-1n1g-tp1pp1cp1.yaml"
MIB = 2**20


# ---------------------------------------------------------------------------------------
# Capacity: card names and the default


@pytest.mark.parametrize(
    "text,gib",
    [
        ("h100-80gb", 79.2),
        ("H100", 79.2),  # alias, any case
        ("a100-80gb", 79.2),
        ("h200", 139.8),
        ("a100-40gb", 39.4),
        ("rtx4090", 23.6),
        ("l4", 22.0),
        ("a10g", 22.0),
        ("40", 40.0),
        ("79.5", 79.5),
    ],
)
def test_gpu_mem_takes_gib_or_a_card_name(text, gib):
    assert parse_gpu_mem(text)[0] == gib


def test_card_labels_say_what_was_planned():
    assert parse_gpu_mem("l4") == (22.0, "l4, 22 GiB reported")
    assert parse_gpu_mem("40") == (40.0, "40 GiB")


@pytest.mark.parametrize("text", ["h300", "0", "-3", "nan", ""])
def test_unknown_cards_and_empty_capacities_are_refused(text):
    with pytest.raises(ConfigError) as info:
        parse_gpu_mem(text)
    if text == "h300":
        assert all(name in str(info.value) for name in CARDS)


def test_reported_capacities_sit_below_nvidia_smis_totals():
    # The allocator sees less than nvidia-smi's total (the driver's reservations), which
    # each card's description quotes in GiB ("= 79.6 GiB").
    for card in CARDS.values():
        smi = float(card.description.rsplit("= ", 1)[1].split(" GiB")[0])
        assert smi - 1.0 < card.reported_gib < smi, card.name


def test_default_capacity_is_what_an_80gb_h100_reports(capsys):
    assert DEFAULT_GPU_MEM_GIB == cli.DEFAULT_GPU_MEM_GIB == 79.2
    assert cli.plan_main(["--config", str(ONE_GPU)]) == 0
    out = capsys.readouterr().out
    assert "memory per GPU (79.2 GiB as the allocator reports it, safety margin 4.0 GiB" in out


def test_reported_cuda_gib_is_none_without_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert reported_cuda_gib() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * GIB, 85_045_510_144))
    assert reported_cuda_gib() == pytest.approx(79.205, abs=1e-3)


# ---------------------------------------------------------------------------------------
# The margin rule


@pytest.mark.parametrize(
    "capacity,margin",
    [
        (79.2, 3.96),  # 5 % of an 80 GB H100's reported capacity
        (139.8, 6.99),  # H200
        (40.0, 2.0),  # 5 % == the floor exactly
        (22.0, 2.0),  # 24 GB cards: the 2 GiB floor (5 % would be 1.1)
        (8.0, 2.0),
    ],
)
def test_default_margin_is_five_percent_or_two_gib(capacity, margin):
    assert default_margin_gib(capacity) == pytest.approx(margin)


def test_phase_verdicts_around_the_margin():
    def phase(peak: float) -> Phase:
        return Phase("train", 0, (("weights", peak),), peak, 10.0, (peak,), 2.0)

    fits, edge, within, over = phase(7.5), phase(8.0), phase(8.5), phase(10.5)
    assert fits.fits and fits.verdict == "fits with 2.5 GiB margin"
    assert edge.fits  # peak == capacity - margin still fits
    assert not within.fits and not within.over
    assert within.verdict == "within the 2.0 GiB margin (1.5 GiB left)"
    assert over.over and over.verdict == "DOES NOT FIT in 10 GiB"


def test_a_plan_eating_into_the_margin_does_not_fit():
    # No overheads, no engine: the train phase is the peak, P bytes (hand-derived in
    # planning/test_memory.py). A 1 MiB margin on a GPU of P + 0.5 MiB: under the GPU, inside
    # the margin; on P + 1 MiB it fits exactly.
    peak = plan_memory(tiny_inputs(margin_gib=0.0)).phases[0].peak
    margin = MIB / GIB
    within = plan_memory(tiny_inputs(margin_gib=margin, gpu_mem_gib=peak + margin / 2))
    assert not within.fits and within.within_margin
    assert within.reason.startswith("train phase needs")
    assert "within the 0.0 GiB safety margin" in within.reason
    exact = plan_memory(tiny_inputs(margin_gib=margin, gpu_mem_gib=peak + margin))
    assert exact.fits
    over = plan_memory(tiny_inputs(margin_gib=margin, gpu_mem_gib=peak * 0.99))
    assert not over.fits and not over.within_margin


def test_margin_defaults_to_the_rule_on_gpu_and_zero_on_cpu():
    assert tiny_inputs().margin == pytest.approx(4.0)  # 5 % of 80
    assert tiny_inputs(gpu_mem_gib=22.0).margin == 2.0
    assert tiny_inputs(on_gpu=False).margin == 0.0  # host memory: informative numbers only
    assert tiny_inputs(margin_gib=1.5).margin == 1.5


def test_a_gpu_recipe_just_inside_the_margin_exits_1(capsys):
    # Raise the one-GPU recipe's engine budget until generation leaves 3 GiB of an h100's
    # 79.2 GiB: below the GPU, within the 3.96 GiB margin.
    run = load_config(ONE_GPU).require_plan()
    report = plan_memory(memory_inputs(run, 79.2))
    generation = next(ph for ph in report.phases if ph.name == "generation")
    util = report.inputs.engine.gpu_memory_utilization
    util += (generation.headroom - 3.0) / 79.2
    override = f"generation.engine.gpu_memory_utilization={util:.6f}"
    assert cli.plan_main(["--config", str(ONE_GPU), override]) == 1
    captured = capsys.readouterr()
    assert "within the 4.0 GiB margin (3.0 GiB left)" in captured.out
    assert "memory: within the margin: generation phase needs" in captured.out
    assert "DOES NOT FIT" not in captured.out
    assert captured.err.startswith(
        "error: the recipe does not fit in h100-80gb, 79.2 GiB reported (safety margin 4.0 GiB)"
    )
    # --margin 2 accepts it; --gpu-mem h200 too (with its own budget).
    assert cli.plan_main(["--config", str(ONE_GPU), override, "--margin", "2"]) == 0
    assert cli.plan_main(["--config", str(ONE_GPU), override, "--gpu-mem", "h200"]) == 0
    capsys.readouterr()


def test_margin_flag_is_checked(capsys):
    assert cli.plan_main(["--config", str(ONE_GPU), "--margin", "90"]) == 2
    assert "--margin = 90.0" in capsys.readouterr().err
