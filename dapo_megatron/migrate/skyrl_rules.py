"""Converters of SkyRL's algorithm keys whose rule reads several keys (skyrl_keys.py holds
the table): dynamic sampling's rounds and surplus, loss reduction, the KL term, truncated
importance sampling, evaluation sampling, the lr schedule.

Read at NovaSky-AI/SkyRL a9564572eb8e91076be43c1bd5e4615e3de17265 (files named per rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import Translation, Untranslatable, as_int
from dapo_megatron.migrate.shared_keys import AGG, DS

ALGO = "trainer.algorithm"
OPC = f"{ALGO}.off_policy_correction"
EVAL = "generator.eval_sampling_params"
OPT = "trainer.policy.optimizer_config"


def _max_batches(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """trainer.py handle_dynamic_sampling raises once `sample_batch_count >=
    max_sample_batches` while more groups are needed (<= 0: never); each round is one
    dataloader batch of train_batch_size prompts. trainer_utils.py handle_filter_sampling
    keeps the first train_batch_size x n samples and drops the rest (state reset): the
    surplus is discarded, and a round draws train_batch_size prompts (multiplier 1)."""
    n = as_int(value)
    kind = f"{ALGO}.dynamic_sampling.type"
    if kind in ctx and ctx[kind] != "filter":
        return Translation((), f"unused: dynamic_sampling.type is {ctx[kind]}")
    settings: list[tuple[str, Any]] = [(f"{DS}.max_gen_batches", n)]
    note = "same meaning: at most {v} full rounds of train_batch_size prompts, <= 0 unlimited"
    if ctx.get(f"{ALGO}.dynamic_sampling.type") == "filter":
        settings += [(f"{DS}.surplus", "discard"), (f"{DS}.batch_multiplier", 1.0)]
        note += (
            "; groups beyond train_batch_size are discarded (handle_filter_sampling "
            "truncates), and round 1 draws train_batch_size prompts (later rounds here draw "
            "only the groups still needed where SkyRL draws a whole batch)"
        )
    return Translation(tuple(settings), note.replace("{v}", str(n)))


def skyrl_agg(ctx: Mapping[str, Any]) -> str:
    """Our loss_agg_mode for SkyRL's loss_reduction (ppo_utils.py
    apply_loss_reduction_to_advantages_minibatch, applied per mini-batch by trainer.py
    _normalize_advantages): token_mean divides by the mini-batch's valid tokens, as ours;
    sequence_mean averages each sequence's token mean over the mini-batch;
    token_mean_legacy takes a token mean per slice of micro_train_batch_size_per_gpu samples
    and averages the slices: a slice of one sample is one sequence, so with 1 it is
    seq-mean-token-mean, and with more it has no counterpart."""
    value = ctx.get(f"{ALGO}.loss_reduction", "token_mean")
    if value == "token_mean":
        return "token-mean"
    if value == "token_mean_legacy":
        micro = ctx.get("trainer.micro_train_batch_size_per_gpu", 1)
        if micro != 1 or as_int(ctx.get("trainer.max_tokens_per_microbatch", -1)) > 0:
            raise Untranslatable(
                f"needs a token mean per slice of {micro} samples averaged over the slices "
                "(SkyRL's token_mean_legacy), which dapo-megatron lacks (here: token-mean over "
                "the mini-batch; with micro_train_batch_size_per_gpu=1 it is seq-mean-token-mean)"
            )
        agg = "seq-mean-token-mean"
    elif value in ("sequence_mean", "seq_mean_token_sum_norm"):
        agg = "seq-mean-token-mean" if value == "sequence_mean" else "seq-mean-token-sum-norm"
    else:
        raise Untranslatable(f"needs SkyRL's {value} loss reduction, which dapo-megatron lacks")
    if ctx.get("generator.apply_overlong_filtering") is True:
        # skyrl_gym_generator.py zeroes a truncated response's loss mask; SkyRL's per-sequence
        # modes still count it (they divide by the mini-batch's sequences, or slices), ours
        # count only sequences with a valid token (algorithms/loss.py loss_denominator).
        raise Untranslatable(
            f"needs SkyRL's {value} counting overlong-filtered (all-masked) responses in its "
            "mean, which dapo-megatron lacks (here: a per-sequence mean over the sequences "
            "that keep a token)"
        )
    return agg


def _loss_reduction(value: Any, ctx: Mapping[str, Any]) -> Translation:
    agg = skyrl_agg({**ctx, f"{ALGO}.loss_reduction": value})
    settings: list[tuple[str, Any]] = [(AGG, agg)]
    if agg == "seq-mean-token-sum-norm":
        length = ctx.get(f"{ALGO}.max_seq_len")
        if length is None:
            raise Untranslatable("seq_mean_token_sum_norm needs trainer.algorithm.max_seq_len")
        settings.append(("dapo.loss.loss_scale_length", as_int(length)))
    note = (
        "same meaning"
        if value != "token_mean_legacy"
        else ("converted: a token mean per sample, averaged (micro_train_batch_size_per_gpu 1)")
    )
    return Translation(tuple(settings), note)


def _kl_loss(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """megatron_model_wrapper.py: the KL term is masked_mean over each sequence's tokens,
    then the mean over sequences (and micro-batches), whatever loss_reduction is; ours
    aggregates it with the policy loss (algorithms/loss.py torch_policy_loss)."""
    if value is False:
        return Translation((("dapo.loss.kl_coef", 0.0),), "no KL loss: kl_coef 0")
    agg = skyrl_agg(ctx)
    if agg != "seq-mean-token-mean":
        raise Untranslatable(
            f"needs a KL term averaged per sequence beside a {agg} policy loss, which "
            "dapo-megatron lacks (here: both aggregated alike)"
        )
    coef = ctx.get(f"{ALGO}.kl_loss_coef", 0.001)
    est = {"k1": "k1", "k2": "k2", "k3": "k3", "low_var_kl": "k3"}.get(
        ctx.get(f"{ALGO}.kl_estimator_type", "k3")
    )
    if est is None:
        raise Untranslatable("needs a KL estimator other than k1/k2/k3, which dapo-megatron lacks")
    return Translation(
        (("dapo.loss.kl_coef", coef), ("dapo.loss.kl_estimator", est)),
        f"a per-sequence-mean KL loss, coefficient {coef}, estimator {est}",
    )


def _tis(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """off_policy_correction_utils.py compute_tis_ratio: token: min(exp(old - rollout),
    token_tis_ratio_clip_high) per token; sequence: min(exp(sum of old - rollout),
    sequence_tis_ratio_clip_high); both multiply the per-token loss, as ours."""
    if value is None:
        return Translation((("dapo.loss.rollout_correction", "none"),), "no correction, as here")
    if value not in ("token", "sequence"):
        raise Untranslatable(f"needs {value} importance weights, which dapo-megatron lacks")
    cap = ctx.get(f"{OPC}.{value}_tis_ratio_clip_high", 2.0 if value == "token" else 5.0)
    return Translation(
        (
            ("dapo.loss.rollout_correction", "tis"),
            ("dapo.loss.rollout_correction_level", value),
            ("dapo.loss.tis_cap", cap),
        ),
        f"same meaning: {value}-level truncated importance weights, capped at {cap}",
    )


def _use_tis(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """utils.py validate_cfg: the deprecated use_tis sets tis_ratio_type token with
    token_tis_ratio_clip_high = tis_imp_ratio_cap."""
    if value is not True:
        return Translation((), "off (the off_policy_correction keys decide)")
    return _tis(
        "token",
        {**ctx, f"{OPC}.token_tis_ratio_clip_high": ctx.get(f"{ALGO}.tis_imp_ratio_cap", -1.0)},
    )


def _eval(which: str) -> Any:
    """config.py GeneratorConfig: without eval_sampling_params, evaluation is greedy
    (temperature 0) at the training cap; once any is given, the others take
    SamplingParams' defaults (temperature 1.0, top_p 1.0, max_generate_length 1024)."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        given = any(
            ctx.get(f"{EVAL}.{k}") is not None
            for k in ("temperature", "top_p", "max_generate_length")
        )
        if value is None and not given:
            if which == "temperature":
                return Translation(
                    (("validation.greedy", True), ("validation.temperature", 1.0)),
                    "no eval_sampling_params: greedy (validation.temperature is then unused)",
                )
            return Translation((), "no eval_sampling_params: greedy at the training cap")
        if value is None:
            value = {"temperature": 1.0, "top_p": 1.0, "max_generate_length": 1024}[which]
        if which == "temperature":
            if value == 0:
                return Translation(
                    (("validation.greedy", True), ("validation.temperature", 1.0)),
                    "temperature 0: greedy (validation.temperature is then unused)",
                )
            return Translation((("validation.temperature", value),), "same meaning")
        if which == "top_p":
            return Translation((("validation.top_p", value),), "same meaning")
        cap = ctx.get("generator.sampling_params.max_generate_length", 1024)
        if value == cap:
            return Translation((), "the training cap, as here")
        raise Untranslatable(
            f"needs a validation response cap ({value}) apart from training's ({cap}), which "
            "dapo-megatron lacks (here: generation.max_response_length for both)"
        )

    return convert


def _eval_interval(value: Any, ctx: Mapping[str, Any]) -> Translation:
    n = as_int(value)
    return Translation((("validation.val_period", max(n, 0)),), "same meaning; -1 (off) is 0 here")


def _scheduler(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value in ("constant_with_warmup", "constant"):
        return Translation(
            (
                ("policy.scheduler.lr_decay_style", "constant"),
                ("policy.scheduler.unit", "optimizer_step"),
            ),
            "a constant lr after warm-up; the schedule steps once per optimizer step "
            "(megatron_strategy.py optimizer_step: scheduler.step(1)), as ours",
        )
    raise Untranslatable(f"needs SkyRL's {value} schedule, which dapo-megatron lacks")


def _betas(value: Any, ctx: Mapping[str, Any]) -> Translation:
    b1, b2 = value
    return Translation(
        (("policy.optimizer.adam_beta1", b1), ("policy.optimizer.adam_beta2", b2)), "same meaning"
    )


def _strategy(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if value == "megatron":
        return Translation((), "Megatron-Core, as here")
    raise Untranslatable(f"needs {value} training, which dapo-megatron lacks (here: Megatron-Core)")


def _epochs(value: Any, ctx: Mapping[str, Any]) -> Translation:
    raise Untranslatable(
        f"{value} pass(es) over the data: a step count that depends on the dataset's size "
        "after SkyRL's prompt-length filter; set dapo.max_num_steps (the lr is constant "
        "after warm-up in both, so it decides when the run stops, not what a step does)"
    )


def _estimator(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """ppo_utils.py compute_grpo_outcome_advantage: (r - group mean), divided by the group
    std when grpo_norm_by_std."""
    if value == "grpo":
        return Translation(
            (("dapo.advantage.leave_one_out", False), ("dapo.advantage.std_over", "group")),
            "GRPO: the whole group's mean and (unbiased) std, as here",
        )
    raise Untranslatable(f"needs the {value} advantage estimator, which dapo-megatron lacks")
