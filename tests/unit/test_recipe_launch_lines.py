"""Every 8-GPU CUDA recipe's ``# Launch:`` line asks Slurm for the GPUs ray.sub declares.

slurm/ray.sub declares GPUS_PER_NODE (8) GPUs per node to Ray; a job step only sees GPUs
the job requested explicitly (``--exclusive`` alone gives none), so a launch line without
``--gpus-per-node=8`` is refused by ray.sub's GPU check. The node count must be the
recipe's own ``cluster.num_nodes``: a copied line with another count would start a cluster
of the wrong size.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shipped_recipes import shipped_recipes

from dapo_megatron.config.loader import load_config

REPO = Path(__file__).resolve().parents[2]
RECIPES = shipped_recipes()


def _launch_line(recipe: Path) -> str | None:
    for line in recipe.read_text().splitlines():
        if line.startswith("# Launch:"):
            return line.removeprefix("# Launch:").strip()
    return None


def _eight_gpu_cuda_recipes() -> list[Path]:
    chosen = []
    for recipe in RECIPES:
        cluster = load_config(recipe, validate=False).config.cluster
        if cluster.device == "cuda" and cluster.gpus_per_node == 8:
            chosen.append(recipe)
    return chosen


def test_there_are_eight_gpu_recipes_to_check() -> None:
    assert len(_eight_gpu_cuda_recipes()) >= 5


@pytest.mark.parametrize("recipe", _eight_gpu_cuda_recipes(), ids=lambda p: p.name)
def test_launch_line_requests_eight_gpus_and_the_recipes_nodes(recipe: Path) -> None:
    line = _launch_line(recipe)
    assert line is not None, f"{recipe.name}: no '# Launch:' header line"
    num_nodes = load_config(recipe, validate=False).config.cluster.num_nodes
    expected = (
        f'COMMAND=".venv/bin/dapo-train --config recipes/{recipe.name}" '
        f"sbatch --nodes={num_nodes} --gpus-per-node=8 slurm/ray.sub"
    )
    assert line == expected, f"{recipe.name}: launch line\n  {line}\nexpected\n  {expected}"
