"""The comments of configs/dapo_base.yaml, generated from the schema's docstrings.

Each configuration key is documented once: by the docstring of its field in the schema
(config/schema.py and its sections, config/schema_run.py, schema_policy.py, schema_dapo.py,
schema_data.py; for ``dapo.loss``, algorithms/loss_spec.py ``LossParams``). The
trailing ``# ...`` comment of every key line of the base YAML is that docstring's summary
line, its first sentence; this module computes them and rewrites the file, and
tests/unit/config/test_yaml_comments.py fails whenever the file and the docstrings disagree.

    python -m dapo_megatron.config.yaml_comments          # rewrite configs/dapo_base.yaml
    python -m dapo_megatron.config.yaml_comments --check  # exit 1 if it would change or
                                                          # a docstring gives no usable comment

Only the comment text of leaf key lines changes: values, order, blank lines, section lines
and comment-only lines are kept byte for byte.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path

from dapo_megatron.config.schema import DapoMegatronConfig

BASE_YAML = Path(__file__).resolve().parents[2] / "configs" / "dapo_base.yaml"
"""The base configuration whose comments are generated."""
COMMAND = "python -m dapo_megatron.config.yaml_comments"
"""The command that regenerates the comments (named by the test when they disagree)."""
MAX_LINE = 110
"""Longest key line (code + comment) a summary may produce; longer is an error, fixed by
shortening the docstring's first sentence, never by truncating it here."""
COMMENT_COLUMN = 34
"""Column of a comment added to a key line that had none (the file's usual alignment)."""

# `  key: value   # comment`: the value stops at the first `#` preceded by whitespace
# (the base config has no quoted `#`); a value-less key is a section line.
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")
_COMMENT = re.compile(r"(?P<pad>\s+)#(?P<text>.*)$")
# A sentence ends at a period followed by whitespace and a capital (or the end): "Eq. 13",
# "0.2" and "e.g. x" stay inside their sentence.
_SENTENCE_END = re.compile(r"\.(?=\s+[A-Z(<>]|\s*$)")
_BRACES = re.compile(
    r"(?P<stem>[A-Za-z0-9_.\-]*)\{(?P<alts>[A-Za-z0-9_.\-]+(?:,[A-Za-z0-9_.\-]+)+)\}"
)


def _class_field_docs(cls: type) -> dict[str, str]:
    """Docstrings of the fields ``cls`` itself declares (the string under each annotation)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str] = {}
    for stmt, nxt in zip(node.body, node.body[1:] + [None], strict=True):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings of every dataclass field of ``cls``, inherited ones included (LossConfig
    takes most of its fields from LossParams); a field without one is missing."""
    docs: dict[str, str] = {}
    # Base classes first, so a subclass's redeclaration documents the field it redeclares.
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_class_field_docs(klass))
    return docs


def key_docs(root: type = DapoMegatronConfig, prefix: str = "") -> dict[str, str]:
    """Docstring of every leaf key under ``root``, by dotted key (``dapo.loss.kl_coef``);
    a field without a docstring maps to ""."""
    hints = typing.get_type_hints(root)
    docs = field_docs(root)
    out: dict[str, str] = {}
    for f in dataclasses.fields(root):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            out.update(key_docs(kind, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = docs.get(f.name, "")
    return out


def _choices(kind: object) -> tuple[str, ...]:
    """The string values a ``Literal`` type (possibly inside a union) allows, in order."""
    if typing.get_origin(kind) is typing.Literal:
        return tuple(str(v) for v in typing.get_args(kind) if isinstance(v, str))
    return tuple(c for arg in typing.get_args(kind) for c in _choices(arg))


def key_choices(root: type = DapoMegatronConfig, prefix: str = "") -> dict[str, tuple[str, ...]]:
    """The allowed values of every leaf key whose type is a ``Literal`` of strings."""
    hints = typing.get_type_hints(root)
    out: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(root):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            out.update(key_choices(kind, f"{prefix}{f.name}."))
        elif choices := _choices(kind):
            out[f"{prefix}{f.name}"] = choices
    return out


def key_comment(doc: str, choices: tuple[str, ...] = ()) -> str:
    """A key line's comment: the docstring's summary, followed by the allowed values of a
    ``Literal`` key unless the summary already names each of them (a reader of the YAML sees
    what else the key takes without opening the schema)."""
    text = summary(doc)
    named = set(re.findall(r"[A-Za-z0-9_.\-]+", _expand_braces(text)))
    if choices and not set(choices) <= named:
        text += f" ({' | '.join(choices)})"
    return text


def _expand_braces(text: str) -> str:
    """``text`` with each ``stem{a,b}`` written out as ``stema stemb``: a summary may name
    long values that share a stem this way (``seq-mean-token-{sum,mean}``) to fit one line."""
    return _BRACES.sub(lambda m: " ".join(m["stem"] + alt for alt in m["alts"].split(",")), text)


def summary(doc: str) -> str:
    """The summary line of a docstring, without the final period (YAML comments carry none):
    its first paragraph when a blank line follows it, else its first sentence."""
    flat = " ".join(doc.split("\n\n", 1)[0].split()) if "\n\n" in doc else " ".join(doc.split())
    if "\n\n" in doc:
        return flat.removesuffix(".")
    end = _SENTENCE_END.search(flat)
    return flat[: end.start()] if end else flat


@dataclass(frozen=True)
class KeyLine:
    """One leaf key line of the YAML and the comment the docstrings give it."""

    number: int
    """1-based line number."""
    key: str
    """Dotted key."""
    current: str | None
    """The line's comment text now (None: no comment)."""
    wanted: str
    """The comment text generated from the docstring."""
    line: str
    """The line with the wanted comment."""


def key_lines(text: str, docs: dict[str, str] | None = None) -> list[KeyLine]:
    """Every leaf key line of ``text`` (a YAML file laid out like the base config), with the
    comment its docstring gives it. Raises KeyError for a key the schema lacks."""
    docs = key_docs() if docs is None else docs
    choices = key_choices()
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing sections
    out: list[KeyLine] = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _KEY_LINE.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        rest = match["rest"]
        comment = _COMMENT.search(rest)
        value = rest[: comment.start()] if comment else rest
        key = ".".join([k for _, k in stack] + [match["key"]])
        if not value.strip():
            # A section: its own comment (if any) is the file's, not a key's.
            stack.append((indent, match["key"]))
            continue
        wanted = key_comment(docs[key], choices.get(key, ()))
        if comment:
            code = line[: len(line) - len(rest) + comment.start()] + comment["pad"]
            current: str | None = comment["text"].strip()
        else:
            code = line.rstrip()
            code += " " * max(2, COMMENT_COLUMN - len(code))
            current = None
        out.append(KeyLine(number, key, current, wanted, f"{code}# {wanted}"))
    return out


def render(text: str) -> str:
    """``text`` with every key line's comment replaced by its generated one."""
    lines = text.splitlines(keepends=True)
    for item in key_lines(text):
        ending = lines[item.number - 1][len(lines[item.number - 1].rstrip("\r\n")) :]
        lines[item.number - 1] = item.line + ending
    return "".join(lines)


def problems(text: str) -> list[str]:
    """Keys whose docstring gives no usable comment: none at all, or one whose line would
    exceed MAX_LINE (shorten the docstring's first sentence into a summary line)."""
    found = []
    for item in key_lines(text):
        if not item.wanted:
            found.append(f"{item.key}: no docstring")
        elif len(item.line) > MAX_LINE:
            found.append(
                f"{item.key}: line {len(item.line)} > {MAX_LINE} chars; shorten the first "
                f"sentence of its docstring: {item.wanted!r}"
            )
    return found


def main(argv: list[str] | None = None) -> int:
    """Rewrite the base YAML's comments (``--check``: only report whether it would change)."""
    args = sys.argv[1:] if argv is None else argv
    text = BASE_YAML.read_text()
    found = problems(text)
    for problem in found:
        print(problem, file=sys.stderr)
    new = render(text)
    changed = [i for i in key_lines(text) if i.current != i.wanted]
    if "--check" in args:
        for item in changed:
            print(f"{item.key}: {item.current!r} -> {item.wanted!r}")
        # A comment too long or missing fails the check as a stale one does.
        return 1 if changed or found else 0
    if new != text:
        BASE_YAML.write_text(new)
    print(f"{BASE_YAML.name}: {len(changed)} of {len(key_lines(text))} comments rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
