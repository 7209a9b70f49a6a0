"""dapo-import-config: write one of our recipes from a NeMo RL, SkyRL, RLinf or verl config.

    dapo-import-config --from verl run_dapo_qwen2.5_7b.sh -o recipes/mine.yaml [k=v ...]

The recipe is `defaults:` our base config plus every translated key, each line commented
with the source key and how the meaning differs; every source key that was not translated
is printed and listed in a comment block at the end (never dropped silently). The table
is config/dialect_keys.py, the same one the loader's "unknown key" errors use.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dapo_megatron.config.dialects import DIALECTS, Untranslatable, all_foreign_keys, foreign_key
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.foreign_source import (
    apply_foreign_overrides,
    read_source,
    resolve_interpolations,
)
from dapo_megatron.config.loader import all_keys, display_path, load_config

BASE_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "dapo_base.yaml"
"""Our base config, which every imported recipe names in `defaults:`."""
USER_ERROR_EXIT = 2


@dataclass(frozen=True)
class ImportedSetting:
    """One of our keys set from a foreign key."""

    key: str
    """Our dotted key."""
    value: Any
    """Our value (converted where the meaning differs)."""
    source: str
    """The foreign key it came from."""
    note: str
    """How the meaning compares ("same meaning", or what was converted)."""


@dataclass(frozen=True)
class Skipped:
    """A foreign key that was not translated, and why."""

    key: str
    """The foreign dotted key."""
    value: Any
    """Its value in the source."""
    reason: str
    """Why it was not translated and, where there is one, what to set instead."""


@dataclass
class ImportResult:
    """A translated config: our settings in schema order, and what was left behind."""

    dialect: str
    """The source's dialect id."""
    settings: list[ImportedSetting] = field(default_factory=list)
    """Our settings, in the order of configs/dapo_base.yaml."""
    skipped: list[Skipped] = field(default_factory=list)
    """Source keys not translated, in source order."""


def translate(dialect: str, flat: dict[str, Any]) -> ImportResult:
    """Translate a flat foreign config (dotted key -> value) with the mapping table.

    A second source key setting one of our keys to a different value is skipped (the first
    one wins, as it appears first in the source) and listed with the conflict."""
    result = ImportResult(dialect)
    chosen: dict[str, ImportedSetting] = {}
    for key, value in flat.items():
        fk = foreign_key(key, dialect)
        if fk is None:
            other = foreign_key(key)
            reason = "no counterpart here"
            if key == "defaults":
                reason = "a parent config that was not found next to the file: its keys were not imported (import the merged config)"
            if other is not None:
                reason = f"not a {DIALECTS[dialect]} key (it is {other.system}'s: --from {other.dialect})"
            result.skipped.append(Skipped(key, value, reason))
            continue
        if isinstance(value, str) and "${" in value:
            reason = "an interpolation or shell variable this importer cannot resolve"
            result.skipped.append(Skipped(key, value, reason))
            continue
        try:
            tr = fk.convert(value, flat)
        except Untranslatable as e:
            result.skipped.append(Skipped(key, value, str(e)))
            continue
        for ours, out in tr.settings:
            first = chosen.get(ours)
            if first is None:
                chosen[ours] = ImportedSetting(ours, out, key, tr.note)
            elif first.value != out:
                reason = (
                    f"conflicts with {first.source} (both set {ours}): kept {_scalar(first.value)}"
                )
                result.skipped.append(Skipped(key, value, reason))
    order = {k: i for i, k in enumerate(all_keys())}
    result.settings = sorted(chosen.values(), key=lambda s: order[s.key])
    return result


# ---------------------------------------------------------------------------------------
# Writing the recipe


def _scalar(value: Any) -> str:
    """A value as one line of YAML."""
    text = str(yaml.safe_dump(value, default_flow_style=True, width=10_000)).strip()
    return text.removesuffix("...").strip()


def _short(value: Any, limit: int = 60) -> str:
    text = _scalar(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_recipe(result: ImportResult, *, source: str, base: str) -> str:
    """The recipe text: header, `defaults:`, the settings as nested YAML with one comment
    per line (source key: note), then the block of keys not translated."""
    system = DIALECTS[result.dialect]
    lines = [
        f"# Imported by dapo-import-config from the {system} config {source}.",
        "# Each value's comment names the source key and how the meaning compares;",
        "# the source keys that were not translated are listed at the end (docs/MIGRATING.md).",
        f"defaults: {base}",
    ]
    open_path: list[str] = []
    noted: set[tuple[str, str]] = set()
    for s in result.settings:
        *path, leaf = s.key.split(".")
        common = 0
        while common < min(len(path), len(open_path)) and path[common] == open_path[common]:
            common += 1
        if common == 0:
            lines.append("")
        for depth in range(common, len(path)):
            lines.append(f"{'  ' * depth}{path[depth]}:")
        open_path = path
        note = "as above" if (s.source, s.note) in noted else s.note
        noted.add((s.source, s.note))
        lines.append(f"{'  ' * len(path)}{leaf}: {_scalar(s.value)}  # {s.source}: {note}")
    lines.append("")
    n = len(result.skipped)
    lines.append(
        f"# Not translated: {n} source key{'s' if n != 1 else ''} (set what you need by hand)."
    )
    for sk in result.skipped:
        lines.append(f"#   {sk.key} = {_short(sk.value)}: {sk.reason}")
    return "\n".join(lines) + "\n"


def migration_rows() -> list[str]:
    """The migration table as markdown rows: system, their key, our key, difference."""
    rows = ["| system | their key | our key | semantic difference |", "|---|---|---|---|"]
    for fk in all_foreign_keys():
        rows.append(f"| {fk.system} | `{fk.key}` | {_ours_cell(fk.ours)} | {fk.difference} |")
    return rows


def _ours_cell(ours: str) -> str:
    key, _, rest = ours.partition(" ")
    if key.startswith("("):
        return ours
    return f"`{key}`" + (f" {rest}" if rest else "")


# ---------------------------------------------------------------------------------------
# Entry point


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dapo-import-config",
        description="Write a dapo-megatron recipe from a NeMo RL, SkyRL, RLinf or verl config "
        "(YAML, or a launch script of Hydra overrides).",
    )
    parser.add_argument("--from", dest="dialect", choices=sorted(DIALECTS), help="source system")
    parser.add_argument("source", nargs="?", type=Path, metavar="FILE", help="the config to import")
    parser.add_argument("-o", "--output", type=Path, metavar="RECIPE", help="recipe to write")
    parser.add_argument("--force", action="store_true", help="overwrite an existing recipe")
    parser.add_argument(
        "--table", action="store_true", help="print the migration table (markdown) and exit"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides in the source system's syntax (Hydra: key=v, +key=v, ++key=v, ~key)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """dapo-import-config; exit 2 on a user error or a recipe that does not validate."""
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    if args.table:
        print("\n".join(migration_rows()))
        return 0
    try:
        return _import(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT


def _import(args: argparse.Namespace) -> int:
    for flag, value in (("--from", args.dialect), ("FILE", args.source), ("-o", args.output)):
        if value is None:
            raise ConfigError(
                f"{flag} is required: dapo-import-config --from "
                f"{'|'.join(DIALECTS)} FILE -o recipes/mine.yaml"
            )
    out: Path = args.output
    if out.exists() and not args.force:
        raise ConfigError(f"{display_path(out)} exists; choose another -o or pass --force")
    flat = read_source(args.source)
    apply_foreign_overrides(flat, args.overrides)
    resolve_interpolations(flat)
    result = translate(args.dialect, flat)
    base = os.path.relpath(BASE_CONFIG, out.resolve().parent)
    source = display_path(args.source) + (
        " with " + " ".join(args.overrides) if args.overrides else ""
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_recipe(result, source=source, base=base), encoding="utf-8")
    print(
        f"dapo-import-config: wrote {display_path(out)}: {len(result.settings)} settings from "
        f"{len(flat) - len(result.skipped)} of {len(flat)} {DIALECTS[args.dialect]} keys"
    )
    print(f"not translated ({len(result.skipped)}, also listed at the end of the recipe):")
    for sk in result.skipped:
        print(f"  {sk.key} = {_short(sk.value)}: {sk.reason}")
    try:
        load_config(out)
    except ConfigError as e:
        raise ConfigError(
            f"{display_path(out)} was written but does not validate yet: {e}"
        ) from None
    print(f"valid; check the machine too: dapo-train --config {display_path(out)} --dry-run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
