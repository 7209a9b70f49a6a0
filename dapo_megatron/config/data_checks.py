"""Checks of the data keys that take NeMo RL's data settings: data.prompt_template and
data.val_fraction (config/validate.py reports them with the key, value and file).

Here, not in data/, so that validation imports no dataset code; data/prompt_template.py
re-exports `template_problem`."""

from __future__ import annotations

from string import Formatter

from dapo_megatron.config.schema_data import DataConfig

GENERATED_FORMATS = ("arithmetic", "remainder")
"""data.format values whose validation set the task generates (no training file to split)."""


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
    """(key, what is wrong and the fix) for each violated rule of the two keys; the range
    of data.val_fraction, (0, 1), is config/float_ranges.py's."""
    problems: list[tuple[str, str]] = []
    template = data.prompt_template
    if template is not None and (why := template_problem(template)) is not None:
        problems.append(("data.prompt_template", why))
    if data.val_fraction is not None:
        if data.val_path is not None:
            problems.append(
                (
                    "data.val_fraction",
                    f"holds out validation prompts, but data.val_path = {data.val_path} "
                    "names a validation file too; set data.val_path: null (validate on the "
                    "held-out share) or data.val_fraction: null (validate on the file)",
                )
            )
        if data.format in GENERATED_FORMATS:
            problems.append(
                (
                    "data.val_fraction",
                    f"data.format {data.format} generates its own validation problems; set "
                    "data.val_fraction: null",
                )
            )
    return problems
