"""One problem of a prompt dataset (its own module: both the file readers and the generated
arithmetic task build them, and neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]
"""A chat message: {"role": ..., "content": ...}."""


@dataclass(frozen=True)
class PromptRecord:
    """One training or validation problem."""

    prompt: str | list[Message]
    """Plain text, or chat messages ``[{"role": ..., "content": ...}, ...]``."""
    ground_truth: str
    """Reference answer handed to the verifier."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Everything else of the row (data_source, ability, extra_info, ...) and its ``row``
    number in the file (1-based)."""

    @property
    def messages(self) -> list[Message]:
        """The prompt as chat messages (plain text becomes one user message)."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return self.prompt

    @property
    def text(self) -> str:
        """The prompt as plain text (the contents of its messages, one per line)."""
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n".join(m["content"] for m in self.prompt)


def gsm8k_final_answer(solution: str) -> str | None:
    """The final answer of a GSM8K solution: the text after the last ``####``, without
    thousands separators (``"... #### 1,200"`` -> ``"1200"``); None when there is none."""
    head, sep, tail = solution.rpartition("####")
    answer = tail.strip().replace(",", "")
    return answer if sep and answer else None
