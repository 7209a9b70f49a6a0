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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.foreign_hint import flatten
from dapo_megatron.config.loader import display_path, parse_yaml_value, read_exponent_floats

_OVERRIDE_KEY = re.compile(r"^(\+{0,2}|~)([A-Za-z_][\w\-]*(?:\.[\w\-]+)+)$")
_SHELL_ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)
_SHELL_NAME = re.compile(r"[A-Za-z_]\w*")
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


def read_source(path: Path, shell_vars: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The flat keys of a YAML config or a launch script, in the order they appear;
    `shell_vars` are a script's environment (e.g. HOME), unknown variables stay `${NAME}`."""
    if path.is_dir():
        raise ConfigError(f"{display_path(path)} is a directory; pass the config file to import")
    if not path.is_file():
        raise ConfigError(f"{display_path(path)} not found; pass the config file to import")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".sh", ".bash") or text.startswith("#!"):
        return script_overrides(text, shell_vars)
    return _yaml_tree(path, ())


# yaml ships no type information (no types-PyYAML), so SafeLoader is Any.
class _ForeignLoader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that reads `2e-05` as a float, as the peers' OmegaConf/Hydra do (YAML 1.1
    wants `2.0e-05`): RLinf's `optim.lr: 2e-05` is a number there, not the string PyYAML
    would make of it."""


read_exponent_floats(_ForeignLoader)


def _yaml_tree(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        raise ConfigError(f"{display_path(path)}: `defaults:` cycle")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_ForeignLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{display_path(path)}: invalid YAML: {e}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{display_path(path)}: expected a YAML mapping at the top level")
    flat: dict[str, Any] = {}
    parents = data.pop("defaults", None)
    for parent in [parents] if isinstance(parents, str) else []:
        parent_path = path.parent / parent
        if not parent_path.is_file():
            raise ConfigError(
                f"{display_path(path)}: its `defaults:` parent {parent} ({display_path(parent_path)}) "
                f"is not there; put it next to the file as the source repository has it, or "
                f"import the merged config (its keys would otherwise be missing)"
            )
        flat.update(_yaml_tree(parent_path, (*chain, path)))
    if isinstance(parents, list) and all(
        isinstance(p, dict) and all(str(k).startswith("override hydra/") for k in p)
        for p in parents
    ):
        parents = None  # Hydra's own logging/launcher settings: nothing of the run
    if isinstance(parents, list):
        raise ConfigError(
            f"{display_path(path)}: `defaults:` is a list of Hydra config groups, which this "
            f"importer does not compose; import the composed config (e.g. Hydra's --cfg job)"
        )
    for key, value in flatten(data).items():
        merge_key(flat, key, value)
    return flat


def merge_key(flat: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` as OmegaConf's merge does: the child's value replaces the parent's whole
    subtree (`policy.optimizer: null` removes every `policy.optimizer.*`), and a child's
    `a.b.c` replaces a parent's leaf `a.b` (a null or a scalar)."""
    for k in [k for k in flat if k == key or k.startswith(key + ".")]:
        del flat[k]
    parts = key.split(".")
    for i in range(1, len(parts)):
        flat.pop(".".join(parts[:i]), None)
    flat[key] = value


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
        if isinstance(value, dict) and value:
            merge_key(flat, dotted, None)
            del flat[dotted]
            flat.update(flatten(value, dotted + "."))
        else:
            merge_key(flat, dotted, value)


def script_overrides(text: str, shell_vars: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The dotted `key=value` overrides of a bash launch script, with its `VAR=value`
    assignments expanded as bash does (`${VAR:-default}` with nested expansions and
    quotes, `$VAR`, `$((a * b))`, `$'...'`); a variable the script does not set (HOME, one
    from the environment) stays `${NAME}` unless `shell_vars` gives it, and a leading `~`
    is `${HOME}`. A line that holds overrides but cannot be parsed is an error."""
    variables: dict[str, str] = dict(shell_vars or {})
    flat: dict[str, Any] = {}
    for number, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        expanded = expand_shell(line, variables)
        try:
            tokens = shlex.split(expanded, comments=True)
        except ValueError as e:
            if _HAS_OVERRIDE.search(line):
                raise ConfigError(
                    f"line {number} of the script holds overrides but cannot be parsed as a "
                    f"shell command ({e}): {line.strip()[:120]}"
                ) from None
            continue  # a heredoc or a python -c body: no override
        if tokens[:1] == ["export"]:
            tokens = tokens[1:]
        assigns = [a for t in tokens if (a := _SHELL_ASSIGN.match(t))]
        if tokens and len(assigns) == len(tokens):
            for a in assigns:
                variables[a.group(1)] = a.group(2)
            continue
        tokens = [t for t in tokens if "=" in t and _OVERRIDE_KEY.match(t.split("=", 1)[0])]
        apply_foreign_overrides(flat, tokens)
    return flat


_HAS_OVERRIDE = re.compile(r"(?:^|\s)\+{0,2}[A-Za-z_][\w\-]*(?:\.[\w\-]+)+=")


def expand_shell(line: str, variables: dict[str, str]) -> str:
    """One line with its parameter expansions done, as bash would (see script_overrides);
    quotes are kept for shlex, except that `$'...'` becomes a single-quoted word."""
    out: list[str] = []
    i, n = 0, len(line)
    quote = ""  # the quote we are inside: "" none, "'" or '"'
    while i < n:
        c = line[i]
        if quote == "'":
            out.append(c)
            if c == "'":
                quote = ""
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            out.append(line[i : i + 2])
            i += 2
            continue
        if c == "#" and not quote and (i == 0 or line[i - 1].isspace()):
            break  # a comment
        if c in "'\"" and not quote:
            if c == "'" and out and out[-1] == "$":
                out.pop()
                j = line.find("'", i + 1)
                while j > 0 and line[j - 1] == "\\":
                    j = line.find("'", j + 1)
                j = n if j < 0 else j
                body = line[i + 1 : j].encode("utf-8").decode("unicode_escape")
                out.append(shlex.quote(body))
                i = j + 1
                continue
            quote = c
            out.append(c)
            i += 1
            continue
        if c == '"' and quote == '"':
            quote = ""
            out.append(c)
            i += 1
            continue
        if (
            c == "~"
            and not quote
            and (i == 0 or line[i - 1] in " =:\t")
            and line[i + 1 : i + 2] in ("/", "", " ")
        ):
            out.append(variables.get("HOME", "${HOME}"))
            i += 1
            continue
        if c != "$" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = line[i + 1]
        if line.startswith("$((", i):
            j = _matching(line, i + 1, "(", ")")
            inner = line[i + 3 : j - 1]
            expr = _SHELL_NAME.sub(lambda m: variables.get(m.group(0), m.group(0)), inner)
            expr = expand_shell(expr, variables)
            try:
                out.append(str(_arith(expr)))
            except (ValueError, SyntaxError, ZeroDivisionError):
                out.append(line[i : j + 1])
            i = j + 1
            continue
        if nxt == "{":
            j = _matching(line, i + 1, "{", "}")
            out.append(_parameter(line[i + 2 : j], variables))
            i = j + 1
            continue
        m = _SHELL_NAME.match(line, i + 1)
        if m:
            name = m.group(0)
            out.append(variables[name] if name in variables else "${" + name + "}")
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _matching(line: str, start: int, open_: str, close: str) -> int:
    """The index of the bracket closing the one at `start` (quotes and nesting skipped)."""
    depth, quote, i = 0, "", start
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ConfigError(f"unbalanced {open_!r} in the script line: {line.strip()[:120]}")


_PARAM = re.compile(r"^([A-Za-z_]\w*)(?:(:?[-=+])(.*))?$", re.S)


def _parameter(body: str, variables: dict[str, str]) -> str:
    """`${body}`: NAME, NAME:-word / NAME-word (default), NAME:=word (default, assigned),
    NAME:+word (alternative); the word is expanded and its quotes removed."""
    m = _PARAM.match(body)
    if m is None:
        return "${" + body + "}"  # ${#x}, ${x/a/b}...: left for the importer to name
    name, op, word = m.group(1), m.group(2), m.group(3)
    value = variables.get(name)
    unset = value is None or (op is not None and op.startswith(":") and value == "")
    if op is None:
        return value if value is not None else "${" + name + "}"
    if op.endswith("+"):
        return "" if unset else _word(word, variables)
    if not unset:
        return value  # type: ignore[return-value]
    result = _word(word, variables)
    if op.endswith("="):
        variables[name] = result
    return result


def _word(word: str, variables: dict[str, str]) -> str:
    expanded = expand_shell(word, variables)
    try:
        parts = shlex.split(expanded, comments=False, posix=True)
    except ValueError:
        return expanded
    return " ".join(parts)


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
