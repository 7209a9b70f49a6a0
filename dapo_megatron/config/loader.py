"""Load a recipe: follow `defaults:` chains, merge, apply `a.b.c=value` overrides, type-check.

Every leaf value remembers the file (or "command line") that set it, so an error can name
the key, the file and the fix. Unknown keys are errors with the closest valid key; a key of
NeMo RL, SkyRL, RLinf or verl is named as theirs with our key and its converted value
(migrate/dialects.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.foreign_hint import explain_foreign, flatten
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.config.validate import validate_config

CLI_SOURCE = "command line"
DEFAULTS_KEY = "defaults"

# Peer spellings users bring from verl / NeMo RL / the paper, keyed by leaf name.
PEER_ALIASES: dict[str, str] = {
    "eps_low": "dapo.loss.clip_ratio_low",
    "eps_high": "dapo.loss.clip_ratio_high",
    "ratio_clip_min": "dapo.loss.clip_ratio_low",
    "ratio_clip_max": "dapo.loss.clip_ratio_high",
    "ratio_clip_c": "dapo.loss.clip_ratio_c",
    "token_level_loss": "dapo.loss.loss_agg_mode",
    "use_dynamic_sampling": "dapo.dynamic_sampling.enabled",
    "filter_groups": "dapo.dynamic_sampling.enabled",
    "max_num_gen_batches": "dapo.dynamic_sampling.max_gen_batches",
    "dynamic_sampling_max_gen_batches": "dapo.dynamic_sampling.max_gen_batches",
    "overlong_buffer_length": "dapo.overlong_buffer.length",
    "overlong_buffer_penalty": "dapo.overlong_buffer.penalty_factor",
    "overlong_filter": "dapo.overlong_filtering",
    "num_generations": "dapo.num_generations_per_prompt",
    "num_prompts": "dapo.num_prompts_per_step",
    "ppo_mini_batch_size": "policy.train_global_batch_size",
    "ppo_micro_batch_size_per_gpu": "policy.train_micro_batch_size",
    "tp": "policy.megatron.tensor_model_parallel_size",
    "pp": "policy.megatron.pipeline_model_parallel_size",
    "cp": "policy.megatron.context_parallel_size",
    "max_steps": "dapo.max_num_steps",
}


class _DuplicateKey(Exception):
    """A mapping of a recipe names the same key twice (YAML would keep the last silently)."""

    def __init__(self, key: str, first_line: int, line: int) -> None:
        super().__init__(key)
        self.key, self.first_line, self.line = key, first_line, line


# yaml ships no type information (no types-PyYAML in the test extra), so SafeLoader is Any.
class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that also reads `1e-6` as a float (YAML 1.1 wants `1.0e-6`) and rejects
    duplicate keys: a recipe with `dapo:` twice would otherwise lose the first block."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(str(key), seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_exponent_floats(loader: Any) -> None:
    """Make a yaml Loader class read `1e-6` as a float, as YAML 1.2 and OmegaConf do (PyYAML's
    YAML 1.1 resolver wants `1.0e-6` and returns the string otherwise)."""
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )


read_exponent_floats(_Loader)


def parse_yaml_value(text: str) -> Any:
    """Parse one override value the way YAML would (`0.28`, `true`, `null`, `[1, 2]`)."""
    return yaml.load(text, Loader=_Loader)


@dataclass
class LoadedConfig:
    """A validated config plus where each leaf value came from."""

    config: DapoMegatronConfig
    """The typed config."""
    sources: dict[str, str]
    """Dotted key -> file (or "command line") that set its value last."""
    files: list[str]
    """Recipe files read, base first."""
    plan: RunPlan | None = None
    """The run plan (every derived value); None when loaded without validation."""

    def require_plan(self) -> RunPlan:
        """The run plan of a validated config."""
        if self.plan is None:
            raise ValueError("the config was loaded with validate=False: it has no run plan")
        return self.plan


# ---------------------------------------------------------------------------------------
# Reading and merging YAML files


def display_path(path: str | Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _read_yaml(path: Path, referenced_from: str | None) -> dict[str, Any]:
    if not path.is_file():
        where = f" (referenced by `defaults:` in {referenced_from})" if referenced_from else ""
        raise ConfigError(f"config file {display_path(path)} not found{where}")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_Loader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{display_path(path)}: invalid YAML: {e}".replace("\n", " ")) from None
    except _DuplicateKey as e:
        raise ConfigError(
            f"{display_path(path)} line {e.line}: key {e.key!r} appears twice in one mapping "
            f"(first at line {e.first_line}); merge the two blocks (YAML would silently "
            f"keep only the last)"
        ) from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{display_path(path)}: not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{display_path(path)}: top level must be a mapping, got {type(data).__name__}"
        )
    return data


def _merge(
    dst: dict[str, Any],
    src: dict[str, Any],
    sources: dict[str, str],
    origin: str | dict[str, str],
    prefix: str = "",
) -> None:
    """Deep-merge src into dst: mappings merge key by key, anything else replaces.

    `origin` is the file src came from, or (for an already merged parent tree) the mapping of
    its leaves to their files; `sources` is updated for every replaced leaf.
    """
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value, sources, origin, dotted + ".")
            continue
        dst[key] = _copy(value)
        for stale in [k for k in sources if k == dotted or k.startswith(dotted + ".")]:
            del sources[stale]
        _record_sources(value, dotted, sources, origin)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _record_sources(
    value: Any, dotted: str, sources: dict[str, str], origin: str | dict[str, str]
) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _record_sources(v, f"{dotted}.{k}", sources, origin)
    else:
        sources[dotted] = origin if isinstance(origin, str) else origin.get(dotted, "unknown file")


def _load_tree(
    path: Path, chain: tuple[Path, ...], files: list[str], referenced_from: str | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Load `path` with its `defaults:` parents merged underneath it.

    Returns the merged tree and, for each leaf, the file that set it.
    """
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(display_path(p) for p in (*chain, path))
        raise ConfigError(f"`defaults:` cycle: {cycle}")
    data = _read_yaml(path, referenced_from)
    parents = data.pop(DEFAULTS_KEY, None)
    if parents is None:
        parents = []
    elif isinstance(parents, str):
        parents = [parents]
    elif not (isinstance(parents, list) and all(isinstance(p, str) for p in parents)):
        raise ConfigError(f"{display_path(path)}: `defaults:` must be a path or a list of paths")
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for parent in parents:
        tree, tree_sources = _load_tree(
            path.parent / parent, (*chain, path), files, display_path(path)
        )
        _merge(merged, tree, sources, tree_sources)
    _merge(merged, data, sources, display_path(path))
    files.append(display_path(path))
    return merged, sources


# ---------------------------------------------------------------------------------------
# Overrides


def apply_overrides(
    tree: dict[str, Any], overrides: Sequence[str], sources: dict[str, str]
) -> None:
    """Apply `a.b.c=value` strings (values parsed as YAML) in order."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {item!r}: expected key=value, e.g. dapo.loss.clip_ratio_high=0.28"
            )
        key, text = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: empty key component")
        try:
            value = parse_yaml_value(text)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: value is not valid YAML") from None
        node = tree
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if not isinstance(child, dict):
                prefix = ".".join(parts[: depth + 1])
                if child is None and part not in node:
                    _raise_unknown(prefix, CLI_SOURCE, {key: value})
                raise ConfigError(f"override {item!r}: {prefix} is a value, not a section")
            node = child
        _merge(
            node,
            {parts[-1]: value},
            sources,
            CLI_SOURCE,
            ".".join(parts[:-1]) + "." if len(parts) > 1 else "",
        )


# ---------------------------------------------------------------------------------------
# Typed conversion


def all_keys(cls: type = DapoMegatronConfig, prefix: str = "") -> list[str]:
    """Every valid dotted key (sections and leaves) of the schema."""
    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        keys.append(dotted)
        if dataclasses.is_dataclass(hints[f.name]):
            keys.extend(all_keys(hints[f.name], dotted + "."))
    return keys


def closest_key(key: str) -> str | None:
    """The valid key a user most likely meant."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf in PEER_ALIASES:
        return PEER_ALIASES[leaf]
    valid = all_keys()
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if match:
        return match[0]
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in valid}
    match = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.7)
    return by_leaf[match[0]] if match else None


def _raise_unknown(key: str, source: str, foreign: dict[str, Any] | None = None) -> typing.NoReturn:
    """An unknown key: another system's name (migrate/dialects.py) is translated, with its
    value, from `foreign` (the dotted keys and values under the unknown one); anything else
    gets the closest valid key."""
    translated = explain_foreign(foreign or {}, source)
    if translated is not None:
        raise ConfigError(translated)
    hint = closest_key(key)
    fix = f"; did you mean {hint}?" if hint else "; see configs/dapo_base.yaml for valid keys"
    raise ConfigError(f"unknown key {key} in {source}{fix}")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


_NO_MATCH = object()


def _coerce(value: Any, tp: Any) -> Any:
    """Return value as type tp, or _NO_MATCH. ints widen to float; bools are not ints."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            out = _coerce(value, arg)
            if out is not _NO_MATCH:
                return out
        return _NO_MATCH
    if origin is Literal:
        return (
            value if value in typing.get_args(tp) and isinstance(value, str | bool) else _NO_MATCH
        )
    if origin is list:
        if not isinstance(value, list):
            return _NO_MATCH
        items = [_coerce(v, typing.get_args(tp)[0]) for v in value]
        return _NO_MATCH if any(i is _NO_MATCH for i in items) else items
    if tp is type(None):
        return None if value is None else _NO_MATCH
    if tp is bool:
        return value if isinstance(value, bool) else _NO_MATCH
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO_MATCH
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        return _NO_MATCH
    if tp is str:
        return value if isinstance(value, str) else _NO_MATCH
    raise TypeError(f"schema type {tp} is not supported by the loader")


def build(cls: type, tree: dict[str, Any], sources: dict[str, str], prefix: str = "") -> Any:
    """Turn a merged mapping into the dataclass `cls`, checking keys and types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in tree:
        if key not in names:
            dotted = f"{prefix}{key}"
            value = tree[key]
            under = flatten(value, dotted + ".") if isinstance(value, dict) else {dotted: value}
            _raise_unknown(dotted, _source_of(dotted, sources), under)
    kwargs = {}
    for name in names:
        dotted = f"{prefix}{name}"
        tp = hints[name]
        if name not in tree:
            raise ConfigError(
                f"missing key {dotted}: recipes normally start with "
                f"`defaults: ../configs/dapo_base.yaml`, which defines every key"
            )
        value = tree[name]
        # isinstance first: is_dataclass alone also accepts instances, and build() takes a class.
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{dotted} in {_source_of(dotted, sources)}: expected a section "
                    f"(mapping), got {value!r}"
                )
            kwargs[name] = build(tp, value, sources, dotted + ".")
            continue
        out = _coerce(value, tp)
        if out is _NO_MATCH:
            raise ConfigError(
                f"{dotted} in {_source_of(dotted, sources)}: expected {_type_name(tp)}, "
                f"got {value!r} ({type(value).__name__})"
            )
        kwargs[name] = out
    return cls(**kwargs)


def _source_of(dotted: str, sources: dict[str, str]) -> str:
    while dotted:
        if dotted in sources:
            return sources[dotted]
        matches = [v for k, v in sources.items() if k.startswith(dotted + ".")]
        if matches:
            return matches[-1]
        dotted = dotted.rpartition(".")[0]
    return "unknown file"


# ---------------------------------------------------------------------------------------
# Entry point


def load_config(
    path: str | Path, overrides: Sequence[str] = (), *, validate: bool = True
) -> LoadedConfig:
    """Load, merge, override, type-check and (by default) validate a recipe."""
    files: list[str] = []
    tree, sources = _load_tree(Path(path), (), files)
    apply_overrides(tree, overrides, sources)
    config = build(DapoMegatronConfig, tree, sources)
    loaded = LoadedConfig(config=config, sources=sources, files=files)
    if validate:
        # The layers in the order applied: a policy.model_arch from an earlier layer than
        # policy.model_name_or_path does not describe that model (config/validate.py).
        loaded.plan = validate_config(config, sources, [*files, CLI_SOURCE])
    return loaded
