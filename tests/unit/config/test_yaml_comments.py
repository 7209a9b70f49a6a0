"""One documentation source per configuration key: the schema's field docstrings.

configs/dapo_base.yaml's key comments are generated from them
(dapo_megatron/config/yaml_comments.py); these tests fail when the two disagree.
"""

from __future__ import annotations

import ast
import inspect

from dapo_megatron.config import schema, schema_dapo, schema_data, schema_policy, schema_run
from dapo_megatron.config.loader import all_keys
from dapo_megatron.config.yaml_comments import (
    BASE_YAML,
    COMMAND,
    MAX_LINE,
    key_docs,
    key_lines,
    render,
    summary,
)

# Keys documented in algorithms/loss_spec.py (LossParams), whose first sentences are still
# longer than one comment line allows; owned by another file, shortened there later. The
# test fails once one fits, so the list only shrinks.
LONG_SUMMARY_ALLOWED = {
    # Its four allowed values, listed after the summary, do not fit one line.
    "dapo.loss.loss_agg_mode",
}


def test_every_schema_field_has_a_docstring() -> None:
    missing = []
    nodes = [
        node
        for module in (schema, schema_run, schema_policy, schema_dapo, schema_data)
        for node in ast.parse(inspect.getsource(module)).body
    ]
    for node in nodes:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                doc = body[i + 1] if i + 1 < len(body) else None
                if not (
                    isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)
                ):
                    missing.append(f"{node.name}.{stmt.target.id}")
    assert missing == []


def test_every_key_has_a_docstring_summary() -> None:
    # Inherited fields (LossConfig from LossParams) included: every leaf key is documented.
    docs = key_docs()
    leaves = {k for k in all_keys() if not any(o.startswith(k + ".") for o in all_keys())}
    assert set(docs) == leaves
    assert [k for k, d in docs.items() if not summary(d)] == []


def test_base_yaml_comments_are_the_docstring_summaries() -> None:
    text = BASE_YAML.read_text()
    lines = key_lines(text)
    assert len(lines) == len(key_docs())  # every key has its line, none is skipped
    wrong = [
        f"configs/dapo_base.yaml:{i.number} {i.key}\n  yaml:      {i.current!r}\n"
        f"  docstring: {i.wanted!r}"
        for i in lines
        if i.current != i.wanted
    ]
    assert not wrong, (
        "YAML comments differ from the schema docstrings (edit the docstring, then run "
        f"`{COMMAND}`):\n" + "\n".join(wrong)
    )
    assert render(text) == text


def test_summaries_fit_one_comment_line() -> None:
    long = {i.key for i in key_lines(BASE_YAML.read_text()) if len(i.line) > MAX_LINE}
    assert long - LONG_SUMMARY_ALLOWED == set(), "shorten these docstrings' first sentences"
    assert LONG_SUMMARY_ALLOWED - long == set(), "these fit now: drop them from the list"


def test_summary_is_the_first_paragraph_or_sentence() -> None:
    assert summary("Short line.\n\nDetails. More.") == "Short line"
    assert summary("One (DAPO Eq. 13) thing; 0.5 x. Second sentence.") == (
        "One (DAPO Eq. 13) thing; 0.5 x"
    )
    assert summary("A bound (DAPO: 0). > 0: more.") == "A bound (DAPO: 0)"
