"""The memory plan of an imported recipe: the written recipe is planned at its own node
count, as `dapo-plan` would, so an import that does not fit says which setting and why
before anybody queues it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import load_config
from dapo_megatron.planning.capacity import DEFAULT_CARD, parse_gpu_mem
from dapo_megatron.planning.memory import memory_inputs, plan_memory
from dapo_megatron.planning.summary import layout, verdict_line


@dataclass(frozen=True)
class PlanVerdict:
    """What `dapo-plan` says of a recipe, in one line."""

    fits: bool | None
    """True: the memory plan fits; False: it does not (or the recipe is invalid); None:
    not planned (no architecture known for the model)."""
    line: str
    """The plan's line: the layout and the memory verdict, or why it was not planned."""


def check_plan(recipe: Path, card: str = DEFAULT_CARD) -> PlanVerdict:
    """Plan `recipe` on `card` (dapo-plan's default GPU) with dapo-plan's default margin."""
    try:
        run = load_config(recipe).require_plan()
    except (ConfigError, ValueError) as e:
        return PlanVerdict(False, f"does not validate: {e}")
    where = f"{layout(run.dims)} on {run.config.cluster.num_nodes} node(s)"
    if run.arch is None:
        return PlanVerdict(None, f"{where}: memory not planned, {run.arch_source}")
    gpu_mem, label = parse_gpu_mem(card)
    report = plan_memory(memory_inputs(run, gpu_mem))
    if not report.inputs.on_gpu:
        return PlanVerdict(True, f"{where}: {verdict_line(report)} (a CPU recipe)")
    return PlanVerdict(report.fits, f"{where} of {label}: {verdict_line(report)}")
