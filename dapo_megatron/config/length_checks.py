"""The sequence-length checks of a run config, for both ``generation.response_cap`` modes
(config/validate.py reports them with the key, value and file).

fixed: every response may reach generation.max_response_length, so the longest prompt plus
that cap must fit policy.max_total_sequence_length. context: each prompt's responses stop at
min(max_response_length, max_total_sequence_length - prompt length), as NeMo RL's vLLM
engine does with max_model_len = policy.max_total_sequence_length
(nemo_rl/models/generation/vllm/vllm_worker.py ``_context_capped_max_new_tokens``): the
sequence never exceeds the context, and every kept prompt (data.max_prompt_length tokens at
most: longer ones are skipped when the data is loaded) must leave room for one token.
"""

from __future__ import annotations

from dapo_megatron.config.schema import DapoMegatronConfig


def longest_sequence(config: DapoMegatronConfig) -> int:
    """Most tokens of a prompt + response: data.max_prompt_length +
    generation.max_response_length, at most policy.max_total_sequence_length with
    ``response_cap: context`` (the memory plan and the packing budget hold this)."""
    longest = config.data.max_prompt_length + config.generation.max_response_length
    if config.generation.response_cap == "context":
        return min(longest, config.policy.max_total_sequence_length)
    return longest


def length_problems(config: DapoMegatronConfig) -> list[tuple[str, str]]:
    """(key, constraint) of each length setting that does not fit the response cap mode."""
    total = config.policy.max_total_sequence_length
    prompt, response = config.data.max_prompt_length, config.generation.max_response_length
    if config.generation.response_cap != "context":
        if total >= prompt + response:
            return []
        return [
            (
                "policy.max_total_sequence_length",
                f"must be >= data.max_prompt_length + generation.max_response_length = "
                f"{prompt + response} (or cap each prompt's responses at the context it "
                f"leaves: generation.response_cap: context)",
            )
        ]
    problems = []
    if prompt >= total:
        problems.append(
            (
                "data.max_prompt_length",
                f"must be < policy.max_total_sequence_length = {total} with "
                f"generation.response_cap: context (a prompt must leave room for a response)",
            )
        )
    # A cap of `total` is legal (NeMo RL's recipes set max_new_tokens to the whole length):
    # every prompt holds a token, so no response reaches it, but as the overlong penalty's
    # Lmax (dapo.overlong_buffer) it keeps the source's ramp.
    if response > total:
        problems.append(
            (
                "generation.max_response_length",
                f"must be <= policy.max_total_sequence_length = {total} with "
                f"generation.response_cap: context (no response is longer)",
            )
        )
    return problems
