"""``generation.response_cap``: the response cap of each prompt of a generate call.

``fixed`` (the default) caps every response at ``generation.max_response_length``; the
config validation then guarantees that the longest prompt plus that cap fits
``policy.max_total_sequence_length``. ``context`` caps each prompt's responses at
``min(max_response_length, max_total_sequence_length - prompt length)``, as NeMo RL's
vLLM engine does (max_model_len = policy.max_total_sequence_length;
nemo_rl/models/generation/vllm/vllm_worker.py ``_context_capped_max_new_tokens``): a
long prompt leaves its responses less room instead of being refused.

Our engines stop at their context (``max_model_len``) already, but the caps are given
explicitly with every call (``SamplingParams.max_tokens_per_prompt``) so the outcome does
not depend on an engine's limit: every call the controller makes goes through
``capped``, training rounds, overlapped requests, validation, the startup probe and
partial-rollout continuations (whose prompt holds the tokens so far, so the context left
is exactly what the original prompt's own cap has left).
"""

from __future__ import annotations

from collections.abc import Sequence

from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.shared.sampling import SamplingParams


def context_length(config: DapoMegatronConfig) -> int | None:
    """The context each prompt's responses must fit with ``response_cap: context``
    (``policy.max_total_sequence_length``); None with ``fixed``."""
    if config.generation.response_cap != "context":
        return None
    return config.policy.max_total_sequence_length


def capped(
    config: DapoMegatronConfig, sampling: SamplingParams, prompts: Sequence[Sequence[int]]
) -> SamplingParams:
    """``sampling`` for a call on ``prompts``: unchanged with ``response_cap: fixed``, else
    with each prompt's cap cut to the context it leaves (``SamplingParams.within_context``)."""
    length = context_length(config)
    if length is None:
        return sampling
    return sampling.within_context([len(p) for p in prompts], length)
