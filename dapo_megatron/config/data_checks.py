"""Checks of the data keys that take NeMo RL's data settings: data.prompt_template
(config/validate.py reports them with the key, value and file).

Here, not in data/, so that validation imports no dataset code; data/prompt_template.py
re-exports `template_problem`."""

from __future__ import annotations

from string import Formatter

from dapo_megatron.config.schema_data import DataConfig

def template_problem(template: str) -> str | None:
    """Why ``template`` is not a usable data.prompt_template, or None when it is.

    Usable: exactly one replacement field, positional (``{}`` or ``{0}``), so that
    ``template.format(problem)`` is what NeMo RL computes (processors.py
    math_hf_data_processor); any other literal brace doubled.
    """
    try:
        fields = [f for _, f, _, _ in Formatter().parse(template) if f is not None]
    except ValueError as e:  # an unmatched single brace
        return f"is not a format string ({e}); write a literal brace as {{{{ or }}}}"
    if len(fields) != 1 or fields[0] not in ("", "0"):
        found = ", ".join("{" + f + "}" for f in fields) or "none"
        return (
            f"needs exactly one {{}} field for the problem text (found: {found}); "
            "write literal braces as {{ and }} (NeMo RL's cot.txt: \\boxed{{}})"
        )
    return None


def data_problems(data: DataConfig) -> list[tuple[str, str]]:
    """(key, what is wrong and the fix) for each violated rule of the keys."""
    problems: list[tuple[str, str]] = []
    template = data.prompt_template
    if template is not None and (why := template_problem(template)) is not None:
        problems.append(("data.prompt_template", why))
    return problems
