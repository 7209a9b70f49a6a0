"""Read another system's config into flat `dotted.key -> value` pairs.

Three shapes arrive: a YAML config (NeMo RL, RLinf; `defaults:` parents followed as NeMo RL
does, the child winning), a launch script of Hydra overrides (verl's and SkyRL's DAPO
recipes are bash scripts: `VAR=...` lines, then `python -m ... a.b=$VAR +c.d=...`), and
overrides on the command line in Hydra syntax (`key=value`, `+key=value`, `++key=value`,
`~key`). Values are parsed as YAML; `${a.b}` interpolations of another key are resolved.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from dapo_megatron.config.dialects import flatten
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import display_path, parse_yaml_value

_OVERRIDE_KEY = re.compile(r"^(\+{0,2}|~)([A-Za-z_][\w\-]*(?:\.[\w\-]+)+)$")
_SHELL_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)
_SHELL_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")
_SHELL_ARITH = re.compile(r"\$\(\(([\w\s+\-*/%()]*)\)\)")
_SHELL_NAME = re.compile(r"[A-Za-z_]\w*")
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


def read_source(path: Path) -> dict[str, Any]:
    """The flat keys of a YAML config or a launch script, in the order they appear."""
    if not path.is_file():
        raise ConfigError(f"{display_path(path)} not found; pass the config file to import")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".sh", ".bash") or text.startswith("#!"):
        return script_overrides(text)
    return _yaml_tree(path, ())


def _yaml_tree(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        raise ConfigError(f"{display_path(path)}: `defaults:` cycle")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{display_path(path)}: invalid YAML: {e}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{display_path(path)}: expected a YAML mapping at the top level")
    flat: dict[str, Any] = {}
    parents = data.pop("defaults", None)
    for parent in [parents] if isinstance(parents, str) else []:
        parent_path = path.parent / parent
        if parent_path.is_file():
            flat.update(_yaml_tree(parent_path, (*chain, path)))
        else:
            # Kept as a key so that the import lists it: its values were not read.
            flat["defaults"] = parent
    if isinstance(parents, list):
        flat["defaults"] = parents
    for key, value in flatten(data).items():
        flat.pop(key, None)  # the child's value, at the child's position
        flat[key] = value
    return flat


def apply_foreign_overrides(flat: dict[str, Any], overrides: Sequence[str]) -> None:
    """Hydra-syntax overrides applied to `flat` in order (`~key` deletes)."""
    for item in overrides:
        key, sep, text = item.partition("=")
        match = _OVERRIDE_KEY.match(key.strip())
        if match is None or (match.group(1) != "~" and not sep):
            raise ConfigError(
                f"override {item!r}: expected key=value in the source system's syntax, "
                f"e.g. actor_rollout_ref.actor.clip_ratio_high=0.28 or +grpo.seed=1"
            )
        dotted = match.group(2)
        if match.group(1) == "~":
            for k in [k for k in flat if k == dotted or k.startswith(dotted + ".")]:
                del flat[k]
            continue
        try:
            value = parse_yaml_value(text)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: value is not valid YAML") from None
        for k in [k for k in flat if k.startswith(dotted + ".")]:
            del flat[k]
        flat.pop(dotted, None)
        if isinstance(value, dict):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value


def script_overrides(text: str) -> dict[str, Any]:
    """The dotted `key=value` overrides of a bash launch script, with its `VAR=value`
    assignments (and `${VAR:-default}`, `$((a * b))`) expanded."""
    variables: dict[str, str] = {}
    flat: dict[str, Any] = {}
    for line in text.replace("\\\n", " ").splitlines():
        expanded = _expand(line, variables)
        try:
            tokens = shlex.split(expanded, comments=True)
        except ValueError:
            continue  # a line shlex cannot split (heredoc, unbalanced quote) holds no override
        if tokens[:1] == ["export"]:
            tokens = tokens[1:]
        if len(tokens) == 1 and (assign := _SHELL_ASSIGN.match(tokens[0])):
            variables[assign.group(1)] = assign.group(2)
            continue
        tokens = [t for t in tokens if "=" in t and _OVERRIDE_KEY.match(t.split("=", 1)[0])]
        apply_foreign_overrides(flat, tokens)
    return flat


def _expand(line: str, variables: dict[str, str]) -> str:
    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in variables:
            return variables[name]
        return m.group(2) if m.group(2) is not None else m.group(0)

    def arith(m: re.Match[str]) -> str:
        # Bash arithmetic reads bare variable names too: $((train_prompt_bsz * 3)).
        expr = _SHELL_NAME.sub(lambda n: variables.get(n.group(0), n.group(0)), m.group(1))
        try:
            return str(_arith(expr))
        except (ValueError, SyntaxError, ZeroDivisionError):
            return m.group(0)

    line = _SHELL_VAR.sub(var, line)
    return _SHELL_ARITH.sub(arith, line)


_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,  # bash arithmetic is integer arithmetic
    ast.Mod: operator.mod,
}


def _arith(expr: str) -> int:
    """Bash `$(( ))` integer arithmetic of numbers (variables already expanded)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return int(_OPS[type(node.op)](ev(node.left), ev(node.right)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(expr)

    return ev(ast.parse(expr.strip(), mode="eval").body)


def resolve_interpolations(flat: dict[str, Any]) -> None:
    """`${a.b}` values (OmegaConf's reference to another key) replaced by that key's value;
    anything else with `${` stays a string (the import lists it as untranslated)."""
    for _ in range(8):  # chains of references, bounded
        changed = False
        for key, value in flat.items():
            if isinstance(value, str) and (m := _INTERPOLATION.match(value)):
                target = m.group(1)
                if target in flat and target != key:
                    flat[key] = flat[target]
                    changed = True
        if not changed:
            return
