"""README.md and docs/: every recipe they name, and every layout code they quote, is a shipped
recipe's; (and the commands they show run as shown: test_docs_commands below)."""

from __future__ import annotations

import re
from pathlib import Path

from shipped_recipes import SHIPPED_RECIPES

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "slurm" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

RECIPE_NAME = re.compile(r"\bdapo-[a-z0-9][a-z0-9.-]*\.yaml\b")
# A quoted layout code (`ep8`, `tp2pp1cp1ep4`, `4n8g`): the text is telling what a file name says.
LAYOUT_CODE = re.compile(r"`((?:\d+n\d+g-?)?(?:(?:tp|pp|cp|ep)\d+)+|\d+n\d+g)`")


def doc_texts() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in DOCS}


def test_every_recipe_the_docs_name_is_shipped() -> None:
    missing = sorted(
        f"{path}: {name}"
        for path, text in doc_texts().items()
        for name in set(RECIPE_NAME.findall(text))
        if name not in SHIPPED_RECIPES
    )
    assert missing == []


def test_every_layout_code_the_docs_quote_is_in_a_recipe_name() -> None:
    # README once said the Qwen3-30B-A3B file name "still says `ep8`" after it became ep4: a
    # stale fragment that no recipe-name check sees, since it is not a whole file name.
    stale = sorted(
        f"{path}:{text.count(chr(10), 0, m.start()) + 1}: `{m.group(1)}`"
        for path, text in doc_texts().items()
        for m in LAYOUT_CODE.finditer(text)
        if not any(m.group(1) in name for name in SHIPPED_RECIPES)
    )
    assert stale == []
