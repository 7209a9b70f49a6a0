"""NeMo RL's key table: the algorithm (nemo_algo.py), data and bookkeeping (nemo_data.py),
optimizer and schedule (nemo_schedule.py) and layout (nemo_layout.py) entries joined, with
the lengths, NeMo RL's defaults, key tiers and its rule for keys that are not live;
dialect_keys.py joins the systems' tables. Sources: NeMo RL at 7ea279ab
(examples/configs/grpo_math_1B.yaml and its recipes, nemo_rl/algorithms/grpo.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from dapo_megatron.migrate.dialects import (
    IMPACT_HARMLESS,
    IMPACT_LAYOUT,
    ForeignKey,
    Translation,
    Untranslatable,
    as_int,
    custom,
    mapped,
)
from dapo_megatron.migrate.nemo_algo import NEMO_ALGO_KEYS, algo_inactive
from dapo_megatron.migrate.nemo_data import NEMO_DATA_KEYS, resolve_relative
from dapo_megatron.migrate.nemo_features import (
    NEMO_FEATURE_KEYS,
    NEMO_FEATURE_TIERS,
    feature_inactive,
)
from dapo_megatron.migrate.nemo_layout import (
    NEMO_LAYOUT_KEYS,
    NEMO_LAYOUT_TIERS,
    layout_inactive,
)
from dapo_megatron.migrate.nemo_schedule import (
    NEMO_SCHEDULE_KEYS,
    NEMO_SCHEDULE_TIERS,
    weight_decay_overridden,
)
from dapo_megatron.migrate.shared_keys import NEMO


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------
# Lengths. NeMo RL's engine ends a response at its context, vLLM's max_model_len (by default
# policy.max_total_sequence_length), less the prompt: vllm_worker.py passes max_new_tokens
# and vLLM stops at max_model_len, vllm_worker_async.py takes min(max_new_tokens,
# max_model_len - prompt). Ours caps every response at generation.max_response_length and
# needs max_total_sequence_length >= data.max_prompt_length + that cap.
#
# Prompts. NeMo RL's data processors (data/processors.py: math_data_processor,
# math_hf_data_processor and the others alike, called for every row by
# data/datasets/processed_dataset.py, which drops none) test `length >= max_seq_length`, with
# max_seq_length = data.max_input_seq_length (data/utils.py): such a prompt stays in the data
# as a stub, each message cut to at most 4 tokens, with loss_multiplier 0 (the sample mask of
# the loss), so it is generated from and never trained. Ours drops a prompt longer than
# data.max_prompt_length before training (data/datasets.py encode_prompts). The longest
# prompt either trains is max_input_seq_length - 1 tokens.


def _prompt_limit(value: Any, ctx: Mapping[str, Any]) -> int:
    n = as_int(value)
    if n < 2:
        raise Untranslatable(
            f"{n}: NeMo RL turns every prompt (>= {n} tokens) into a stub it never trains"
        )
    return n - 1


def _total_length(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """NeMo RL's vLLM engine runs with max_model_len (vllm_cfg.max_model_len, by default
    policy.max_total_sequence_length) and max_tokens = max_new_tokens, so each response
    stops at min(max_new_tokens, max_model_len - prompt length) (vllm_worker.py). When the
    longest trained prompt plus max_new_tokens fits, that is our one cap; otherwise it is
    our generation.response_cap context, exact while the engine's context is this length."""
    total = as_int(value)
    prompt = ctx.get("data.max_input_seq_length")
    response = ctx.get("policy.generation.max_new_tokens")
    if not (_is_int(prompt) and _is_int(response)) or total >= prompt - 1 + response:
        return Translation(((TOTAL, total),), "same meaning: prompt + response fit in it")
    longest = prompt - 1  # the longest prompt NeMo RL generates from for training
    # The engine's context: vLLM's max_model_len, or with the Megatron backend its own
    # (megatron_worker.py builds the engine with mcore_generation_config.max_model_len).
    backend = ctx.get("policy.generation.backend", "vllm")
    cfg = "mcore_generation_config" if backend == "megatron" else "vllm_cfg"
    context = ctx.get(f"policy.generation.{cfg}.max_model_len")
    if _is_int(context) and context != total:
        raise Untranslatable(
            f"needs an engine context ({context} tokens) other than the training length "
            f"({total}), which dapo-megatron lacks: responses stop at {context} less the prompt "
            "there; ours at max_total_sequence_length less the prompt "
            "(generation.response_cap context)"
        )
    return Translation(
        ((TOTAL, total), ("generation.response_cap", "context")),
        f"same caps: {longest} + max_new_tokens {response} > {total}, so NeMo RL's engine "
        f"ends each response at {total} less its prompt when that comes first; "
        "generation.response_cap context does the same",
    )


TOTAL = "policy.max_total_sequence_length"


NEMO_KEYS: tuple[ForeignKey, ...] = (
    (
        custom(
            NEMO,
            "policy.max_total_sequence_length",
            "policy.max_total_sequence_length (+ generation.response_cap)",
            "same meaning; when the longest prompt NeMo RL trains (data.max_input_seq_length "
            "- 1 tokens) + policy.generation.max_new_tokens exceed it, NeMo RL's engine ends "
            "each response at its context (vLLM's max_model_len, by default this length) less "
            "the prompt: generation.response_cap context",
            _total_length,
        ),
        mapped(
            NEMO,
            "data.max_input_seq_length",
            "data.max_prompt_length",
            "converted to {v} - 1: NeMo RL keeps a prompt of {v} tokens or more in its data "
            "as a stub (each message cut to at most 4 tokens, loss_multiplier 0: generated "
            "from, never trained; processors.py), ours drops a prompt longer than {out} "
            "before training. The same prompts can be trained, but the number of prompts "
            "used can differ: a NeMo RL step spends slots of num_prompts_per_step on stubs, "
            "ours has that many trainable prompts, so steps cover the data at different rates",
            _prompt_limit,
        ),
    )
    + NEMO_ALGO_KEYS
    + NEMO_DATA_KEYS
    + NEMO_FEATURE_KEYS
    + NEMO_SCHEDULE_KEYS
    + NEMO_LAYOUT_KEYS
)


_ROLLOUT_MCORE = "policy.generation.mcore_generation_config."
_VLLM_CFG = "policy.generation.vllm_cfg."
NEMO_TIERS: dict[str, str] = {
    **NEMO_SCHEDULE_TIERS,
    **NEMO_FEATURE_TIERS,
    **NEMO_LAYOUT_TIERS,
    "grpo.val_start_at": IMPACT_HARMLESS,  # first validation step: measurement only
    "grpo.val_at_end": IMPACT_HARMLESS,  # one more validation at the end
    "grpo.max_val_samples": IMPACT_HARMLESS,  # how many validation prompts are scored
    "grpo.val_batch_size": IMPACT_HARMLESS,  # validation batching
    "policy.generation.port_range_low": IMPACT_HARMLESS,  # engine ports
    "policy.generation.port_range_high": IMPACT_HARMLESS,
    "cluster.master_port_range_low": IMPACT_HARMLESS,  # torch.distributed ports
    "cluster.master_port_range_high": IMPACT_HARMLESS,
    _VLLM_CFG + "use_tqdm": IMPACT_HARMLESS,  # progress bar
    _ROLLOUT_MCORE + "expose_http_server": IMPACT_HARMLESS,
    "cluster.segment_size": IMPACT_LAYOUT,  # node grouping for placement
    "data_plane.": IMPACT_LAYOUT,  # how batches move between workers
    _ROLLOUT_MCORE + "buffer_size_gb": IMPACT_LAYOUT,  # Megatron inference KV memory
    _ROLLOUT_MCORE + "block_size_tokens": IMPACT_LAYOUT,
    _ROLLOUT_MCORE + "kv_cache_management_mode": IMPACT_LAYOUT,
    _ROLLOUT_MCORE + "materialize_only_last_token_logits": IMPACT_LAYOUT,
    _ROLLOUT_MCORE + "max_tokens": IMPACT_LAYOUT,  # inference token budget per step
    _VLLM_CFG + "use_deep_gemm": IMPACT_LAYOUT,  # FP8 GEMM kernels
    _VLLM_CFG + "num_first_layers_in_bf16": IMPACT_LAYOUT,  # FP8 generation precision
    _VLLM_CFG + "num_last_layers_in_bf16": IMPACT_LAYOUT,
    _VLLM_CFG + "reset_encoder_cache_after_weight_update": IMPACT_LAYOUT,
    "policy.generation.refit_cfg.nixl.backend_name": IMPACT_LAYOUT,  # weight transport
}
"""NeMo RL keys (or subtrees ending in ".") classified by what the source does with them,
read before the patterns of dialects.impact."""


NEMO_DEFAULTS: dict[str, Any] = {
    # examples/configs/grpo_math_1B.yaml, the parent of every recipe, sets each of these
    # itself; for a config without it they are the defaults of NeMo RL's pydantic configs:
    # nemo_rl/algorithms/grpo.py GRPOConfig (and RewardScalingConfig), reward_functions.py
    # RewardShapingConfig, advantage_estimator.py AdvEstimatorConfig and
    # loss/loss_functions.py ClippedPGLossConfig.
    "grpo.num_prompts_per_step": 32,
    "grpo.num_generations_per_prompt": 16,
    "grpo.max_num_epochs": 1,
    "grpo.max_num_steps": 1000000,
    "grpo.max_rollout_turns": 1,
    "grpo.use_leave_one_out_baseline": True,
    "grpo.advantage_clip_low": None,
    "grpo.advantage_clip_high": None,
    "grpo.overlong_filtering": False,
    "grpo.use_dynamic_sampling": False,
    "grpo.dynamic_sampling_max_gen_batches": 10,
    "grpo.batch_multiplier": 1.0,
    "grpo.seed": 42,
    "grpo.val_num_generations_per_prompt": 1,
    "grpo.reward_shaping.enabled": False,
    "grpo.reward_scaling.enabled": False,
    "grpo.adv_estimator.name": "grpo",
    "grpo.adv_estimator.normalize_rewards": True,
    "grpo.adv_estimator.use_leave_one_out_baseline": True,
    "loss_fn.ratio_clip_min": 0.2,
    "loss_fn.ratio_clip_max": 0.2,
    "loss_fn.ratio_clip_c": None,
    "loss_fn.reference_policy_kl_penalty": 0.01,
    "loss_fn.reference_policy_kl_type": "k3",
    "loss_fn.kl_input_clamp_value": 20.0,
    "loss_fn.kl_output_clamp_value": 10.0,
    "loss_fn.token_level_loss": True,
    "loss_fn.use_importance_sampling_correction": False,
    "loss_fn.truncated_importance_sampling_ratio": None,
}
"""The value the source's code or base config gives a key that a config omits, for the
keys that change a run (an omitted key takes the source's default, never ours)."""


def inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Source keys that are not live in NeMo RL (key -> why). NeMo RL reads
    policy.megatron_cfg only with megatron_cfg.enabled true, and then neither dtensor_cfg
    nor policy.optimizer / policy.scheduler / policy.max_grad_norm (the Megatron worker
    builds its optimizer from megatron_cfg; its clip is megatron_cfg.optimizer.clip_grad),
    and Megatron's scheduler overrides optimizer.weight_decay (nemo_schedule.py).
    reward_shaping.max_response_length is read only by the shaping (reward_functions.py)
    and caps nothing while grpo.reward_shaping.enabled is not true; ours is the engine's cap.

    NeMo RL's relative references (`${.temperature}`) are resolved in `flat` first: the
    importer's resolve_interpolations reads only absolute ones."""
    if isinstance(flat, dict):
        resolve_relative(flat)
    dead: dict[str, str] = {
        **layout_inactive(flat),
        **algo_inactive(flat),
        **feature_inactive(flat),
    }
    shaping = "grpo.reward_shaping.max_response_length"
    if shaping in flat and flat.get("grpo.reward_shaping.enabled") is not True:
        dead[shaping] = "not live: grpo.reward_shaping.enabled is not true"
    backend = flat.get("policy.generation.backend", "vllm")
    for key in flat:
        if key.startswith(("policy.generation.trtllm_cfg.", "policy.generation.trtllm_kwargs.")):
            # The TRT-LLM engine's own settings: refused with it (generation.backend).
            dead[key] = (
                "the TRT-LLM engine's setting, refused with policy.generation.backend"
                if backend == "trtllm"
                else f"not live: policy.generation.backend is {backend}"
            )
    megatron = flat.get("policy.megatron_cfg.enabled") is True
    optimizer = ("policy.optimizer", "policy.scheduler", "policy.max_grad_norm")
    for key in flat:
        if megatron and (
            key in optimizer
            or key.startswith(("policy.dtensor_cfg.", "policy.optimizer.", "policy.scheduler."))
        ):
            dead[key] = "not live: policy.megatron_cfg.enabled is true (Megatron's optimizer)"
        elif not megatron and key.startswith("policy.megatron_cfg."):
            dead[key] = "not live: policy.megatron_cfg.enabled is not true"
    if megatron and weight_decay_overridden(flat):
        dead["policy.megatron_cfg.optimizer.weight_decay"] = (
            "not live: Megatron's scheduler sets the weight decay to "
            "megatron_cfg.scheduler.end_weight_decay at every step"
        )
    return dead
