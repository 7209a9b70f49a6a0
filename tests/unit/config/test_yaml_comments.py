"""One documentation source per configuration key: the schema's field docstrings.

configs/dapo_base.yaml's key comments are generated from them
(dapo_megatron/config/yaml_comments.py); these tests fail when the two disagree.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from dapo_megatron.config import (
    schema,
    schema_dapo,
    schema_data,
    schema_policy,
    schema_run,
    yaml_comments,
)
from dapo_megatron.config.loader import all_keys
from dapo_megatron.config.yaml_comments import (
    BASE_YAML,
    COMMAND,
    MAX_LINE,
    key_comment,
    key_docs,
    key_lines,
    problems,
    render,
    summary,
)


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
    assert long == set(), "shorten these docstrings' first sentences"
    assert problems(BASE_YAML.read_text()) == []


def test_check_exits_1_on_a_problem_or_a_stale_comment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = BASE_YAML.read_text()
    copy = tmp_path / "dapo_base.yaml"
    monkeypatch.setattr(yaml_comments, "BASE_YAML", copy)
    copy.write_text(base)
    assert yaml_comments.main(["--check"]) == 0
    # A summary too long for its line, the comment already matching it: only the length
    # problem is left, and it alone fails the check.
    long_doc = "A summary line far too long for one comment line of the base config " * 2
    docs = {**key_docs(), "dapo.loss.kl_coef": long_doc}
    monkeypatch.setattr(yaml_comments, "key_docs", lambda: docs)
    copy.write_text(render(base))
    assert yaml_comments.main(["--check"]) == 1
    assert "dapo.loss.kl_coef: line" in capsys.readouterr().err
    # A stale comment fails it too.
    monkeypatch.undo()
    monkeypatch.setattr(yaml_comments, "BASE_YAML", copy)
    copy.write_text(base.replace("# KL penalty coefficient", "# Stale", 1))
    assert yaml_comments.main(["--check"]) == 1


def test_values_named_by_brace_expansion_are_not_listed_again() -> None:
    choices = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
    assert key_comment("Mode: token-mean or seq-mean-token-{sum,mean}.", choices) == (
        "Mode: token-mean or seq-mean-token-{sum,mean}"
    )
    assert key_comment("Mode: token-mean or seq-mean-token-{sum}.", choices).endswith(
        "(token-mean | seq-mean-token-sum | seq-mean-token-mean)"
    )


def test_summary_is_the_first_paragraph_or_sentence() -> None:
    assert summary("Short line.\n\nDetails. More.") == "Short line"
    assert summary("One (DAPO Eq. 13) thing; 0.5 x. Second sentence.") == (
        "One (DAPO Eq. 13) thing; 0.5 x"
    )
    assert summary("A bound (DAPO: 0). > 0: more.") == "A bound (DAPO: 0)"
