"""NeMo RL's algorithm keys (grpo.*, loss_fn.*, reward_penalties.*, policy.draft.*): the
GRPO/DAPO loop, the advantage estimator, the loss and the features that are off in its
configs; nemo_keys.py joins them to NeMo RL's table. Each semantic claim cites NeMo RL's
file at 7ea279ab (nemo_rl/algorithms/...)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    ForeignKey,
    Translation,
    Untranslatable,
    as_here,
    as_int,
    custom,
    mapped,
    off,
    same,
)
from dapo_megatron.migrate.nemo_features import ASYNC, DRAFT
from dapo_megatron.migrate.shared_keys import (
    AGG,
    CLIP_C,
    CLIP_HIGH,
    CLIP_LOW,
    DS,
    DUAL_WHY,
    HIGH_WHY,
    LOW_WHY,
    MAX_RESPONSE,
    NEMO,
    OB,
    RS,
)

ADV = "grpo.adv_estimator"
KL = "loss_fn.reference_policy_kl_penalty"
IS_ON = "loss_fn.use_importance_sampling_correction"


def _rounds_plus_one(value: Any, ctx: Mapping[str, Any]) -> int:
    """NeMo RL's grpo.py increments the round counter before generating and keeps going
    while `rounds <= dynamic_sampling_max_gen_batches`: N allows N + 1 rounds."""
    n = as_int(value)
    if n <= 0:
        raise Untranslatable(
            f"NeMo RL refuses {n} (it asserts > 0); here dapo.dynamic_sampling.max_gen_batches "
            f"<= 0 means unlimited rounds: set it to 0 for that, or to N for at most N rounds"
        )
    return n + 1


def _batch_multiplier(value: Any, ctx: Mapping[str, Any]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        raise Untranslatable(f"{value!r}: expected a number >= 1")
    return float(value)


def _nemo_token_level(value: Any, ctx: Mapping[str, Any]) -> str:
    if value is True:
        return "token-mean"
    if value is False:
        return "seq-mean-token-mean"
    raise Untranslatable(f"{value!r}: expected true or false")


def _penalty_length(value: Any, ctx: Mapping[str, Any]) -> int:
    """reward_functions.py apply_reward_shaping: the penalty ramps over
    [max_response_length - overlong_buffer_length, max_response_length] and keeps growing
    past it (not clamped) up to the engine's cap; ours ends at the cap, one key."""
    length = as_int(value)
    cap = ctx.get("policy.generation.max_new_tokens")
    if cap is not None and cap != length:
        raise Untranslatable(
            f"needs an overlong-penalty length ({length}) apart from the engine's response "
            f"cap (policy.generation.max_new_tokens {cap}), which dapo-megatron lacks (here: "
            "generation.max_response_length is both, the penalty clamped at the cap)"
        )
    return length


def _dynamic_sampling(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """grpo.py dynamic_sampling(): the kept groups are cached until num_prompts_per_step x
    num_generations_per_prompt samples are there, then `filtered_repeated_batch.slice(0,
    train_prompts_size)`: the surplus beyond that is dropped (logged as
    dynamic_sampling_num_discarded_valid_samples), never carried to the next step."""
    if value is True:
        return Translation(
            ((f"{DS}.enabled", True), (f"{DS}.metric", "score"), (f"{DS}.surplus", "discard")),
            "same meaning: keep only groups whose unshaped reward varies (grpo.py passes "
            "unshaped_total_reward as the filter's std_rewards: metric score); valid groups "
            "beyond num_prompts_per_step are discarded as NeMo RL's slice does (surplus discard)",
        )
    if value is False:
        return Translation(
            ((f"{DS}.enabled", False),),
            "off: every group trains (the surplus setting is not read)",
        )
    raise Untranslatable(f"{value!r}: expected true or false")


def _estimator(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """advantage_estimator.py: grpo is GRPOAdvantageEstimator; the others (gdpo,
    reinforce_plus_plus, opd, gae, raw) are estimators we lack."""
    if value == "grpo":
        return Translation((), "the group-relative estimator, as here")
    raise Untranslatable(f"needs the {value} advantage estimator, which dapo-megatron lacks")


def _normalize(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """GRPOAdvantageEstimator.compute_advantage: `/ (std + 1e-6)` where std > 0."""
    if not isinstance(value, bool):
        raise Untranslatable(f"{value!r}: expected true or false")
    return Translation(
        (("dapo.advantage.norm_by_std", value), ("dapo.advantage.eps", 1e-6)),
        "same meaning: divide by the reward std + 1e-6 (NeMo RL's fixed epsilon), a zero "
        "std left undivided",
    )


def _leave_one_out(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """utils.py calculate_baseline_and_std_per_prompt with leave_one_out_baseline: baseline
    and std both over the sample's N - 1 others (std unbiased, 0 -> unscaled)."""
    if not isinstance(value, bool):
        raise Untranslatable(f"{value!r}: expected true or false")
    over = "others" if value else "group"
    return Translation(
        (("dapo.advantage.leave_one_out", value), ("dapo.advantage.std_over", over)),
        "the mean and the unbiased std of each sample's N - 1 others (std_over others)"
        if value
        else "the group's mean and unbiased std (std_over group)",
    )


def _tis_cap(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """loss_functions.py: with use_importance_sampling_correction, "tis" clamps the weight
    exp(prev_logprobs - generation_logprobs) to [ratio_min (null: 0), ratio]."""
    kind = ctx.get("loss_fn.truncated_importance_sampling_type")
    if ctx.get(IS_ON) is not True:
        return Translation((("dapo.loss.rollout_correction", "none"),), "no correction, as here")
    low = ctx.get("loss_fn.truncated_importance_sampling_ratio_min")
    if kind == "tis" and value is not None and low in (None, 0, 0.0):
        return Translation(
            (
                ("dapo.loss.rollout_correction", "tis"),
                ("dapo.loss.rollout_correction_level", "token"),
                ("dapo.loss.tis_cap", value),
            ),
            "same meaning: token weights exp(old - rollout logprob) truncated at {v}",
        )
    what = f"NeMo RL's {kind} (ratio [{low}, {value}])" if kind else "an uncapped"
    raise Untranslatable(
        f"needs {what} importance-sampling correction of rollout logprobs, which "
        "dapo-megatron lacks (here: none, tis capped above, or mis)"
    )


def _is_switch(value: Any, ctx: Mapping[str, Any]) -> bool:
    if value is False:
        return True
    return ctx.get("loss_fn.truncated_importance_sampling_ratio") is not None


def _kl_type(value: Any, ctx: Mapping[str, Any]) -> str:
    if value in ("k1", "k2", "k3"):
        return str(value)
    raise Untranslatable(f"needs the {value} KL estimator, which dapo-megatron lacks")


def _input_clamp(value: Any, ctx: Mapping[str, Any]) -> bool:
    # utils.py calculate_kl clamps log r to +-input_clamp before any estimator; ours clamps
    # it at 20 for k3 only (algorithms/kl.py LOG_RATIO_CLAMP).
    if ctx.get(KL) == 0:
        return True  # no KL term: not read
    return value == 20 and ctx.get("loss_fn.reference_policy_kl_type") == "k3"


def _null(value: Any, ctx: Mapping[str, Any]) -> bool:
    return value is None


# Rows a NeMo RL training set has at least, for the datasets its DAPO/GRPO configs name:
# DAPOMath17K loads the DAPO-Math-17k parquet whole (response_datasets/dapo_math.py), ~17.9k
# problems x 100 copies, ~1.79M rows; OpenMathInstruct-2 loads split train_1M (1M rows) and
# holds out split_validation_size of it (openmathinstruct2.py, RawDataset.split_train_validation).
_TRAIN_ROWS_AT_LEAST = {"DAPOMath17K": 1_700_000, "OpenMathInstruct-2": 900_000}


def _on_policy_ratio(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """loss_functions.py ClippedPGLossFn: force_on_policy_ratio makes the ratio
    exp(lp - lp.detach()) = 1 with the policy gradient's derivative; grpo.py asserts
    train_global_batch_size == num_prompts_per_step x num_generations_per_prompt and skips
    prev_logprobs. Ours at one optimizer step per step with old_logprob_pass auto takes the
    training forward's detached logprobs as the old ones: the same ratio."""
    if value is not True:
        return Translation((), "same as here: the ratio pi/pi_old")
    prompts, n = ctx.get("grpo.num_prompts_per_step"), ctx.get("grpo.num_generations_per_prompt")
    batch = ctx.get("policy.train_global_batch_size")
    one_step = isinstance(prompts, int) and isinstance(n, int) and prompts * n == batch
    if not one_step:
        raise Untranslatable(
            "needs a ratio forced to 1 over several optimizer steps, which dapo-megatron "
            "lacks (NeMo RL asserts one step per GRPO step; here: train_global_batch_size = "
            "num_prompts_per_step x num_generations_per_prompt)"
        )
    return Translation(
        (("policy.old_logprob_pass", "auto"),),
        "same ratio: one optimizer step per step, no old-logprob pass, pi/pi.detach() = 1",
    )


def _epochs_bound(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """grpo.py `while current_epoch < max_num_epochs and total_steps < max_num_steps` as our
    dapo.max_num_epochs beside dapo.max_num_steps. Several dataloaders: NeMo RL ignores
    epochs (an endless iterator, grpo.py's warning), so nothing is set. Where the epochs can
    end the run first (_epochs false), the last pass ends apart: NeMo RL drops each epoch's
    partial batch (drop_last, batch_cache reset per epoch), ours only the last pass's tail
    (data/sampler.py)."""
    if ctx.get("data.use_multiple_dataloader") is True:
        return Translation((), "not live: several dataloaders, NeMo RL ignores epochs")
    epochs = as_int(value)
    if epochs < 1:
        raise Untranslatable(f"{epochs}: NeMo RL trains no step; a run needs max_num_epochs >= 1")
    note = "same bound: max_num_epochs passes or max_num_steps, whichever ends the run first"
    if not _epochs(value, ctx):
        note += (
            "; NeMo RL drops each pass's last partial batch, ours only the last pass's tail, "
            "so the last steps may differ"
        )
    return Translation((("dapo.max_num_epochs", epochs),), note)


def _epochs(value: Any, ctx: Mapping[str, Any]) -> bool:
    """grpo.py `while current_epoch < max_num_epochs and total_steps < max_num_steps`: a run
    ends at the end of its max_num_epochs-th pass over the training data, or sooner. Ours
    runs max_num_steps steps over as many passes as that takes: the same run when NeMo RL
    ignores epochs (several dataloaders: an endless iterator, grpo.py's warning) or when
    max_num_steps surely ends it first: each step draws at most (max_gen_batches + 1)
    dataloader batches of num_prompts_per_step x batch_multiplier prompts with dynamic
    sampling, one of num_prompts_per_step without."""
    if ctx.get("data.use_multiple_dataloader") is True:
        return True
    rows = _TRAIN_ROWS_AT_LEAST.get(str(ctx.get("data.train.dataset_name")))
    steps, prompts = ctx.get("grpo.max_num_steps"), ctx.get("grpo.num_prompts_per_step")
    if rows is None or not isinstance(steps, int) or not isinstance(prompts, int):
        return False
    batches = 1
    if ctx.get("grpo.use_dynamic_sampling") is True:
        batches = int(ctx.get("grpo.dynamic_sampling_max_gen_batches", 10)) + 1
        prompts = int(prompts * float(ctx.get("grpo.batch_multiplier", 1)))
    epochs = value if isinstance(value, int) and value > 0 else 1
    return steps * batches * prompts <= epochs * rows - prompts


NEMO_ALGO_KEYS: tuple[ForeignKey, ...] = (
    same(NEMO, "grpo.num_prompts_per_step", "dapo.num_prompts_per_step"),
    same(NEMO, "grpo.num_generations_per_prompt", "dapo.num_generations_per_prompt"),
    custom(
        NEMO,
        "grpo.use_dynamic_sampling",
        f"{DS}.enabled (+ surplus)",
        "same filter; NeMo RL slices the batch to num_prompts_per_step groups and drops the "
        "rest: surplus discard",
        _dynamic_sampling,
    ),
    mapped(
        NEMO,
        "grpo.batch_multiplier",
        f"{DS}.batch_multiplier",
        "round 1 draws {v} x num_prompts_per_step prompts in both; NeMo RL's later rounds "
        "draw as many again, ours {v} x the groups still missing",
        _batch_multiplier,
    ),
    mapped(
        NEMO,
        "grpo.dynamic_sampling_max_gen_batches",
        f"{DS}.max_gen_batches",
        "converted: NeMo RL counts a round before checking `rounds <= {v}`, so it runs up "
        "to {v} + 1 rounds; ours generates at most {out} full rounds' worth of prompts",
        _rounds_plus_one,
    ),
    same(NEMO, "grpo.reward_scaling.enabled", f"{RS}.enabled", "same meaning: clamp, then map"),
    same(NEMO, "grpo.reward_scaling.source_min", f"{RS}.source_min"),
    same(NEMO, "grpo.reward_scaling.source_max", f"{RS}.source_max"),
    same(NEMO, "grpo.reward_scaling.target_min", f"{RS}.target_min"),
    same(NEMO, "grpo.reward_scaling.target_max", f"{RS}.target_max"),
    same(
        NEMO,
        "grpo.reward_shaping.enabled",
        f"{OB}.enabled",
        "same meaning: the DAPO soft overlong penalty",
    ),
    same(NEMO, "grpo.reward_shaping.overlong_buffer_length", f"{OB}.length"),
    same(
        NEMO,
        "grpo.reward_shaping.overlong_buffer_penalty",
        f"{OB}.penalty_factor",
        "same ramp; NeMo RL's penalty is not clamped and keeps growing past "
        "reward_shaping.max_response_length, ours stays in [-{v}, 0]",
    ),
    mapped(
        NEMO,
        "grpo.reward_shaping.max_response_length",
        MAX_RESPONSE,
        "Lmax of the penalty: here it is also the engine's response cap (one key), so it "
        "must equal NeMo RL's engine cap policy.generation.max_new_tokens; else refused",
        _penalty_length,
    ),
    as_here(
        NEMO,
        "grpo.reward_shaping.stop_properly_penalty_coef",
        "a reward scale for truncated responses (reward_functions.py stop_properly_penalty_coef)",
        _null,
        "a truncated response keeps its reward (plus the overlong penalty when on)",
    ),
    same(NEMO, "loss_fn.ratio_clip_min", CLIP_LOW, LOW_WHY),
    same(NEMO, "loss_fn.ratio_clip_max", CLIP_HIGH, HIGH_WHY),
    same(NEMO, "grpo.ratio_clip_min", CLIP_LOW, LOW_WHY),
    same(NEMO, "grpo.ratio_clip_max", CLIP_HIGH, HIGH_WHY),
    same(NEMO, "loss_fn.ratio_clip_c", CLIP_C, DUAL_WHY),
    mapped(
        NEMO,
        "loss_fn.token_level_loss",
        AGG,
        "true: token-mean (DAPO's token-level loss); false: seq-mean-token-mean",
        _nemo_token_level,
    ),
    same(NEMO, KL, "dapo.loss.kl_coef"),
    mapped(
        NEMO,
        "loss_fn.reference_policy_kl_type",
        "dapo.loss.kl_estimator",
        "same estimators, Schulman's k1/k2/k3 (utils.py calculate_kl)",
        _kl_type,
    ),
    as_here(
        NEMO,
        "loss_fn.kl_input_clamp_value",
        "a clamp of the KL log-ratio other than +-20 for k3",
        _input_clamp,
        "k3's log-ratio clamped to +-20 (algorithms/kl.py)",
    ),
    mapped(
        NEMO,
        "loss_fn.kl_output_clamp_value",
        "dapo.loss.kl_clamp",
        "same meaning: utils.py calculate_kl clamps the per-token KL estimate to +-{v} "
        "before the coefficient weighs it (null: none)",
        lambda v, ctx: None if v is None else float(v),
    ),
    custom(
        NEMO,
        "loss_fn.truncated_importance_sampling_ratio",
        "dapo.loss.rollout_correction (+ tis_cap)",
        "tis with ratio_min null/0: our tis capped at the ratio; off: none; others refused",
        _tis_cap,
    ),
    as_here(
        NEMO,
        IS_ON,
        "an uncapped importance-sampling correction of rollout logprobs",
        _is_switch,
        "off, or the tis correction carried with its ratio",
    ),
    as_here(
        NEMO,
        "loss_fn.truncated_importance_sampling_type",
        "NeMo RL's icepop / seq-mask-tis corrections",
        lambda v, ctx: v in (None, "tis") or ctx.get(IS_ON) is not True,
        "none, or tis (carried with its ratio)",
    ),
    as_here(
        NEMO,
        "loss_fn.truncated_importance_sampling_ratio_min",
        "a lower truncation of the importance weight",
        lambda v, ctx: v in (None, 0, 0.0) or ctx.get(IS_ON) is not True,
        "no lower truncation (tis clamps at 0)",
    ),
    as_here(
        NEMO,
        "loss_fn.sequence_level_importance_ratios",
        "sequence-level importance ratios (GSPO)",
        off(False),
        "token-level ratios",
    ),
    custom(
        NEMO,
        "loss_fn.force_on_policy_ratio",
        "policy.old_logprob_pass",
        "true: one optimizer step per GRPO step (grpo.py asserts it), no old-logprob pass "
        "and a ratio of 1 at every token, as our old_logprob_pass auto",
        _on_policy_ratio,
    ),
    as_here(NEMO, "loss_fn.use_kl_in_reward", "a KL penalty in the reward", off(False), "none"),
    as_here(NEMO, "loss_fn.use_cispo", "the CISPO loss", off(False), "the clipped PPO loss"),
    as_here(
        NEMO,
        "loss_fn.disable_ppo_ratio",
        "a REINFORCE loss without the PPO ratio",
        off(False),
        "the clipped PPO loss",
    ),
    as_here(
        NEMO,
        "loss_fn.positive_example_nll_weight",
        "an NLL loss on correct samples (VAPO)",
        off(0.0, 0),
        "none",
    ),
    as_here(
        NEMO,
        "loss_fn.use_on_policy_kl_approximation",
        "an importance-weighted on-policy KL estimate",
        off(False),
        "the KL estimate on the sampled tokens",
    ),
    custom(NEMO, f"{ADV}.name", "(none: the group estimator)", "grpo only", _estimator),
    custom(
        NEMO,
        f"{ADV}.normalize_rewards",
        "dapo.advantage.norm_by_std (+ eps)",
        "same meaning; eps 1e-6 as NeMo RL's",
        _normalize,
    ),
    custom(
        NEMO,
        f"{ADV}.use_leave_one_out_baseline",
        "dapo.advantage.leave_one_out (+ std_over)",
        "true: baseline and std over each sample's N - 1 others (std_over others); false: "
        "the group's (std_over group)",
        _leave_one_out,
    ),
    as_here(
        NEMO,
        "grpo.use_leave_one_out_baseline",
        "NeMo RL's per-sample leave-one-out dynamic-sampling filter (a sample is dropped when "
        "its N - 1 others agree)",
        lambda v, ctx: v is False or ctx.get("grpo.use_dynamic_sampling") is not True,
        "dynamic sampling keeps or drops whole groups by the group's reward spread",
    ),
    as_here(NEMO, "grpo.advantage_clip_low", "advantage clipping", _null, "no clipping"),
    as_here(NEMO, "grpo.advantage_clip_high", "advantage clipping", _null, "no clipping"),
    as_here(
        NEMO,
        "grpo.invalid_tool_call_advantage",
        "advantage overrides for invalid tool calls",
        _null,
        "none",
    ),
    as_here(
        NEMO,
        "grpo.malformed_thinking_advantage",
        "advantage overrides for malformed <think> tags",
        _null,
        "none",
    ),
    as_here(
        NEMO,
        "grpo.seq_logprob_error_threshold",
        "masking of sequences by their train/generation log-prob error",
        _null,
        "no such masking",
    ),
    as_here(NEMO, "grpo.max_rollout_turns", "multi-turn rollouts", off(1), "one turn"),
    custom(
        NEMO,
        "grpo.max_num_epochs",
        "dapo.max_num_epochs",
        "same bound: the run ends after `max_num_epochs` passes over the training data or at "
        "max_num_steps, whichever comes first",
        _epochs_bound,
    ),
    as_here(
        NEMO,
        "grpo.stop_at_validation_threshold",
        "an early stop at a validation metric",
        _null,
        "no early stop",
    ),
    as_here(
        NEMO,
        "grpo.stop_at_validation_metric",
        "an early stop at a validation metric",
        _null,
        "no early stop",
    ),
    as_here(
        NEMO,
        "grpo.skip_reference_policy_logprobs_calculation",
        "nothing: any value gives the same run",
        lambda v, ctx: v is False or ctx.get(KL) == 0,
        "no reference log-probs without a KL term (kl_coef 0)",
    ),
    as_here(
        NEMO,
        "grpo.calculate_advantages_on_gpu",
        "nothing: any value gives the same run",
        lambda v, ctx: isinstance(v, bool),
        "where advantages are computed: the same values",
    ),
    as_here(NEMO, "grpo.async_grpo.enabled", ASYNC, off(False), "synchronous"),
    as_here(NEMO, "grpo.async_grpo", ASYNC, _null, "synchronous"),
    same(NEMO, "grpo.overlong_filtering", "dapo.overlong_filtering"),
    same(NEMO, "grpo.max_num_steps", "dapo.max_num_steps"),
    same(NEMO, "grpo.seed", "run.seed"),
    as_here(NEMO, "on_policy_distillation", "on-policy distillation", _null, "none"),
    as_here(
        NEMO,
        "policy.draft.enabled",
        DRAFT,
        off(False),
        "no draft model",
    ),
    same(
        NEMO,
        "policy.router_replay.enabled",
        "policy.moe.routing_replay",
        "same meaning: train with the experts the engine routed to (R3)",
    ),
) + tuple(
    as_here(NEMO, f"reward_penalties.{flag}", "NeMo-Gym reward penalties", off(False), "none")
    for flag in (
        "penalize_duplicated_reasoning",
        "penalize_empty_final_answer",
        "penalize_unwanted_tokens",
        "penalize_malformed_think_tag",
    )
)
"""NeMo RL's GRPO/DAPO algorithm keys."""


def algo_inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Algorithm keys of a config that NeMo RL does not read (key -> why)."""
    dead: dict[str, str] = {}
    ds_off = flat.get("grpo.use_dynamic_sampling") is not True
    penalties = any(flat.get(k) is True for k in flat if k.startswith("reward_penalties.penalize_"))
    name = flat.get(f"{ADV}.name", "grpo")
    for key in flat:
        if key.startswith("grpo.async_grpo.") and flat.get("grpo.async_grpo.enabled") is not True:
            if key != "grpo.async_grpo.enabled":
                dead[key] = "not live: grpo.async_grpo.enabled is false"
        elif key.startswith("policy.draft.") and key != "policy.draft.enabled":
            if flat.get("policy.draft.enabled") is not True:
                dead[key] = "not live: policy.draft.enabled is false"
        elif key.startswith("policy.router_replay.") and key != "policy.router_replay.enabled":
            if flat.get("policy.router_replay.enabled") is not True:
                dead[key] = "not live: policy.router_replay.enabled is false"
        elif key == "reward_penalties.token_ids" and not penalties:
            dead[key] = "not live: every reward_penalties.penalize_* is false"
    if name != "reinforce_plus_plus" and f"{ADV}.minus_baseline" in flat:
        dead[f"{ADV}.minus_baseline"] = (
            f"not live: read by reinforce_plus_plus, the estimator is {name}"
        )
    if name != "gdpo" and f"{ADV}.reward_weights" in flat:
        dead[f"{ADV}.reward_weights"] = f"not live: read by gdpo, the estimator is {name}"
    if "grpo.normalize_rewards" in flat:
        # grpo.py reads it nowhere; it reaches the estimator only as the default of
        # grpo.adv_estimator.normalize_rewards (`${grpo.normalize_rewards}`), translated there
        dead["grpo.normalize_rewards"] = (
            "not read by NeMo RL: grpo.adv_estimator.normalize_rewards is the live key"
        )
    if ds_off:
        # grpo.py: the legacy leave-one-out flag only shapes the std dynamic_sampling()
        # filters on; batch_multiplier and max_gen_batches are read with the filter on
        for key in (
            "grpo.use_leave_one_out_baseline",
            "grpo.batch_multiplier",
            "grpo.dynamic_sampling_max_gen_batches",
        ):
            if key in flat:
                dead[key] = "not live: grpo.use_dynamic_sampling is false"
    if flat.get(KL) == 0:
        for key in (
            "loss_fn.reference_policy_kl_type",
            "loss_fn.kl_input_clamp_value",
            "loss_fn.kl_output_clamp_value",
            "loss_fn.use_on_policy_kl_approximation",
        ):
            if key in flat:
                dead[key] = f"not live: {KL} is 0"
    return dead
