"""data.prompt_template (data/prompt_template.py): NeMo RL's prompt_file semantics,
``template.format(problem)`` as the user message, before the chat template."""

from __future__ import annotations

import pytest

from dapo_megatron.data.datasets import encode_prompts
from dapo_megatron.data.prompt_template import (
    NEMO_COT_TEMPLATE,
    apply_prompt_template,
    template_problem,
)
from dapo_megatron.data.records import PromptRecord
from dapo_megatron.data.tokenizer import build_char_tokenizer

# NeMo RL's examples/prompts/cot.txt at 7ea279ab, byte for byte (two backslashes, doubled
# braces, no final newline), filled with a problem the way str.format does: the doubled
# braces become one pair, the backslashes stay.
COT_FOR_ONE_PLUS_ONE = (
    "Think step-by-step to solve the following problem. Output your answer inside of "
    r"\\boxed{} tags.:" + "\nWhat is 1+1?\n\nLet's think step-by-step"
)


def test_cot_template_fills_the_problem_and_unescapes_braces() -> None:
    assert NEMO_COT_TEMPLATE.count("\\") == 2 and not NEMO_COT_TEMPLATE.endswith("\n")
    messages = apply_prompt_template(
        [{"role": "user", "content": "What is 1+1?"}], NEMO_COT_TEMPLATE
    )
    assert messages == [{"role": "user", "content": COT_FOR_ONE_PLUS_ONE}]
    assert template_problem(NEMO_COT_TEMPLATE) is None


def test_only_the_first_user_message_is_templated() -> None:
    messages = [
        {"role": "system", "content": "Be brief {}."},
        {"role": "user", "content": "2+2"},
        {"role": "user", "content": "later"},
    ]
    out = apply_prompt_template(messages, "Q: {0}!")
    assert out == [messages[0], {"role": "user", "content": "Q: 2+2!"}, messages[2]]
    assert messages[1]["content"] == "2+2"  # the input is not changed
    assert apply_prompt_template(messages, None) is messages


@pytest.mark.parametrize(
    "template, why",
    [
        ("no field", "found: none"),
        ("{} and {}", "found: {}, {}"),
        ("{problem}", "found: {problem}"),
        ("\\boxed{} {}", "found: {}, {}"),  # cot.txt's braces not doubled
        ("open { {}", "not a format string"),
        ("close } {}", "Single '}'"),
    ],
)
def test_templates_without_exactly_one_field_are_refused(template: str, why: str) -> None:
    problem = template_problem(template)
    assert problem is not None and why in problem and "{{" in problem


def test_encode_prompts_applies_the_template_before_the_chat_template() -> None:
    tokenizer = build_char_tokenizer()
    records = [PromptRecord("1+2", "3"), PromptRecord([{"role": "user", "content": "4*5"}], "20")]
    plain = encode_prompts(
        records, tokenizer, apply_chat_template=False, max_prompt_length=32, prompt_template="({})="
    )
    bos = tokenizer.bos_token_id
    assert plain.input_ids[0] == [bos, *tokenizer.convert_tokens_to_ids(list("(1+2)="))]
    assert plain.records[0].prompt == "1+2"  # the record keeps the problem
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}={% endif %}"
    )
    chat = encode_prompts(
        records, tokenizer, apply_chat_template=True, max_prompt_length=32, prompt_template="({})"
    )
    assert chat.input_ids[1] == [bos, *tokenizer.convert_tokens_to_ids(list("(4*5)\n="))]
    # The template's length counts against max_prompt_length.
    short = encode_prompts(
        records, tokenizer, apply_chat_template=False, max_prompt_length=5, prompt_template="({})="
    )
    assert short.num_too_long == 2
