"""The recipes shipped with the checkout: an explicit list, not whatever `recipes/*.yaml` holds.

The docs tell a user to write their own recipe there (`dapo-import-config -o
recipes/mine.yaml`); a test that globbed the directory would then plan, trace and
launch-check that file, and a half-edited recipe of the user's would fail the suite.
Every test that iterates recipes goes through `shipped_recipes` (tests/unit/
test_shipped_recipes.py checks the list against `git ls-files recipes/`).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES_DIR = REPO / "recipes"

SHIPPED_RECIPES = (
    "dapo-llama-3.1-70b-16n8g-tp8pp4cp2.yaml",
    "dapo-longcot-cpu.yaml",
    "dapo-qwen2.5-32b-16n8g-tp8pp1cp2.yaml",
    "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml",
    "dapo-qwen2.5-math-7b-4n8g-tp2pp1cp1.yaml",
    "dapo-qwen3-0.6b-1n1g-tp1pp1cp1.yaml",
    "dapo-qwen3-1.7b-1n1g-tp1pp1cp1.yaml",
    "dapo-qwen3-30b-a3b-4n8g-tp2pp1cp1ep4.yaml",
    "dapo-qwen3-32b-4n8g-tp8pp2cp2.yaml",
    "dapo-qwen3-8b-1n8g-tp4pp1cp1.yaml",
    "dapo-tiny-cpu-vllm.yaml",
    "dapo-tiny-cpu.yaml",
    "dapo-tiny-moe-cpu.yaml",
)
"""File names under recipes/, sorted; a new shipped recipe is added here and to git."""


def shipped_recipes(pattern: str = "*.yaml", root: Path = RECIPES_DIR) -> list[Path]:
    """The shipped recipes whose names match ``pattern`` (fnmatch), as paths under ``root``,
    sorted; any other file in ``root`` (a user's own recipe) is ignored."""
    return [root / name for name in SHIPPED_RECIPES if fnmatch.fnmatch(name, pattern)]
