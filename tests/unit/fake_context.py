"""A RunContext over one-token prompts ``[i]``, for controller tests without Ray, Megatron
or a real tokenizer (import: ``unit.fake_context``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.context import (
    RunContext,
    make_dynamic_sampler,
    make_sampler,
    make_skipper,
)
from dapo_megatron.data.datasets import EncodedPrompts, PromptRecord


def fake_context(
    plan: RunPlan,
    num_prompts: int,
    verifier: Any,
    ground_truth: Callable[[int], str] = str,
) -> RunContext:
    """Prompt i is the token list ``[i]`` with ground truth ``ground_truth(i)``; the
    tokenizer decodes ids to their list's text (EOS 2, pad 0)."""
    records = [
        PromptRecord(prompt=str(i), ground_truth=ground_truth(i), metadata={})
        for i in range(num_prompts)
    ]
    train = EncodedPrompts(
        input_ids=[[i] for i in range(num_prompts)], records=records, num_too_long=0
    )
    tokenizer = SimpleNamespace(
        decode=lambda ids, skip_special_tokens: str(ids), eos_token_id=2, pad_token_id=0
    )
    return RunContext(
        plan=plan,
        run_dir=Path("."),
        checkpoint_dir=Path("."),
        tokenizer=tokenizer,
        train=train,
        val=None,
        sampler=make_sampler(plan.config, num_prompts),
        dynamic=make_dynamic_sampler(plan),
        verifier=verifier,
        skipper=make_skipper(plan.config),
    )
