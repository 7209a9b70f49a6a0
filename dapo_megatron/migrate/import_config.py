"""dapo-import-config: write one of our recipes from a NeMo RL, SkyRL, RLinf or verl config.

    .venv/bin/dapo-import-config --from verl run_dapo_qwen2.5_7b.sh -o recipes/mine.yaml [k=v ...]

The recipe is `defaults:` our base config plus every translated key, each line commented
with the source key and how the meaning differs; every source key that was not translated
is printed and listed in a comment block at the end (never dropped silently). The table
is migrate/dialect_keys.py, the same one the loader's "unknown key" errors use.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import all_keys, display_path, load_config
from dapo_megatron.migrate.dialect_keys import (
    READS_UNRESOLVED,
    SOURCE_DEFAULTS,
    all_foreign_keys,
    foreign_key,
    impact,
    inactive_keys,
)
from dapo_megatron.migrate.dialects import (
    DIALECTS,
    IMPACT_ALGORITHM,
    IMPACT_HARMLESS,
    IMPACT_LAYOUT,
    IMPACT_TITLES,
    Untranslatable,
)
from dapo_megatron.migrate.foreign_source import (
    apply_foreign_overrides,
    read_source,
    resolve_interpolations,
)
from dapo_megatron.migrate.plan_check import check_plan
from dapo_megatron.planning.capacity import DEFAULT_CARD, card_names, parse_gpu_mem
from dapo_megatron.shared.commands import tool_command

BASE_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "dapo_base.yaml"
"""Our base config, which every imported recipe names in `defaults:`."""
USER_ERROR_EXIT = 2
PLAN_FAILS_EXIT = 1
"""Exit status of an import whose recipe was written but does not fit (as dapo-plan's)."""


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
    impact: str = IMPACT_ALGORITHM
    """How much leaving it behind changes the run (dialects.IMPACT_*)."""

    @property
    def blocking(self) -> bool:
        """True when it changes the run: the import refuses without --allow-untranslated."""
        return self.impact != IMPACT_HARMLESS


@dataclass
class ImportResult:
    """A translated config: our settings in schema order, and what was left behind."""

    dialect: str
    """The source's dialect id."""
    settings: list[ImportedSetting] = field(default_factory=list)
    """Our settings, in the order of configs/dapo_base.yaml."""
    skipped: list[Skipped] = field(default_factory=list)
    """Source keys not translated, in source order."""
    kept_ours: list[str] = field(default_factory=list)
    """Our keys that matter and that no source key (nor a source default) set."""
    as_here: list[Skipped] = field(default_factory=list)
    """Source keys whose value does what we always do (a feature off, a setting equal to
    our fixed behaviour): carried with nothing to set; `reason` says what we do."""

    @property
    def blocking(self) -> list[Skipped]:
        """The untranslated keys that change the run, most important tier first."""
        rank = {IMPACT_ALGORITHM: 0, IMPACT_LAYOUT: 1}
        return sorted((s for s in self.skipped if s.blocking), key=lambda s: rank[s.impact])


OURS_THAT_MATTER = (
    "policy.model_name_or_path",
    "policy.optimizer.lr",
    "policy.optimizer.weight_decay",
    "policy.optimizer.clip_grad",
    "policy.scheduler.lr_warmup_steps",
    "policy.megatron.tensor_model_parallel_size",
    "policy.megatron.pipeline_model_parallel_size",
    "policy.megatron.context_parallel_size",
    "policy.megatron.sequence_parallel",
    "policy.train_global_batch_size",
    "policy.max_total_sequence_length",
    "generation.max_response_length",
    "generation.engine.tensor_parallel_size",
    "dapo.num_prompts_per_step",
    "dapo.num_generations_per_prompt",
    "dapo.max_num_steps",
    "generation.temperature",
    "generation.top_p",
    "dapo.advantage.norm_by_std",
    "dapo.advantage.leave_one_out",
    "dapo.loss.clip_ratio_low",
    "dapo.loss.clip_ratio_high",
    "dapo.loss.clip_ratio_c",
    "dapo.loss.loss_agg_mode",
    "dapo.dynamic_sampling.enabled",
    "dapo.overlong_buffer.enabled",
    "dapo.overlong_filtering",
    "data.max_prompt_length",
    "data.train_path",
    "cluster.num_nodes",
    "cluster.gpus_per_node",
    "validation.num_samples_per_prompt",
    "validation.temperature",
)
"""Our keys whose value the import must trace to the source; any left at our default is
named in the recipe and the summary (the source's value is unknown to the importer)."""


def translate(dialect: str, flat: dict[str, Any]) -> ImportResult:
    """Translate a flat foreign config (dotted key -> value) with the mapping table.

    Keys the source omits take the source system's default (dialect_keys.SOURCE_DEFAULTS),
    at a lower priority than any key the source sets; keys that are not live in the source
    (dialect_keys.inactive_keys) are listed, not translated. A second source key setting one
    of our keys to a different value is a conflict (the first is kept, the second listed)."""
    result = ImportResult(dialect)
    chosen: dict[str, ImportedSetting] = {}
    dead = inactive_keys(dialect, flat)
    defaults = {k: v for k, v in SOURCE_DEFAULTS[dialect].items() if k not in flat}
    ctx = {**defaults, **flat}
    for key, value in [*flat.items(), *defaults.items()]:
        is_default = key in defaults
        if key in dead:
            result.skipped.append(Skipped(key, value, dead[key], IMPACT_HARMLESS))
            continue
        fk = foreign_key(key, dialect)
        if fk is None:
            other = foreign_key(key)
            tier = impact(key, dialect)
            reason = (
                "not in the importer's table: logging, naming or bookkeeping by its name"
                if tier == IMPACT_HARMLESS
                else "not in the importer's table: its meaning here is unknown (counted as "
                "changing the run)"
            )
            if other is not None:
                reason = f"not a {DIALECTS[dialect]} key (it is {other.system}'s: --from {other.dialect})"
            result.skipped.append(Skipped(key, value, reason, tier))
            continue
        if _unresolved(value) and key not in READS_UNRESOLVED.get(dialect, frozenset()):
            reason = (
                "an interpolation or shell variable this importer cannot resolve "
                "(a script's environment: --shell-var NAME=VALUE)"
            )
            result.skipped.append(Skipped(key, value, reason, impact(key, dialect)))
            continue
        try:
            tr = fk.convert(value, ctx)
            if any(_unresolved(v) for _, v in tr.settings):
                raise Untranslatable(
                    "an interpolation or shell variable this importer cannot resolve "
                    "(a script's environment: --shell-var NAME=VALUE)"
                )
        except Untranslatable as e:
            reason = str(e) + (f" ({DIALECTS[dialect]}'s default)" if is_default else "")
            result.skipped.append(Skipped(key, value, reason, impact(key, dialect)))
            continue
        if not tr.settings:  # its value does what we always do: nothing to set
            result.as_here.append(Skipped(key, value, tr.note, IMPACT_HARMLESS))
            continue
        note = (
            f"{DIALECTS[dialect]}'s default {_scalar(value)}; {tr.note}" if is_default else tr.note
        )
        for ours, out in tr.settings:
            first = chosen.get(ours)
            if first is None:
                chosen[ours] = ImportedSetting(ours, out, key, note)
            elif first.value != out and not is_default:
                reason = (
                    f"conflicts with {first.source} (both set {ours}): kept {_scalar(first.value)}"
                )
                result.skipped.append(Skipped(key, value, reason, impact(key, dialect)))
    _derive(chosen, result.skipped, dialect)
    order = {k: i for i, k in enumerate(all_keys())}
    result.settings = sorted(chosen.values(), key=lambda s: order[s.key])
    greedy = chosen.get("validation.greedy")
    unused = {"validation.temperature"} if greedy is not None and greedy.value is True else set()
    result.kept_ours = [k for k in OURS_THAT_MATTER if k not in chosen and k not in unused]
    dynamic = chosen.get("dapo.dynamic_sampling.enabled")
    if dynamic is not None and dynamic.value is True:
        # Ours carries the surplus groups to the next step by default (the peers discard)
        # and stops after 10 rounds (verl's default is no limit).
        for key in ("dapo.dynamic_sampling.surplus", "dapo.dynamic_sampling.max_gen_batches"):
            if key not in chosen:
                result.kept_ours.append(key)
    return result


SCHEDULE_PER_TRAIN_STEP = {
    "verl": "verl steps its lr scheduler once per trainer step, after all of the step's "
    "mini-batches (update_actor in fsdp_workers.py and megatron_workers.py)",
    "nemo-rl": "NeMo RL steps its lr scheduler once per training call, after all of a GRPO "
    "step's optimizer steps (megatron_policy_worker.py and dtensor_policy_worker.py train)",
}
"""The systems whose lr schedule counts trainer steps (policy.scheduler.unit train_step)."""


COPIED_ROWS = {"hf://BytedTsinghua-SIA/DAPO-Math-17k": 1_791_700}
"""Rows the peers read of a hub dataset that ours reads once per problem (data/hub_datasets.py
drops repeats): DAPO-Math-17k's parquet repeats each of its ~17.9k problems ~100 times, and
NeMo RL's dapo_math.py and verl's and SkyRL's parquet loaders read every row, so an epoch
there is ~100 of ours."""


def _epochs_over_copies(chosen: dict[str, ImportedSetting], skipped: list[Skipped]) -> None:
    """A source's epoch bound over a dataset we read without its copies: kept out when the
    step count surely ends the run first (the prompts drawn in max_num_steps steps, with
    every dynamic-sampling round, fit in the source's passes), else refused."""
    epochs = chosen.get("dapo.max_num_epochs")
    data = chosen.get("data.train_path")
    if epochs is None or data is None or str(data.value) not in COPIED_ROWS:
        return
    rows = COPIED_ROWS[str(data.value)]
    del chosen["dapo.max_num_epochs"]

    def value(key: str, default: Any) -> Any:
        setting = chosen.get(key)
        return default if setting is None else setting.value

    steps, prompts = value("dapo.max_num_steps", None), value("dapo.num_prompts_per_step", None)
    if not isinstance(prompts, int) or prompts <= 0:
        steps = prompts = None
    elif not isinstance(steps, int):
        steps = 10**12  # no step bound in the source: its passes end the run
    dynamic = value("dapo.dynamic_sampling.enabled", False) is True
    rounds = 1.0
    if dynamic:
        # <= 0: no round limit (ours and the peers'): the steps bound nothing.
        limit = float(value("dapo.dynamic_sampling.max_gen_batches", 0))
        bound = float(value("dapo.dynamic_sampling.batch_multiplier", 1.0))
        rounds = limit * bound if limit > 0 else float("inf")
    if steps is not None and prompts is not None:
        if steps * prompts * rounds <= epochs.value * rows:
            return  # max_num_steps ends both runs first; ours has no epoch bound to set
        if not dynamic:
            # One dataloader batch of num_prompts_per_step rows a step, each pass's last
            # partial batch dropped (drop_last): the passes end after this many steps.
            passes = epochs.value * (rows // prompts)
            chosen["dapo.max_num_steps"] = ImportedSetting(
                "dapo.max_num_steps",
                min(steps, passes),
                f"{epochs.source} + the step count",
                f"the source ends after {epochs.value} pass(es) over {data.value}'s "
                f"{rows:,} rows (each problem ~100 times) at {prompts} prompts a step = "
                f"{passes} steps (or its own step count, when smaller); ours reads each "
                "problem once, so the bound is written in steps",
            )
            return
    skipped.append(
        Skipped(
            epochs.source,
            epochs.value,
            f"needs an epoch over {data.value}'s {rows:,} rows (each problem ~100 times), "
            "which dapo-megatron lacks: ours reads each problem once, so its epochs are "
            "~100 times shorter; set dapo.max_num_steps to the source's step count",
            IMPACT_ALGORITHM,
        )
    )


def _unresolved(value: Any) -> bool:
    """A value still holding a shell variable or an interpolation the reader left."""
    return isinstance(value, str) and ("${" in value or "$(" in value)


def _derive(chosen: dict[str, ImportedSetting], skipped: list[Skipped], dialect: str) -> None:
    """Our keys that follow from translated ones: the trainer's sequence cap is prompt +
    response when the source gives only the two lengths (verl, SkyRL, RLinf); never in
    place of a source's own cap that was refused (NeMo RL's, when the lengths exceed it).
    The schedule's unit is the source's (SCHEDULE_PER_TRAIN_STEP)."""
    _epochs_over_copies(chosen, skipped)
    unit = "policy.scheduler.unit"
    if dialect in SCHEDULE_PER_TRAIN_STEP and unit not in chosen:
        chosen[unit] = ImportedSetting(
            unit, "train_step", "(how the source steps its scheduler)",
            SCHEDULE_PER_TRAIN_STEP[dialect],
        )  # fmt: skip
    total = "policy.max_total_sequence_length"
    prompt = chosen.get("data.max_prompt_length")
    response = chosen.get("generation.max_response_length")
    refused = any(
        (fk := foreign_key(s.key, dialect)) is not None and fk.ours == total for s in skipped
    )
    if total not in chosen and not refused and prompt is not None and response is not None:
        chosen[total] = ImportedSetting(
            total,
            prompt.value + response.value,
            f"{prompt.source} + {response.source}",
            "derived: prompt + response",
        )


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
    if result.as_here:
        lines.append(f"# {len(result.as_here)} source key(s) that need nothing set here:")
        lines.extend(f"#   {s.key} = {_short(s.value)}: {s.reason}" for s in result.as_here)
    lines.extend(_summary_lines(result, prefix="# "))
    return "\n".join(lines) + "\n"


def _summary_lines(result: ImportResult, *, prefix: str, limit: int | None = None) -> list[str]:
    """The untranslated keys by tier, most important first, then our keys left at our
    default; at most `limit` keys listed per tier (None: all)."""
    out: list[str] = []
    for tier in (IMPACT_ALGORITHM, IMPACT_LAYOUT, IMPACT_HARMLESS):
        group = [s for s in result.skipped if s.impact == tier]
        if not group:
            continue
        mark = "UNTRANSLATED, " if tier != IMPACT_HARMLESS else ""
        out.append(f"{prefix}{mark}{len(group)} key(s) that {IMPACT_TITLES[tier]}:")
        shown = group if limit is None or tier != IMPACT_HARMLESS else group[:limit]
        for sk in shown:
            out.append(f"{prefix}  {sk.key} = {_short(sk.value)}: {sk.reason}")
        if len(shown) < len(group):
            out.append(f"{prefix}  ... {len(group) - len(shown)} more, listed in the recipe")
    if result.kept_ours:
        out.append(
            f"{prefix}Our default, not traced to the source ({len(result.kept_ours)}): "
            + ", ".join(result.kept_ours)
        )
    return out


_NEEDS = re.compile(r"needs (.+?), which dapo-megatron lacks")


def lacking_features(blocking: Sequence[Skipped]) -> str:
    """The blocking keys grouped by what they need: "LoRA (k1, k2); <reason> (k3)". A
    reason in the table's form ("needs X, which dapo-megatron lacks") names its feature X;
    any other reason (a value out of range, an unresolved variable) is shown whole."""
    groups: dict[str, list[str]] = {}
    for s in blocking:
        found = _NEEDS.search(s.reason)
        groups.setdefault(found.group(1) if found else s.reason, []).append(s.key)
    return "; ".join(f"{what} ({', '.join(keys)})" for what, keys in groups.items())


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
        "--allow-untranslated",
        action="store_true",
        help="write the recipe although source keys that change the run have no translation "
        "(each is marked UNTRANSLATED in the recipe)",
    )
    parser.add_argument(
        "--shell-var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a launch script's environment variable (e.g. HOME=/home/me), repeatable",
    )
    parser.add_argument(
        "--gpu-mem",
        default=DEFAULT_CARD,
        metavar="GIB|CARD",
        help=f"the source cluster's GPU for the plan of the written recipe, in GiB or a card "
        f"name ({card_names()}; default: {DEFAULT_CARD}, as dapo-plan)",
    )
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
                f"{flag} is required: {tool_command('dapo-import-config')} --from "
                f"{'|'.join(DIALECTS)} FILE -o recipes/mine.yaml"
            )
    out: Path = args.output
    parse_gpu_mem(args.gpu_mem)  # a bad --gpu-mem is one line before anything is read
    if out.is_dir():
        raise ConfigError(f"-o {display_path(out)} is a directory; name the recipe file to write")
    if out.exists() and not args.force:
        raise ConfigError(f"{display_path(out)} exists; choose another -o or pass --force")
    shell_vars = {}
    for item in args.shell_var:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ConfigError(f"--shell-var {item!r}: expected NAME=VALUE")
        shell_vars[name] = value
    flat = read_source(args.source, shell_vars)
    apply_foreign_overrides(flat, args.overrides)
    resolve_interpolations(flat)
    system = DIALECTS[args.dialect]
    result = translate(args.dialect, flat)
    explicit = [s for s in result.settings if s.source in flat]
    explicit_here = [s for s in result.as_here if s.key in flat]
    if not explicit and not explicit_here:
        raise ConfigError(
            f"{display_path(args.source)}: no {system} setting was carried ({len(flat)} keys "
            f"read); is it a {system} config (--from), and are its overrides readable?"
        )
    counts = {t: sum(1 for s in result.skipped if s.impact == t) for t in IMPACT_TITLES}
    print(
        f"dapo-import-config: {system} {display_path(args.source)}: {len(result.settings)} "
        f"settings ({len(explicit)} from the source's keys; {len(explicit_here)} more keys "
        f"need nothing set here), untranslated: "
        f"{counts[IMPACT_ALGORITHM]} changing the algorithm, {counts[IMPACT_LAYOUT]} the "
        f"layout or memory, {counts[IMPACT_HARMLESS]} harmless"
    )
    _refuse_a_lost_model(result)
    algorithm = [s for s in result.blocking if s.impact == IMPACT_ALGORITHM]
    layout = [s for s in result.blocking if s.impact == IMPACT_LAYOUT]
    if algorithm and not args.allow_untranslated:
        for line in _summary_lines(result, prefix="  ", limit=5):
            print(line)
        raise ConfigError(
            f"nothing written: {len(algorithm)} source key(s) change what is learned and "
            f"need what dapo-megatron lacks: {lacking_features(algorithm)}; to write the "
            "recipe anyway (each marked UNTRANSLATED in it, to set by hand), add "
            "--allow-untranslated"
        )
    base = os.path.relpath(BASE_CONFIG, out.resolve().parent)
    source = display_path(args.source) + (
        " with " + " ".join(args.overrides) if args.overrides else ""
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_recipe(result, source=source, base=base), encoding="utf-8")
    try:
        load_config(out)
    except ConfigError as e:
        gaps = f" (not carried: {lacking_features(layout)})" if layout else ""
        raise ConfigError(
            f"{display_path(out)} was written but does not validate yet{gaps}: {e}"
        ) from None
    verdict = check_plan(out, args.gpu_mem)
    if layout and verdict.fits is not True and not args.allow_untranslated:
        # Speed and memory knobs we lack only pass when the plan shows memory fits without
        # them; unplanned or over budget, they may be what the source needed.
        out.unlink()
        raise ConfigError(
            f"nothing written: {len(layout)} layout or memory setting(s) need what "
            f"dapo-megatron lacks: {lacking_features(layout)}, and without them the plan "
            f"does not show the run fits ({verdict.line}); add --allow-untranslated to "
            "write it anyway"
        )
    print(f"wrote {display_path(out)}")
    for line in _summary_lines(result, prefix="  ", limit=5):
        print(line)
    print(f"dapo-plan: {verdict.line}")
    if layout:
        print(
            f"not carried, speed and memory only ({len(layout)}): {lacking_features(layout)};"
            " the plan above is without them"
        )
    if algorithm or result.kept_ours:
        print(
            f"it loads, but is not a faithful copy: {len(algorithm)} untranslated key(s) and "
            f"{len(result.kept_ours)} of our defaults are marked in it"
        )
    elif verdict.fits:
        print(
            f"valid and planned; check the machine too: {tool_command('dapo-train')} --config "
            f"{display_path(out)} --dry-run"
        )
    if verdict.fits is False:
        print(
            f"error: {display_path(out)} was written but does not fit: {verdict.line}; "
            f"change the layout or the lengths named above ({tool_command('dapo-plan')} --config "
            f"{display_path(out)} shows every phase)",
            file=sys.stderr,
        )
        return PLAN_FAILS_EXIT
    return 0


MODEL = "policy.model_name_or_path"


def _refuse_a_lost_model(result: ImportResult) -> None:
    """The source names a model that was not carried (an unresolved variable, a value
    that is not a model): a recipe would train our default model in its place, so nothing
    is written, --allow-untranslated or not."""
    if MODEL not in result.kept_ours:
        return
    lost = [
        s
        for s in result.skipped
        if (fk := foreign_key(s.key, result.dialect)) is not None and fk.ours.startswith(MODEL)
    ]
    if lost:
        s = lost[0]
        others = [b for b in result.blocking if b.key != s.key]
        more = f"; it also needs: {lacking_features(others)}" if others else ""
        raise ConfigError(
            f"nothing written: the model {s.key} = {_short(s.value)} was not carried ({s.reason});"
            f" the recipe would train our default model instead. Supply it (--shell-var "
            f"NAME=VALUE, or the override {s.key}=ORG/NAME or a path){more}"
        )


if __name__ == "__main__":
    sys.exit(main())
