"""RLinf's algorithm keys in the table (docs reference/algorithms/dapo.rst,
examples/reasoning/config/math/*.yaml), with their converters, RLinf's defaults, tiers and
live-key rule; rlinf_layout.py has the layout, engine and data keys, and dialect_keys.py
joins the tables.

Read at RLinf/RLinf a3816b596478dcd8a5c69a6ec1468c9519f77b5b: rlinf/workers/actor/
megatron_actor_worker.py (the loss, per micro-batch), rlinf/workers/megatron_worker.py
(_setup_valid_token_scale), rlinf/utils/utils.py (get_loss_agg_func), rlinf/config.py
(validate_reasoning_cfg), rlinf/runners/reasoning_runner.py (the dataloader).
"""

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
    off,
    same,
)
from dapo_megatron.migrate.rlinf_layout import RLINF_LAYOUT_KEYS, noop, only, top_k
from dapo_megatron.migrate.shared_keys import (
    AGG,
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


def rlinf_agg(value: Any, ctx: Mapping[str, Any]) -> str:
    """Our loss_agg_mode for RLinf's loss_agg_func, read from megatron_actor_worker.py's
    loss_func: each micro-batch's loss is loss_agg_func over that micro-batch alone
    (utils.py: token-mean = masked_mean, seq-mean-token-mean, seq-mean-token-sum), Megatron
    averages the micro-batches and the DP ranks, and use_valid_token_scale multiplies each
    by its valid tokens / the mini-batch's (megatron_worker.py _setup_valid_token_scale, x
    DP x micro-batches). So: token-mean with the scale is ours; without it, a token mean per
    micro-batch averaged: with micro-batches of one sample (training_batch_size_per_gpu 1,
    no dynamic batch size) that is seq-mean-token-mean. The seq-mean modes are ours with
    fixed micro-batches and no scale (equal micro-batches average to the whole mean)."""
    scale = ctx.get("algorithm.use_valid_token_scale", False)
    micro = ctx.get("algorithm.training_batch_size_per_gpu", 1)
    dynamic = ctx.get("runner.enable_dynamic_batch_size", False) is True
    if value == "token-mean" and scale is True:
        if any(k.startswith("cluster.component_placement.actor") for k in ctx if "," not in k):
            # A pipelined actor gets no whole batch: _setup_valid_token_scale(None) divides
            # by average_response_len x micro-batches x micro_batch_size, an estimate.
            raise Untranslatable(
                "needs a token mean over an estimated token count (a pipelined actor, "
                "megatron_worker.py _setup_valid_token_scale), which dapo-megatron lacks"
            )
        return "token-mean"
    if value not in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        raise Untranslatable(f"needs RLinf's {value} aggregation, which dapo-megatron lacks")
    if scale is True:
        raise Untranslatable(
            f"needs {value} per micro-batch weighted by its share of the mini-batch's tokens "
            "(use_valid_token_scale), which dapo-megatron lacks"
        )
    if dynamic:
        raise Untranslatable(
            f"needs a {value} per token-packed micro-batch, averaged over micro-batches "
            "(enable_dynamic_batch_size without use_valid_token_scale), which dapo-megatron lacks"
        )
    if value != "token-mean":
        return str(value)
    if micro == 1:
        return "seq-mean-token-mean"
    raise Untranslatable(
        f"needs a token mean per micro-batch of {micro} samples, averaged over micro-batches "
        "(use_valid_token_scale false), which dapo-megatron lacks (with "
        "training_batch_size_per_gpu 1 it is seq-mean-token-mean)"
    )


def _loss_agg(value: Any, ctx: Mapping[str, Any]) -> Translation:
    if "algorithm.use_valid_token_scale" not in ctx and value in (
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
    ):
        return Translation(
            ((AGG, value),),
            "same name; the same meaning with use_valid_token_scale true (token-mean) or "
            "fixed micro-batches (seq-mean modes)",
        )
    agg = rlinf_agg(value, ctx)
    note = (
        "same meaning"
        if agg == value
        else (
            "converted: a token mean per one-sample micro-batch, averaged over micro-batches "
            "(use_valid_token_scale false), is a mean of per-sequence token means"
        )
    )
    return Translation(((AGG, agg),), note)


def _early_stop(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """megatron_actor_worker.py loss_func zeroes a micro-batch whose DP-averaged ratio
    exceeds early_stop_imp_ratio; the ratio is near 1, so a bound of 1e9 never acts."""
    if value is None or value >= 1e6:
        return Translation((), "never acts (the ratio stays near 1), as here")
    raise Untranslatable(
        f"needs abandoning a micro-batch whose mean ratio exceeds {value}, which "
        "dapo-megatron lacks"
    )


def _adv(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """advantages.py compute_grpo_advantages: (r - group mean) / (group std + 1e-6), std
    unbiased (torch.std), as ours; normalize_advantages is read by GAE only."""
    if value != "grpo":
        raise Untranslatable(f"needs RLinf's {value} advantage, which dapo-megatron lacks")
    return Translation(
        (
            ("dapo.advantage.norm_by_std", True),
            ("dapo.advantage.leave_one_out", False),
            ("dapo.advantage.std_over", "group"),
        ),
        "GRPO: group mean and std, as here",
    )


def _recompute_logprobs(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """megatron_actor_worker.py: old_logprobs are the recomputed ones, else the engine's
    rollout_logprobs."""
    if value is True:
        return Translation((), "old log-probs from the policy, as here")
    raise Untranslatable(
        "needs the engine's log-probs as the old policy in the ratio, which dapo-megatron "
        "lacks (here: the policy's own)"
    )


def _gen_batches(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """reasoning_runner.py: the dataloader batch is rollout_batch_size x max_num_gen_batches
    prompts, and no code filters zero-variance groups: RLinf has no dynamic sampling."""
    if value == 1:
        return Translation(
            ((f"{DS}.enabled", False),),
            "no dynamic sampling: RLinf's reasoning runner keeps every group",
        )
    raise Untranslatable(
        f"needs a dataloader batch of {value} rounds' prompts trained at once, which "
        "dapo-megatron lacks"
    )


def _loss_type(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """megatron_actor_worker.py: the actor loss masks with response_mask only, so
    truncated responses train too."""
    if value != "actor":
        raise Untranslatable(f"needs RLinf's {value} loss, which dapo-megatron lacks")
    return Translation(
        (("dapo.overlong_filtering", False), (f"{OB}.enabled", False)),
        "the PPO actor loss on the verifier's reward: truncated responses train, and no "
        "length penalty (safe_length and len_reward_penalty are read by no RLinf code)",
    )


def _warmup_iters(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """config.py: lr_warmup_fraction (null by default) wins over lr_warmup_iters in
    Megatron's OptimizerParamScheduler; iters count optimizer steps, as ours."""
    if ctx.get("actor.lr_sched.lr_warmup_fraction") not in (None, 0, 0.0):
        return Translation((), "read with lr_warmup_fraction, which wins")
    return Translation(
        (
            ("policy.scheduler.lr_warmup_steps", as_int(value)),
            ("policy.scheduler.unit", "optimizer_step"),
        ),
        "same unit: optimizer steps (megatron_worker.py optimizer_step once per mini-batch)",
    )


def _warmup_fraction(value: Any, ctx: Mapping[str, Any]) -> Translation:
    """Megatron-LM's get_optimizer_param_scheduler (megatron_model_manager.py calls it):
    lr_warmup_steps = lr_warmup_fraction x lr_decay_iters x global batch (samples; decay
    iters default to train_iters, which config.py sets to 100000), and RLinf steps the
    scheduler by each optimizer step's samples (megatron_worker.py training_step). So the
    warm-up spans W = fraction x decay_iters optimizer steps: lr = init + (max - init) x k / W
    at step k while k <= W. Ours (the same scheduler, one count per optimizer step) gives
    that for a whole W, and for 0 < W <= 1 with W = 1: step 0 at lr_warmup_init, then max."""
    if value in (None, 0, 0.0):
        return Translation((), "no fraction: lr_warmup_iters decides")
    decay = ctx.get("actor.lr_sched.lr_decay_iters") or 100000
    span = float(value) * decay
    if 0 < span <= 1:
        steps = 1
    elif abs(span - round(span)) < 1e-9:
        steps = round(span)
    else:
        raise Untranslatable(
            f"needs a warm-up over {span:g} optimizer steps ({value} x lr_decay_iters "
            f"{decay}), which dapo-megatron lacks (here: a whole number of steps)"
        )
    return Translation(
        (("policy.scheduler.lr_warmup_steps", steps), ("policy.scheduler.unit", "optimizer_step")),
        f"converted: {value} x lr_decay_iters {decay} = {span:g} optimizer steps of warm-up; "
        f"lr_warmup_init for step 0, then the lr ramps as over {steps} step(s) here",
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
    custom(
        RLINF,
        "algorithm.loss_agg_func",
        AGG,
        "token-mean with use_valid_token_scale: same; without it, a token mean per "
        "micro-batch averaged (one-sample micro-batches: seq-mean-token-mean)",
        _loss_agg,
    ),
    noop("algorithm.use_valid_token_scale", "read with algorithm.loss_agg_func"),
    custom(RLINF, "algorithm.early_stop_imp_ratio", "(none)", "1e9: never acts", _early_stop),
    custom(
        RLINF,
        "algorithm.adv_type",
        "dapo.advantage.norm_by_std (+ leave_one_out)",
        "grpo: as here",
        _adv,
    ),
    noop("algorithm.normalize_advantages", "read by GAE only (advantages.py)"),
    custom(
        RLINF,
        "algorithm.loss_type",
        "dapo.overlong_filtering (+ overlong_buffer.enabled)",
        "actor: the PPO actor loss over every response, truncated ones too",
        _loss_type,
    ),
    custom(
        RLINF,
        "algorithm.calculate_entropy",
        "dapo.loss.entropy_coef",
        "false: no entropy term (entropy_bonus not live); true: entropy_bonus decides",
        lambda v, ctx: Translation(
            (("dapo.loss.entropy_coef", 0.0),) if v is False else (),
            "no entropy term" if v is False else "read with algorithm.entropy_bonus",
        ),
    ),
    custom(
        RLINF,
        "algorithm.recompute_logprobs",
        "(none: the policy's old log-probs)",
        "true: as here; false refused",
        _recompute_logprobs,
    ),
    noop("algorithm.shuffle_rollout", "the order of samples within a step"),
    custom(
        RLINF,
        "algorithm.max_num_gen_batches",
        f"{DS}.enabled",
        "1: no dynamic sampling (RLinf has none); others refused",
        _gen_batches,
    ),
    only("algorithm.sampling_params.do_sample", "greedy rollouts", off(True), "sampling"),
    same(RLINF, "algorithm.sampling_params.temperature", "generation.temperature"),
    same(RLINF, "algorithm.sampling_params.top_p", "generation.top_p"),
    mapped(
        RLINF,
        "algorithm.sampling_params.top_k",
        "generation.top_k",
        "same meaning; 1000000 (beyond any vocabulary) is off",
        top_k,
    ),
    same(RLINF, "algorithm.sampling_params.max_new_tokens", MAX_RESPONSE),
    only(
        "algorithm.sampling_params.repetition_penalty", "a repetition penalty", off(1.0, 1), "none"
    ),
    only(
        "algorithm.sampling_params.min_new_tokens",
        "a minimum response length",
        off(0, 1),
        "none (1: only an immediate EOS is barred there)",
    ),
    custom(
        RLINF,
        "actor.lr_sched.lr_warmup_iters",
        "policy.scheduler.lr_warmup_steps",
        "same unit when lr_warmup_fraction is null",
        _warmup_iters,
    ),
    custom(
        RLINF,
        "actor.lr_sched.lr_warmup_fraction",
        "policy.scheduler.lr_warmup_steps",
        "fraction x lr_decay_iters optimizer steps (a whole number, or at most 1)",
        _warmup_fraction,
    ),
    custom(
        RLINF,
        "runner.val_check_interval",
        "validation.val_period",
        "0: RLinf's reasoning runner never validates (reasoning_runner.py drops "
        "check_progress's validation flag)",
        lambda v, ctx: Translation(
            (("validation.val_period", 0),),
            "RLinf's reasoning runner never validates: reasoning_runner.py drops the "
            "validation flag check_progress returns",
        ),
    ),
    noop("actor.lr_sched.lr_decay_iters", "read with lr_decay_style (constant) and the warm-up"),
) + RLINF_LAYOUT_KEYS


RLINF_TIERS: dict[str, str] = {
    "actor.calculate_flops": IMPACT_HARMLESS,  # MFU metric
    "actor.group_name": IMPACT_HARMLESS,  # Ray worker-group names
    "rollout.group_name": IMPACT_HARMLESS,
    "inference.group_name": IMPACT_HARMLESS,
    "reward.group_name": IMPACT_HARMLESS,
    "hydra.": IMPACT_HARMLESS,  # Hydra's own output directory
    "runner.save_interval": IMPACT_HARMLESS,  # checkpoint cadence
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
    "runner.max_epochs": IMPACT_HARMLESS,  # when the run stops (rlinf_layout._epochs)
}
"""Rlinf keys (or subtrees ending in ".") classified by what the source does with them,
read before the patterns of dialects.impact."""


RLINF_DEFAULTS: dict[str, Any] = {
    # megatron_actor_worker.py reads clip_ratio_low/high with .get() (absent = null =
    # ratio_clip_eps).
    "algorithm.clip_ratio_low": None,
    "algorithm.clip_ratio_high": None,
    # config.py validate_reasoning_cfg: training_batch_size_per_gpu 1, n_minibatches 1,
    # max_num_gen_batches 1 when absent.
    "algorithm.training_batch_size_per_gpu": 1,
    "algorithm.n_minibatches": 1,
    "algorithm.max_num_gen_batches": 1,
    "algorithm.loss_type": "actor",
    # megatron_actor_worker.py reads cfg.algorithm.use_valid_token_scale as an attribute:
    # a config without it gets None (no scaling) from OmegaConf outside struct mode.
    "algorithm.use_valid_token_scale": False,
    # config.py: lr_warmup_iters 0 and lr_warmup_fraction null when absent.
    "actor.lr_sched.lr_warmup_iters": 0,
    "actor.model.context_parallel_size": 1,
    "actor.model.sequence_parallel": False,
}
"""The value the source's code or base config gives a key that a config omits, for the
keys that change a run (an omitted key takes the source's default, never ours)."""


def inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """Keys of a config that are not live in RLinf (key -> why)."""
    out: dict[str, str] = {}
    for key in (
        "algorithm.safe_length",
        "algorithm.len_reward_penalty",
        "algorithm.max_resample",
        "algorithm.max_length",
    ):
        if key in flat:
            out[key] = (
                "not live: RLinf's code does not read it at this commit (only its DAPO guide, "
                "docs/source-en/rst_source/reference/algorithms/dapo.rst, names it)"
            )
    new = flat.get("algorithm.sampling_params.max_new_tokens")
    if isinstance(new, str) and new.replace(" ", "").startswith("${subtract:${runner.seq_length},"):
        out["algorithm.sampling_params.max_new_tokens"] = (
            "not live as written: RLinf resolves it to runner.seq_length - "
            "data.max_prompt_length, carried with runner.seq_length"
        )
    if isinstance(flat.get("rollout.return_logprobs"), str):
        out["rollout.return_logprobs"] = (
            "not live as written: read with algorithm.recompute_logprobs"
        )
    if (
        flat.get("runner.enable_dynamic_batch_size") is not True
        and "runner.max_tokens_per_mbs" in flat
    ):
        out["runner.max_tokens_per_mbs"] = "not live: runner.enable_dynamic_batch_size is false"
    if flat.get("algorithm.calculate_entropy") is False and "algorithm.entropy_bonus" in flat:
        # megatron_actor_worker.py: calculate_entropy_loss = entropy_bonus > 0 and
        # calculate_entropy; without it no entropy term is added.
        out["algorithm.entropy_bonus"] = "not live: algorithm.calculate_entropy is false"
    if flat.get("algorithm.kl_beta", 0) == 0 and "algorithm.kl_penalty_type" in flat:
        out["algorithm.kl_penalty_type"] = "not live: algorithm.kl_beta is 0"
    return out
