"""NeMo RL's feature subtrees that dapo-megatron lacks and its configs mostly leave off:
async GRPO (grpo.async_grpo.*), the single controller's runtime (async_rl.*), draft-model
training (policy.draft.*), ModelOpt quantisation (policy.quant_*, generation.real_quant*),
and a few knobs that change nothing learned. A key of a feature that is on is refused naming
the feature; while the feature is off its keys are not live (feature_inactive)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    IMPACT_ALGORITHM,
    IMPACT_HARMLESS,
    IMPACT_LAYOUT,
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    custom,
    off,
    same,
)
from dapo_megatron.migrate.shared_keys import NEMO

ASYNC = "NeMo RL's async GRPO (rollouts up to max_trajectory_age_steps policy versions old)"
DRAFT = "training a speculative-decoding draft model (Eagle3)"
QUANT = "ModelOpt quantisation-aware training and quantised rollouts (NVFP4 / W4A16)"
SINGLE = "NeMo RL's single-controller asynchronous rollouts (async_rl sampler)"


def _needs(feature: str) -> Any:
    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        raise Untranslatable(f"needs {feature}, which dapo-megatron lacks")

    return convert


def _part_of(key: str, feature: str) -> ForeignKey:
    """A key read only while its feature is on (feature_inactive lists it otherwise)."""
    return custom(NEMO, key, f"(none: {feature})", f"a setting of {feature}", _needs(feature))


def _synchronous(flat: Mapping[str, Any]) -> bool:
    """single_controller_utils: the in_order sampler with max_lookahead_versions 0 hands the
    trainer each step's rollouts of the current policy version, a synchronous GRPO step."""
    return (
        flat.get("async_rl.sampler.name") == "in_order"
        and flat.get("async_rl.sampler.max_lookahead_versions", 0) == 0
    )


_ASYNC_KEYS = (
    "max_trajectory_age_steps",
    "max_generation_failures",
    "in_flight_weight_updates",
    "recompute_kv_cache_after_weight_updates",
)
_SINGLE_KEYS = (
    "sampler.max_staleness_versions",
    "sampler.max_lookahead_versions",
    "min_groups_for_streaming_train",
    "max_inflight_prompts",
    "max_buffered_rollouts",
    "recompute_kv_cache_after_weight_updates",
    "diagnostics",
)
_DRAFT_KEYS = ("model_name", "loss_weight", "num_layers", "aux_layer_indices")
_QUANT_KEYS = (
    "policy.generation.real_quant_export_cpu_offload",
    "policy.generation.real_quant_ignore",
    "policy.quant_calib_data",
    "policy.quant_calib_size",
    "policy.quant_batch_size",
    "policy.quant_sequence_length",
    "policy.disable_modelopt_layer_spec",
)


def _quant_on(flat: Mapping[str, Any]) -> bool:
    return (
        flat.get("policy.quant_cfg") is not None
        or flat.get("policy.generation.quant_cfg") is not None
        or flat.get("policy.generation.real_quant") is True
    )


NEMO_FEATURE_KEYS: tuple[ForeignKey, ...] = (
    *(_part_of(f"grpo.async_grpo.{k}", ASYNC) for k in _ASYNC_KEYS),
    *(_part_of(f"policy.draft.{k}", DRAFT) for k in _DRAFT_KEYS),
    *(_part_of(k, QUANT) for k in _QUANT_KEYS),
    *(_part_of(f"async_rl.{k}", SINGLE) for k in _SINGLE_KEYS),
    as_here(NEMO, "policy.quant_cfg", QUANT, lambda v, ctx: v is None, "bf16 training"),
    as_here(NEMO, "policy.generation.quant_cfg", QUANT, lambda v, ctx: v is None, "bf16 rollouts"),
    as_here(NEMO, "policy.generation.real_quant", QUANT, off(False), "bf16 rollouts"),
    as_here(
        NEMO,
        "async_rl.sampler.name",
        SINGLE,
        lambda v, ctx: _synchronous(ctx),
        "a synchronous step: rollouts of the current policy (in_order, no lookahead)",
    ),
    same(NEMO, "policy.train_global_batch_size", "policy.train_global_batch_size"),
    as_here(
        NEMO,
        "policy.logprob_chunk_size",
        "nothing: any value gives the same run",
        lambda v, ctx: True,
        "how log-probs are chunked in memory: the same values",
    ),
    as_here(
        NEMO,
        "policy.generation_batch_size",
        "nothing: any value gives the same run",
        lambda v, ctx: True,
        "read by NeMo RL's Hugging Face generation backend only: not this engine's",
    ),
    as_here(
        NEMO,
        "data.validation.repeat",
        "a validation set repeated N times (avg@N over copies)",
        off(1),
        "each validation prompt once per sample",
    ),
)
"""NeMo RL feature subtrees we lack, and knobs that change nothing learned."""

NEMO_FEATURE_TIERS: dict[str, str] = {
    # rollouts of older policy versions: what is learned, though "async" reads as speed
    "grpo.async_grpo.": IMPACT_ALGORITHM,
    "grpo.async_grpo": IMPACT_ALGORITHM,
    "async_rl.sampler.": IMPACT_ALGORITHM,
    **{f"async_rl.{k}": IMPACT_ALGORITHM for k in _SINGLE_KEYS if not k.startswith("sampler.")},
    # quantised training and rollouts change the weights and the samples
    "policy.quant_cfg": IMPACT_ALGORITHM,
    "policy.generation.quant_cfg": IMPACT_ALGORITHM,
    "policy.generation.real_quant": IMPACT_ALGORITHM,
    # a draft model for speculative decoding (lossless: the policy's samples are the same)
    # is trained beside the policy for speed
    "policy.draft.": IMPACT_LAYOUT,
    # the single controller's fault handling, health probes and request router: what happens
    # when a generation server fails, nothing that a run without failures learns
    "async_rl.rollout_failure.": IMPACT_HARMLESS,
    "async_rl.stall_watchdog.": IMPACT_HARMLESS,
    "async_rl.generation_fleet_health.": IMPACT_HARMLESS,
    "async_rl.generation_router.": IMPACT_HARMLESS,
}


def feature_inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Keys of these features that are not live in a config (key -> why)."""
    dead: dict[str, str] = {}
    sync = _synchronous(flat)
    quant = _quant_on(flat)
    for key in flat:
        if key.startswith("async_rl.") and key != "async_rl.sampler.name" and sync:
            dead[key] = (
                "no effect on what is learned: the in_order sampler with no lookahead trains "
                "each step on the current policy's rollouts (its buffers only pace them)"
            )
        elif key in _QUANT_KEYS and not quant:
            dead[key] = "not live: no quantisation (quant_cfg null, real_quant false)"
    return dead
