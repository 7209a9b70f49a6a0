"""tests/shipped_recipes.py: the explicit list of shipped recipes every recipe-iterating test
uses, so a user's own recipes/mine.yaml never joins the suite."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from shipped_recipes import RECIPES_DIR, REPO, SHIPPED_RECIPES, shipped_recipes


def test_every_listed_recipe_exists() -> None:
    assert [n for n in SHIPPED_RECIPES if not (RECIPES_DIR / n).is_file()] == []
    assert list(SHIPPED_RECIPES) == sorted(SHIPPED_RECIPES)


def test_the_list_is_the_tracked_recipes() -> None:
    # A recipe added to git but not to the list would silently skip every recipe test.
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git checkout here")
    out = subprocess.run(
        ["git", "ls-files", "recipes/"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    tracked = sorted(Path(line).name for line in out.splitlines() if line.endswith(".yaml"))
    assert tracked == list(SHIPPED_RECIPES)


def test_a_users_own_recipe_is_ignored(tmp_path: Path) -> None:
    # What `dapo-import-config -o recipes/mine.yaml` leaves beside the shipped ones, broken.
    for name in SHIPPED_RECIPES:
        (tmp_path / name).write_text("defaults: [../configs/dapo_base.yaml]\n")
    (tmp_path / "zz_user_test_mine.yaml").write_text("policy: [this is: not a recipe\n")
    (tmp_path / "dapo-qwen3-30b-a3b-mine.yaml").write_text("policy: {}\n")
    found = [p.name for p in shipped_recipes(root=tmp_path)]
    assert found == list(SHIPPED_RECIPES)
    assert [p.name for p in shipped_recipes("dapo-qwen3-30b-a3b-*", root=tmp_path)] == [
        "dapo-qwen3-30b-a3b-4n8g-tp2pp1cp1ep4.yaml"
    ]
    assert all(p.parent == tmp_path for p in shipped_recipes(root=tmp_path))
