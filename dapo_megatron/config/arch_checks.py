"""Is a model's architecture consistent with itself? Checked before any worker starts.

A hand-edited or truncated config.json can describe a model no weights fit: a Qwen3-MoE
with `num_experts_per_tok` 6 and 4 experts passed the dry run and then failed on a policy
rank with `RuntimeError('selected index k out of range')`, naming neither file nor key. The
rules below are the ones the model builders assume (Megatron's attention splits the query
heads into `num_query_groups` groups; the router's top-k picks k of the experts; RoPE
rotates pairs of a head's channels; the hidden size is split over the heads unless the
config gives `head_dim`), each reported with the config.json key a user would edit.
"""

from __future__ import annotations

from dapo_megatron.config.model_arch import ModelArch


def arch_problems(arch: ModelArch) -> list[str]:
    """The violated rules of ``arch``, one message each, naming the HF config keys."""
    problems: list[str] = []
    sizes = {
        "num_hidden_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.ffn_hidden_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_query_groups,
        "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_position_embeddings,
    }
    problems += [f"{key} = {v}: must be >= 1" for key, v in sizes.items() if v < 1]
    if problems:  # the rules below divide by these
        return problems
    heads, groups = arch.num_attention_heads, arch.num_query_groups
    if heads % groups:
        problems.append(
            f"num_key_value_heads = {groups} must divide num_attention_heads = {heads} "
            "(each key/value head serves a whole group of query heads)"
        )
    if arch.explicit_head_dim is None and arch.hidden_size % heads:
        problems.append(
            f"num_attention_heads = {heads} must divide hidden_size = {arch.hidden_size} "
            "(no head_dim is given, so a head is hidden_size / num_attention_heads wide)"
        )
    if arch.head_dim < 2 or arch.head_dim % 2:
        problems.append(
            f"head_dim = {arch.head_dim}: must be even and >= 2 (rotary embeddings rotate "
            "pairs of a head's channels)"
        )
    if arch.rope_theta <= 0:
        problems.append(f"rope_theta = {arch.rope_theta}: must be > 0")
    if arch.norm_epsilon <= 0:
        problems.append(f"rms_norm_eps = {arch.norm_epsilon}: must be > 0")
    moe = arch.moe
    if moe is not None:
        if moe.num_experts < 1 or moe.moe_ffn_hidden_size < 1:
            problems.append(
                f"num_experts = {moe.num_experts}, moe_intermediate_size = "
                f"{moe.moe_ffn_hidden_size}: both must be >= 1"
            )
        if not 1 <= moe.experts_per_token <= moe.num_experts:
            problems.append(
                f"num_experts_per_tok = {moe.experts_per_token} must be in "
                f"[1, num_experts = {moe.num_experts}] (the router picks the top "
                "num_experts_per_tok of the experts)"
            )
    return problems
