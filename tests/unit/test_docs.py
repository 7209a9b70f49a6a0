"""README.md and docs/: every recipe they name, and every layout code they quote, is a shipped
recipe's; every tool they name (console script, `python -m` module, scripts/ or bench/ file)
exists; every dapo-<tool> command they show runs as shown after the README's two commands
(which install into a .venv they do not activate: `.venv/bin/dapo-plan`, never `dapo-plan`)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

from shipped_recipes import RECIPES_DIR, SHIPPED_RECIPES

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


TOOLS = r"dapo-(?:train|plan|export|prepare|import-config)"
# A shell line (in a fenced block or an indented one) that starts with a tool, after an optional
# prompt, environment assignments or Slurm's COMMAND=": what a user pastes.
BARE_LINE = re.compile(r"^\s*(?:\$ )?(?:[A-Z_]+=\S* )*(?:COMMAND=\")?" + TOOLS + r"\b")
# An inline command: a code span that starts with a tool and goes on with arguments.
BARE_SPAN = re.compile(r"`(?:[A-Z_]+=\S+ )*(?:COMMAND=\")?(" + TOOLS + r" [^`]*)`")
RECIPE_LABEL = re.compile(r"^# (?:Launch|Check it fits first): *")
"""The label of a recipe's header command lines."""
FEATURE_NAMES = {"dapo-plan --trace"}
"""Code spans that name a feature, not a command to paste."""
PENDING: set[str] = set()
"""Files another change owns, respelled there; drop each one here once it is."""


def bare_commands(name: str, text: str) -> list[str]:
    found = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        shell = fenced or line.startswith("    ") or name.endswith(".yaml")
        if shell and BARE_LINE.match(RECIPE_LABEL.sub("", line)):
            found.append(f"{name}:{number}: {line.strip()}")
        found += [
            f"{name}:{number}: `{m.group(1)}`"
            for m in BARE_SPAN.finditer(line)
            if m.group(1) not in FEATURE_NAMES
        ]
    return found


def test_bare_commands_are_found() -> None:
    # The checker itself: each way a bare tool was shown before, and the spellings that pass.
    text = "\n".join(
        [
            "```bash",
            "dapo-plan --config recipes/X.yaml --gpu-mem l4",
            'COMMAND="dapo-train --config recipes/X.yaml" sbatch slurm/ray.sub',
            ".venv/bin/dapo-train --config recipes/X.yaml",
            "```",
            "    dapo-export --checkpoint c --out o",
            "run `dapo-prepare --config RECIPE` there; `dapo-plan` alone is a name;",
            "`dapo-plan --trace` is a feature; `.venv/bin/dapo-train --dry-run` is fine",
        ]
    )
    assert [f.split(": ", 1)[0] for f in bare_commands("x.md", text)] == [
        "x.md:2",
        "x.md:3",
        "x.md:6",
        "x.md:7",
    ]
    recipe = "# Check it fits first: dapo-plan --config recipes/a.yaml\n# Launch: dapo-train\n"
    assert len(bare_commands("a.yaml", recipe)) == 2


def test_docs_show_every_command_as_it_runs_after_the_two_commands() -> None:
    found = [
        hit
        for path, text in doc_texts().items()
        if path not in PENDING
        for hit in bare_commands(path, text)
    ]
    for name in SHIPPED_RECIPES:
        header = "\n".join(
            line
            for line in (RECIPES_DIR / name).read_text(encoding="utf-8").splitlines()
            if line.startswith(("# Launch:", "# Check it fits first:"))
        )
        found += bare_commands(f"recipes/{name}", header)
    assert found == [], "spell them .venv/bin/dapo-...:\n" + "\n".join(found)


def test_every_tool_the_docs_name_exists() -> None:
    # The tools a reader is told to run: the console scripts (TOOLS above is their list),
    # `python -m` modules of the package, and the scripts/ and bench/ files.
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert {f"dapo-{t}" for t in re.findall(r"[a-z-]+", TOOLS.split("(?:")[1])} == set(scripts)
    missing = []
    for path, text in doc_texts().items():
        for module in re.findall(r"python -m (dapo_megatron[\w.]*)", text):
            if importlib.util.find_spec(module) is None:
                missing.append(f"{path}: python -m {module}")
        for ref in re.findall(r"(?<![\w/.-])((?:scripts|bench)/[\w/-]+\.(?:sh|py))\b", text):
            if not (REPO / ref).exists():
                missing.append(f"{path}: {ref}")
    assert missing == []
