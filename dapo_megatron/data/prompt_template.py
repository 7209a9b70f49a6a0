"""data.prompt_template: the text around each problem, NeMo RL's ``prompt_file``.

NeMo RL (read at 7ea279ab) loads ``data.default.prompt_file`` whole, without stripping
(nemo_rl/data/interfaces.py ``TaskDataSpec.__post_init__``: ``f.read()``), and
nemo_rl/data/processors.py ``math_hf_data_processor`` makes the user message
``task_data_spec.prompt.format(problem)`` (the problem is the dataset's first message,
``messages[0]["content"]``), puts the system prompt (``system_prompt_file``, if any) before
it and renders both with the tokenizer's chat template, ``add_generation_prompt=True``.

So a template is a Python ``str.format`` string with one positional field, and ``{{`` /
``}}`` are literal braces; we keep those semantics exactly (``str.format`` itself), so a
NeMo RL prompt file's text is a valid ``data.prompt_template`` unchanged. Backslashes are
not escapes for ``str.format``: examples/prompts/cot.txt writes ``\\\\boxed{{}}`` and the
model sees two backslashes before ``boxed{}``, as in NeMo RL.
"""

from __future__ import annotations

from dapo_megatron.config.data_checks import template_problem
from dapo_megatron.data.records import Message

__all__ = ["NEMO_COT_TEMPLATE", "apply_prompt_template", "template_problem"]

NEMO_COT_TEMPLATE = (
    "Think step-by-step to solve the following problem. Output your answer inside of "
    "\\\\boxed{{}} tags.:\n{}\n\nLet's think step-by-step"
)
"""The text of NeMo RL's examples/prompts/cot.txt (no final newline), the prompt_file of
examples/configs/grpo_math_1B.yaml and the recipes built on it."""


def apply_prompt_template(messages: list[Message], template: str | None) -> list[Message]:
    """The messages with the first user message's content put through ``template``.

    The first user message is the problem, as NeMo RL's math_hf_data_processor takes
    ``messages[0]`` (its datasets put the user message first); a system message before it
    and any later messages are kept as they are. None: the messages unchanged.
    """
    if template is None:
        return messages
    out = list(messages)
    for i, message in enumerate(out):
        if message["role"] == "user":
            out[i] = {**message, "content": template.format(message["content"])}
            break
    return out
