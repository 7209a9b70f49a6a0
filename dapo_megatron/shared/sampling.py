"""A sample and the parameters it was drawn with: what every rollout engine returns.

The conventions every engine follows are in ``generation/base.py`` (``GenerationBackend``).
Torch-free and importing nothing of the package: the ground floor (``shared/__init__.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:  # annotations only: this module stays importable without torch
    import torch


class GenerationSettings(Protocol):
    """The fields of ``config.schema.GenerationConfig`` that rollout sampling reads (typed by
    shape, so that this module imports nothing of the config)."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def max_response_length(self) -> int: ...
    @property
    def stop_token_ids(self) -> list[int] | None: ...


FinishReason = Literal["stop", "length", "abort"]

FINISH_REASON_STOP: FinishReason = "stop"
"""Finish reason of a sample that ended on a stop token (EOS or a stop string)."""

FINISH_REASON_LENGTH: FinishReason = "length"
"""Finish reason of a sample that was cut off by the response-length cap."""

FINISH_REASON_ABORT: FinishReason = "abort"
"""Finish reason of a sample still running when its call stopped early
(``SamplingParams.finish_after_fraction``): its tokens so far, never trained as they are."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample the responses of one ``generate`` call (same for every prompt)."""

    temperature: float = 1.0
    """Logits are divided by it before softmax; must be > 0 (use top_k=1 for greedy)."""
    top_p: float = 1.0
    """Nucleus sampling: sample among the most likely tokens whose cumulative probability
    reaches top_p (the token that crosses it included); 1.0 = off. In (0, 1]."""
    top_k: int = -1
    """Sample among the top_k most likely tokens; -1 = off; 1 = greedy (argmax, no draw)."""
    max_tokens: int = 16
    """Response cap in tokens (not counting the prompt); a response that reaches it
    finishes with reason "length". >= 1."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end a response (typically the tokenizer's EOS); the stop token is
    kept as the last response token and the finish reason is "stop"."""
    seed: int | None = None
    """Seed of the per-call random generator: the same seed and the same inputs give the
    same samples; None draws a fresh seed."""
    n: int = 1
    """Samples per prompt (the DAPO group size); each is drawn independently."""
    logprobs: bool = True
    """Return the logprob of each sampled token (``Sample.logprobs``); False leaves it empty."""
    max_tokens_per_prompt: tuple[int, ...] | None = None
    """The response cap of each prompt of the call, in place of ``max_tokens``: continuations
    (``rollout.partial_rollouts``: a continued sample's prompt ends with the tokens it
    already has, and its cap is what the response has left) and
    ``generation.response_cap: context`` (``within_context``). Each >= 1."""
    finish_after_fraction: float | None = None
    """Cut the tail of the call: stop once ceil(fraction x prompts of the call) prompts have
    all their n samples finished; the other prompts' samples come back with finish reason
    "abort" (the tokens and logprobs generated so far; empty if never started). Each engine
    applies it to its own share of the prompts. None: every sample runs to its end."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature} (greedy: top_k=1)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens_per_prompt is not None and any(
            int(c) < 1 for c in self.max_tokens_per_prompt
        ):
            raise ValueError(
                f"max_tokens_per_prompt must be >= 1, got {self.max_tokens_per_prompt}"
            )
        cut = self.finish_after_fraction
        if cut is not None and not 0.0 < cut <= 1.0:
            raise ValueError(f"finish_after_fraction must be in (0, 1] or None, got {cut}")
        if any(int(t) < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be >= 0, got {self.stop_token_ids}")

    def response_caps(self, num_prompts: int) -> list[int]:
        """The response cap of each of ``num_prompts`` prompts: ``max_tokens_per_prompt``
        when given (it must hold one cap per prompt), else ``max_tokens`` for all."""
        if self.max_tokens_per_prompt is None:
            return [self.max_tokens] * num_prompts
        if len(self.max_tokens_per_prompt) != num_prompts:
            raise ValueError(
                f"max_tokens_per_prompt holds {len(self.max_tokens_per_prompt)} caps for "
                f"{num_prompts} prompts"
            )
        return list(self.max_tokens_per_prompt)

    def within_context(self, prompt_lengths: Sequence[int], context_length: int) -> SamplingParams:
        """These parameters with each prompt's cap cut to the context left after it:
        ``min(cap, context_length - prompt length)`` (``generation.response_cap: context``).

        NeMo RL's vLLM engine (max_model_len = policy.max_total_sequence_length) ends each
        response there (nemo_rl/models/generation/vllm/vllm_worker.py,
        ``_context_capped_max_new_tokens``). Applied to a continuation (prompt + tokens so
        far, capped at what the response has left) it gives what the original prompt's own
        cap has left. Raises ValueError for a prompt that leaves no room."""
        caps = self.response_caps(len(prompt_lengths))
        room = [context_length - int(n) for n in prompt_lengths]
        if any(r < 1 for r in room):
            longest = max(int(n) for n in prompt_lengths)
            raise ValueError(
                f"a prompt of {longest} tokens leaves no room for a response within "
                f"{context_length} tokens (policy.max_total_sequence_length)"
            )
        return replace(
            self, max_tokens_per_prompt=tuple(min(c, r) for c, r in zip(caps, room, strict=True))
        )

    def for_prompts(self, start: int, end: int) -> SamplingParams:
        """These parameters for the prompts ``start:end`` of a call (an engine's or a DP
        replica's share): per-prompt caps are sliced with the prompts."""
        if self.max_tokens_per_prompt is None:
            return self
        return replace(self, max_tokens_per_prompt=self.max_tokens_per_prompt[start:end])

    def finish_target(self, num_prompts: int) -> int | None:
        """Prompts of a call over ``num_prompts`` that must finish before it stops
        (``finish_after_fraction``); None: all, without cutting."""
        if self.finish_after_fraction is None:
            return None
        # Round away float noise first: 0.8 * 10 is 8.000000000000002.
        return max(1, math.ceil(round(self.finish_after_fraction * num_prompts, 9)))

    @classmethod
    def from_generation_config(
        cls,
        config: GenerationSettings,
        *,
        n: int,
        eos_token_ids: list[int],
        seed: int | None = None,
    ) -> SamplingParams:
        """Rollout sampling of a run config; null ``stop_token_ids`` means the tokenizer EOS."""
        stop = list(config.stop_token_ids) if config.stop_token_ids is not None else []
        return cls(
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_tokens=config.max_response_length,
            stop_token_ids=stop or list(eos_token_ids),
            seed=seed,
            n=n,
        )


@dataclass
class Sample:
    """One generated response."""

    response_token_ids: list[int]
    """Generated tokens, prompt excluded; ends with the stop token when finish_reason is
    "stop"."""
    logprobs: list[float]
    """Per response token: ``log softmax(logits / temperature)`` of the sampled token under
    the engine's weights, over the full (unpadded) vocabulary and before top-k/top-p
    truncation; empty when ``SamplingParams.logprobs`` is False."""
    finish_reason: FinishReason
    """"stop": ended on a stop token; "length": reached max_tokens (or the context limit);
    "abort": the call stopped before this sample finished (``finish_after_fraction``)."""
    routed_experts: torch.Tensor | None = None
    """Routing replay only (``policy.moe.routing_replay``, Megatron engine): the top-k
    experts each MoE layer routed every token the engine fed to the model, i.e. the prompt
    and every response token but the last: ``[prompt + response - 1, layers, k]`` uint8
    (int16 beyond 256 experts), on the host. None otherwise."""
    token_versions: list[int] | None = None
    """Partial rollouts only: the policy version that generated each response token, for a
    sample continued across a refit (controller/rollouts/partial_rollouts.py). None otherwise (the
    group's version generated every token)."""

    @property
    def response_length(self) -> int:
        """Number of response tokens (the L of the overlong shaping)."""
        return len(self.response_token_ids)
