"""RLinf's keys in the table (docs reference/algorithms/dapo.rst,
examples/reasoning/config/math/*.yaml), with their converters; dialect_keys.py joins the
tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    IMPACT_HARMLESS,
    IMPACT_LAYOUT,
    ForeignKey,
    Translation,
    Untranslatable,
    as_int,
    custom,
    kl_estimator,
    mapped,
    same,
    same_agg,
)
from dapo_megatron.migrate.shared_keys import (
    CLIP_C,
    CLIP_HIGH,
    CLIP_LOW,
    DS,
    DUAL_WHY,
    MAX_RESPONSE,
    OB,
    RLINF,
)


def _resamples_plus_first(value: Any, ctx: Mapping[str, Any]) -> int:
    """RLinf's guide counts resampling attempts after the first generation."""
    n = as_int(value)
    return n + 1 if n > 0 else 0


def _rlinf_safe_length(value: Any, ctx: Mapping[str, Any]) -> Translation:
    safe = as_int(value)
    cap = ctx.get("algorithm.max_length")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap <= safe:
        raise Untranslatable(
            "RLinf starts its length penalty at safe_length; ours starts it "
            "dapo.overlong_buffer.length tokens before generation.max_response_length: set "
            "dapo.overlong_buffer.length = algorithm.max_length - safe_length (e.g. 20480 - "
            "16384 = 4096)"
        )
    return Translation(
        ((f"{OB}.enabled", True), (f"{OB}.length", cap - safe)),
        f"converted: the penalty starts at {safe} tokens in both: "
        f"length = max_length {cap} - safe_length {safe}",
    )


def _rlinf_len_penalty(value: Any, ctx: Mapping[str, Any]) -> Translation:
    raise Untranslatable(
        "RLinf's guide calls it a length penalty coefficient yet bounds the length reward "
        "to [-1, 0] (its trainer code does not read the key); ours ramps linearly to "
        "-dapo.overlong_buffer.penalty_factor at the cap: set dapo.overlong_buffer."
        "penalty_factor (1.0 = the paper's [-1, 0])"
    )


def _rlinf_clip(ours: str, key: str) -> ForeignKey:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        if value is None:
            eps = ctx.get("algorithm.ratio_clip_eps")
            if eps is None:
                raise Untranslatable("null and no algorithm.ratio_clip_eps to fall back to")
            return Translation(((ours, eps),), f"null: RLinf falls back to ratio_clip_eps {eps}")
        side = "below at 1 -" if ours == CLIP_LOW else "at 1 +"
        return Translation(((ours, value),), f"same meaning: the ratio is clipped {side} {value}")

    return custom(
        RLINF,
        key,
        ours,
        "same meaning; null falls back to `algorithm.ratio_clip_eps` (RLinf "
        "megatron_actor_worker.py)",
        convert,
    )


def _rlinf_placement(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """RLinf's component_placement: `all` = every GPU of cluster.num_nodes nodes; a GPU
    index or range (`0`, `0-3`) = those GPUs of one node."""
    if not isinstance(value, Mapping) and not isinstance(value, int | str):
        raise Untranslatable(f"{value!r}: expected all, a GPU index or a range")
    if isinstance(value, Mapping):
        raise Untranslatable("a placement per component (disaggregated) has no counterpart here")
    text = str(value).strip()
    if text == "all":
        return Translation((), "all GPUs of cluster.num_nodes (gpus_per_node: ours, 8)")
    if "," in text:
        raise Untranslatable(f"{text}: a list of GPU ranges has no counterpart here")
    lo, _, hi = text.partition("-")
    try:
        count = int(hi or lo) - int(lo) + 1
    except ValueError:
        raise Untranslatable(f"{text}: expected all, a GPU index or a range") from None
    if ctx.get("cluster.num_nodes", 1) != 1:
        raise Untranslatable(f"GPUs {text} of several nodes has no counterpart here")
    return Translation(
        (("cluster.num_nodes", 1), ("cluster.gpus_per_node", count)),
        f"GPUs {text} of one node: {count} GPU(s), colocated",
    )


RLINF_KEYS: tuple[ForeignKey, ...] = (
    same(RLINF, "algorithm.group_size", "dapo.num_generations_per_prompt"),
    _rlinf_clip(CLIP_LOW, "algorithm.clip_ratio_low"),
    _rlinf_clip(CLIP_HIGH, "algorithm.clip_ratio_high"),
    custom(
        RLINF,
        "algorithm.ratio_clip_eps",
        "(read with clip_ratio_low/high)",
        "the clip range when clip_ratio_low/high are null",
        lambda v, ctx: Translation((), "read with clip_ratio_low/high"),
    ),
    same(RLINF, "algorithm.clip_ratio_c", CLIP_C, DUAL_WHY),
    same(
        RLINF,
        "actor.model.tensor_model_parallel_size",
        "policy.megatron.tensor_model_parallel_size",
    ),
    same(
        RLINF,
        "actor.model.pipeline_model_parallel_size",
        "policy.megatron.pipeline_model_parallel_size",
    ),
    same(RLINF, "actor.model.context_parallel_size", "policy.megatron.context_parallel_size"),
    same(RLINF, "rollout.tensor_parallel_size", "generation.engine.tensor_parallel_size"),
    same(RLINF, "actor.optim.lr", "policy.optimizer.lr"),
    same(RLINF, "actor.optim.weight_decay", "policy.optimizer.weight_decay"),
    same(RLINF, "actor.optim.clip_grad", "policy.optimizer.clip_grad"),
    custom(
        RLINF,
        "cluster.component_placement.actor,rollout,reward",
        "(cluster.num_nodes and cluster.gpus_per_node)",
        "all: every GPU of the nodes; a GPU index or range: that many GPUs of one node",
        _rlinf_placement,
    ),
    same_agg(RLINF, "algorithm.loss_agg_func"),
    mapped(
        RLINF,
        "algorithm.max_resample",
        f"{DS}.max_gen_batches",
        "converted: {v} resampling attempts after the first generation = {out} rounds "
        "(RLinf's guide; its trainer code does not read the key)",
        _resamples_plus_first,
    ),
    custom(
        RLINF,
        "algorithm.safe_length",
        f"{OB}.length (+ enabled)",
        "no exact equivalent: the penalty starts at {v} there, at the cap minus "
        "overlong_buffer.length here; converted to max_length - {v} when max_length is given",
        _rlinf_safe_length,
    ),
    same(
        RLINF,
        "algorithm.max_length",
        MAX_RESPONSE,
        "the response cap; RLinf's guide discards longer responses, here the engine stops "
        "at it (dapo.overlong_filtering masks truncated ones)",
    ),
    custom(
        RLINF,
        "algorithm.len_reward_penalty",
        "(none: dapo.overlong_buffer.penalty_factor)",
        "no exact equivalent: a coefficient there, a bound [-penalty_factor, 0] here",
        _rlinf_len_penalty,
    ),
    same(RLINF, "algorithm.kl_beta", "dapo.loss.kl_coef"),
    kl_estimator(RLINF, "algorithm.kl_penalty_type"),
    same(
        RLINF,
        "algorithm.entropy_bonus",
        "dapo.loss.entropy_coef",
        "same meaning: the loss subtracts {v} x entropy",
    ),
    same(RLINF, "data.rollout_batch_size", "dapo.num_prompts_per_step"),
    same(RLINF, "cluster.num_nodes", "cluster.num_nodes"),
)


RLINF_TIERS: dict[str, str] = {
    "actor.calculate_flops": IMPACT_HARMLESS,  # MFU metric
    "actor.group_name": IMPACT_HARMLESS,  # Ray worker-group names
    "rollout.group_name": IMPACT_HARMLESS,
    "inference.group_name": IMPACT_HARMLESS,
    "reward.group_name": IMPACT_HARMLESS,
    "hydra.": IMPACT_HARMLESS,  # Hydra's own output directory
    "runner.save_interval": IMPACT_HARMLESS,  # checkpoint cadence
    "runner.val_check_interval": IMPACT_HARMLESS,  # validation cadence
    "actor.enable_dp_load_balance": IMPACT_LAYOUT,
    "actor.mcore_gpt": IMPACT_LAYOUT,  # Megatron-Core model class
    "actor.model.apply_rope_fusion": IMPACT_LAYOUT,
    "actor.model.bias_activation_fusion": IMPACT_LAYOUT,
    "actor.model.bias_dropout_fusion": IMPACT_LAYOUT,
    "actor.model.gradient_accumulation_fusion": IMPACT_LAYOUT,
    "actor.model.persist_layer_norm": IMPACT_LAYOUT,
    "actor.model.batch_p2p_comm": IMPACT_LAYOUT,
    "actor.model.use_cpu_initialization": IMPACT_LAYOUT,
    "actor.model.variable_seq_lengths": IMPACT_LAYOUT,
    "actor.model.moe_token_dispatcher_type": IMPACT_LAYOUT,
    "actor.optim.optimizer_enable_pin": IMPACT_LAYOUT,
    "rollout.max_running_requests": IMPACT_LAYOUT,
    "rollout.sglang.torch_compile_max_bs": IMPACT_LAYOUT,
    "rollout.vllm.enable_flash_infer_sampler": IMPACT_LAYOUT,
    "runner.max_tokens_per_mbs": IMPACT_LAYOUT,  # micro-batch token budget
}
"""Rlinf keys (or subtrees ending in ".") classified by what the source does with them,
read before the patterns of dialects.impact."""


RLINF_DEFAULTS: dict[str, Any] = {
    # RLinf: rlinf/workers/actor/megatron_actor_worker.py reads clip_ratio_low/high with
    # .get() (absent = null = ratio_clip_eps).
    "algorithm.clip_ratio_low": None,
    "algorithm.clip_ratio_high": None,
}
"""The value the source's code or base config gives a key that a config omits, for the
keys that change a run (an omitted key takes the source's default, never ours)."""


def inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Keys of a config that are not live in RLinf (key -> why)."""
    return {}
