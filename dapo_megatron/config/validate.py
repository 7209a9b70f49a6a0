"""Cross-field validation of a loaded config: every constraint of a run, in one place.

All violations are collected and reported together, each naming the key, its value, the
file that set it and the constraint, so one edit-run cycle fixes a whole recipe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dapo_megatron.algorithms.loss_spec import spec_problems
from dapo_megatron.algorithms.prompt_skipping import skip_rule_problems
from dapo_megatron.algorithms.shaping_limits import overlong_problems, scaling_problems
from dapo_megatron.config.arch_checks import arch_problems
from dapo_megatron.config.arithmetic_task import num_distinct_problems
from dapo_megatron.config.data_checks import data_problems
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.float_ranges import float_problems, value_at
from dapo_megatron.config.length_checks import length_problems, longest_sequence
from dapo_megatron.config.model_arch import ModelArch, resolve_arch
from dapo_megatron.config.model_source import preset_applies
from dapo_megatron.config.parallel import (
    ParallelDims,
    generation_devices,
    padded_length,
    parallel_dims,
    sequence_multiple,
)
from dapo_megatron.config.rank_groups import expert_layout_warning
from dapo_megatron.config.refit_transport import refit_transport_problems
from dapo_megatron.config.run_plan import RunPlan, loss_scale_length, make_plan, resolve_device
from dapo_megatron.config.schema import DapoMegatronConfig


class _Checker:
    def __init__(self, config: DapoMegatronConfig, sources: dict[str, str]) -> None:
        self.config = config
        self.sources = sources
        # Float keys that are not finite or out of their range (config/float_ranges.py):
        # reported once by that generic rule, skipped by the per-key checks below (NaN would
        # fail each of them with a message about the wrong bound).
        flagged = float_problems(config, sources)
        self.errors: list[str] = list(flagged.values())
        self.flagged = set(flagged)

    def value(self, key: str) -> Any:
        return value_at(self.config, key)

    def require(self, ok: bool, key: str, constraint: str) -> None:
        if not ok and key not in self.flagged:
            source = self.sources.get(key, "configs")
            self.errors.append(f"{key} = {self.value(key)!r} (set in {source}): {constraint}")

    def at_least(self, key: str, low: float) -> None:
        self.require(self.value(key) >= low, key, f"must be >= {low}")

    def positive(self, key: str) -> None:
        self.require(self.value(key) > 0, key, "must be > 0")

    def in_unit(self, key: str) -> None:
        v = self.value(key)
        self.require(0 < v <= 1, key, "must be in (0, 1]")


def validate_config(
    config: DapoMegatronConfig, sources: dict[str, str], order: Sequence[str] = ()
) -> RunPlan:
    """Check every constraint of ``config`` (``sources``: dotted key -> the file that set it,
    for the messages; ``order``: those files as they were applied, base first, then the
    command line); raise ConfigError listing all violations. Returns the run plan: the
    config with every value derived from it (config/run_plan.py).

    Takes the config and its sources rather than the loader's ``LoadedConfig``, so that the
    loader imports this module and nothing here imports the loader back."""
    c = _Checker(config, sources)
    _check_run_and_cluster(c)
    _check_policy(c)
    _check_generation(c)
    _check_dapo(c)
    _check_validation_data_reward(c)
    warnings: list[str] = _check_rollout(c)
    dims = None
    try:
        dims = parallel_dims(config)
    except ConfigError as e:
        c.errors.append(str(e))
    arch: ModelArch | None = None
    arch_source = ""
    try:
        arch, arch_source = _resolve_policy_arch(config, sources, order)
    except ConfigError as e:
        c.errors.append(str(e))
    if arch is not None and (problems := arch_problems(arch)):
        # A model that contradicts itself: the layout checks below would divide by its sizes.
        c.errors += [f"{arch_source}: {p}" for p in problems]
        arch = None
    if dims is not None:
        # Shown by dapo-plan and the dry run, not only once Ray has placed the ranks.
        crossing = expert_layout_warning(dims, config.cluster.gpus_per_node)
        warnings += [crossing] if crossing else []
        _check_batches(c, dims)
        if arch is not None:
            _check_arch(c, dims, arch, arch_source, warnings)
    if len(c.errors) == 1:
        raise ConfigError(c.errors[0])  # one problem, one line
    if c.errors:
        n = len(c.errors)
        raise ConfigError(
            f"{n} invalid setting{'s' if n > 1 else ''}:\n  - " + "\n  - ".join(c.errors)
        )
    assert dims is not None
    return make_plan(
        config,
        dims=dims,
        arch=arch,
        arch_source=arch_source,
        warnings=tuple(warnings),
        device=resolve_device(config.cluster),
    )


def _resolve_policy_arch(
    config: DapoMegatronConfig, sources: dict[str, str], order: Sequence[str]
) -> tuple[ModelArch, str]:
    """The policy's architecture (model_arch.resolve_arch). A policy.model_arch set in an
    earlier layer than policy.model_name_or_path was the parent recipe's choice for the
    parent's model and does not apply, unless the run creates the model from it."""
    p = config.policy
    created = p.init_model_if_missing and not (Path(p.model_name_or_path) / "config.json").is_file()
    applies = preset_applies(sources, order, created_from_preset=created)
    return resolve_arch(
        p.model_name_or_path,
        p.model_arch,
        preset_applies=applies,
        preset_source=sources.get("policy.model_arch", ""),
    )


def _check_rollout(c: _Checker) -> list[str]:
    """Overlapped rollouts; returns the warnings (settings that work but are unusual)."""
    config = c.config
    r = config.rollout
    c.at_least("rollout.max_staleness", 0)
    if r.prompts_per_request is not None:
        c.at_least("rollout.prompts_per_request", 1)
    c.at_least("rollout.abort_tail_oversample", 1)
    # A key another key makes inert is refused, naming both: it would do nothing silently.
    c.require(
        not r.abort_tail or config.dapo.dynamic_sampling.enabled,
        "rollout.abort_tail",
        "cuts a dynamic-sampling round once it has the groups it needs; with "
        "dapo.dynamic_sampling.enabled=false a round is one batch and nothing is cut: "
        "set one of them",
    )
    warnings: list[str] = []
    if r.partial_rollouts:
        c.require(
            r.abort_tail,
            "rollout.partial_rollouts",
            "continues the samples a cut round aborted: set rollout.abort_tail=true",
        )
        c.require(
            not config.policy.moe.routing_replay,
            "rollout.partial_rollouts",
            "a continued sample has no single engine routing to replay: set "
            "policy.moe.routing_replay=false or rollout.partial_rollouts=false",
        )
        if config.dapo.loss.rollout_correction == "none":
            warnings.append(
                "rollout.partial_rollouts=true with dapo.loss.rollout_correction=none: "
                "samples continued after a refit hold tokens of the previous policy, "
                "trained without an importance weight; rollout_correction=tis corrects them"
            )
    if r.max_staleness < 1:
        return warnings
    c.require(
        not r.abort_tail,
        "rollout.abort_tail",
        "aborting a round's tail applies to the synchronous loop (rollout.max_staleness=0); "
        "overlapped requests are sized to the budget and finished (set one of them)",
    )
    c.require(
        not config.cluster.colocated,
        "rollout.max_staleness",
        "overlapping generation with training needs engines on devices of their own: set "
        "cluster.colocated=false and cluster.generation_num_devices (colocated engines share "
        "the policy's devices), or rollout.max_staleness=0",
    )
    if config.dapo.loss.rollout_correction == "none":
        warnings.append(
            f"rollout.max_staleness={r.max_staleness} with dapo.loss.rollout_correction=none: "
            "groups generated by older policies are trained without an importance weight; "
            "dapo.loss.rollout_correction=tis corrects for it (README: overlapped rollouts)"
        )
    age = config.dapo.dynamic_sampling.max_carry_age
    c.require(
        age is None or age == r.max_staleness,
        "dapo.dynamic_sampling.max_carry_age",
        f"{age} would be replaced by rollout.max_staleness={r.max_staleness}: with overlapped "
        "rollouts one bound applies to carried and fresh groups; leave max_carry_age at null "
        f"(or set it to {r.max_staleness})",
    )
    return warnings


def _check_skip_predicted(c: _Checker) -> None:
    """The skip rule's limits are written once (SkipRule, algorithms/prompt_skipping.py);
    each one the config breaks is reported under its key."""
    ds = c.config.dapo.dynamic_sampling
    c.require(
        ds.enabled,
        "dapo.dynamic_sampling.skip_predicted.enabled",
        "skipping predicts the groups dynamic sampling would drop: set "
        "dapo.dynamic_sampling.enabled=true",
    )
    fields = {k: v for k, v in vars(ds.skip_predicted).items() if k != "enabled"}
    for name, problem in skip_rule_problems(**fields):
        c.require(False, f"dapo.dynamic_sampling.skip_predicted.{name}", problem)


def _check_remainder(c: _Checker) -> None:
    task = c.config.data.remainder
    c.at_least("data.remainder.num_train", 1)
    c.at_least("data.remainder.num_val", 0)
    c.at_least("data.remainder.min_divisor", 2)
    c.require(
        task.min_divisor <= task.max_divisor < task.min_dividend <= task.max_dividend,
        "data.remainder",
        "need min_divisor <= max_divisor < min_dividend <= max_dividend",
    )
    size = (task.max_dividend - task.min_dividend + 1) * (task.max_divisor - task.min_divisor + 1)
    c.require(
        2 * task.num_val <= size,
        "data.remainder.num_val",
        f"validation problems are held out of training and the ranges give only {size} "
        "distinct problems; use at most half of them",
    )
    c.require(
        c.config.reward.verifier == "remainder",
        "reward.verifier",
        "data.format remainder is scored by the remainder verifier",
    )


def _check_run_and_cluster(c: _Checker) -> None:
    c.require(bool(c.value("run.name")), "run.name", "must not be empty")
    c.at_least("run.max_restarts", 0)
    for key in ("run.preemption_grace_s", "run.collective_timeout_s", "run.call_timeout_s"):
        c.positive(key)
    c.at_least("cluster.num_nodes", 1)
    c.at_least("cluster.gpus_per_node", 1)
    cl = c.config.cluster
    total = cl.num_nodes * cl.gpus_per_node
    if cl.colocated:
        c.require(
            cl.generation_num_devices == 0,
            "cluster.generation_num_devices",
            "must be 0 when cluster.colocated is true (engines share all devices)",
        )
    else:
        c.require(
            0 < cl.generation_num_devices < total,
            "cluster.generation_num_devices",
            f"split mode needs 0 < generation devices < num_nodes * gpus_per_node = {total}",
        )
    c.at_least("checkpointing.save_period", 1)
    c.at_least("checkpointing.keep_last", 1)


def _check_policy(c: _Checker) -> None:
    p = c.config.policy
    c.require(bool(p.model_name_or_path), "policy.model_name_or_path", "must not be empty")
    if p.init_model_if_missing:
        c.require(
            p.model_arch is not None,
            "policy.model_arch",
            "policy.init_model_if_missing needs an architecture preset to create",
        )
    c.positive("policy.optimizer.lr")
    c.at_least("policy.optimizer.min_lr", 0)
    c.require(
        p.optimizer.min_lr <= p.optimizer.lr,
        "policy.optimizer.min_lr",
        f"must be <= policy.optimizer.lr = {p.optimizer.lr}",
    )
    c.at_least("policy.optimizer.weight_decay", 0)
    for beta in ("adam_beta1", "adam_beta2"):
        key = f"policy.optimizer.{beta}"
        c.require(0 <= c.value(key) < 1, key, "must be in [0, 1)")
    c.positive("policy.optimizer.adam_eps")
    c.at_least("policy.optimizer.clip_grad", 0)
    c.at_least("policy.scheduler.lr_warmup_steps", 0)
    c.at_least("policy.scheduler.lr_warmup_init", 0)
    c.require(
        p.scheduler.lr_warmup_init <= p.optimizer.lr,
        "policy.scheduler.lr_warmup_init",
        f"must be <= policy.optimizer.lr = {p.optimizer.lr}",
    )
    if p.scheduler.lr_decay_steps is not None:
        c.at_least("policy.scheduler.lr_decay_steps", 1)
    c.at_least("policy.train_global_batch_size", 1)
    c.at_least("policy.train_micro_batch_size", 1)
    c.at_least("policy.logprob_micro_batch_size", 1)
    # generation.response_cap: fixed needs prompt + cap <= total, context a prompt < total.
    for key, constraint in length_problems(c.config):
        c.require(False, key, constraint)


def _check_generation(c: _Checker) -> None:
    g = c.config.generation
    c.positive("generation.temperature")
    c.in_unit("generation.top_p")
    c.require(g.top_k == -1 or g.top_k >= 1, "generation.top_k", "must be -1 (off) or >= 1")
    c.at_least("generation.max_response_length", 1)
    c.at_least("generation.engine.tensor_parallel_size", 1)
    c.in_unit("generation.engine.gpu_memory_utilization")
    c.at_least("generation.engine.max_num_seqs", 1)
    c.positive("generation.refit_bucket_mb")
    # The transport's constraints are the transport's to state (config/refit_transport.py).
    colocated_from = c.sources.get("cluster.colocated", "configs")
    for problem in refit_transport_problems(g, c.config.cluster, colocated_from):
        c.require(False, "generation.refit_transport", problem)
    if g.engine.tensor_parallel_size < 1:
        return
    devices = generation_devices(c.config)
    tp = g.engine.tensor_parallel_size
    if g.engine.num_engines is None:
        c.require(
            devices % tp == 0,
            "generation.engine.tensor_parallel_size",
            f"must divide the {devices} generation devices",
        )
    else:
        c.at_least("generation.engine.num_engines", 1)
        c.require(
            g.engine.num_engines * tp <= devices,
            "generation.engine.num_engines",
            f"num_engines * tensor_parallel_size = {g.engine.num_engines * tp} exceeds "
            f"the {devices} generation devices",
        )
    if g.backend == "megatron" and not c.config.cluster.colocated:
        # A split Megatron engine is one process with a model of its own (TP1); colocated,
        # the policy ranks generate on their own layout instead.
        c.require(
            tp == 1,
            "generation.engine.tensor_parallel_size",
            "must be 1 for the megatron backend in split mode (use generation.backend=vllm "
            "for tensor-parallel engines)",
        )
    if g.backend == "megatron" and c.config.cluster.colocated:
        # Colocated, the policy ranks generate on their own layout, and Megatron generation
        # has no pipeline or context parallelism: refused here, not by the engine once the
        # workers (and an SFT warm-up) have run.
        m = c.config.policy.megatron
        for key, size in (
            ("pipeline_model_parallel_size", m.pipeline_model_parallel_size),
            ("context_parallel_size", m.context_parallel_size),
        ):
            c.require(
                size == 1,
                f"policy.megatron.{key}",
                "must be 1 when the policy ranks generate (generation.backend=megatron with "
                "cluster.colocated=true): Megatron generation has tensor parallelism only; "
                "use cluster.colocated=false with cluster.generation_num_devices, or "
                "generation.backend=vllm",
            )
    if g.backend == "vllm" and c.config.cluster.colocated:
        # A colocated vLLM engine is a second process on a policy rank's GPU.
        c.require(
            c.config.cluster.device != "cpu",
            "generation.backend",
            "vllm cannot be colocated with the policy on CPU; use generation.backend=megatron "
            "or cluster.colocated=false with cluster.generation_num_devices",
        )


def _check_dapo(c: _Checker) -> None:
    d = c.config.dapo
    c.at_least("dapo.num_prompts_per_step", 1)
    c.at_least("dapo.num_generations_per_prompt", 1)
    c.at_least("dapo.max_num_steps", 1)
    if d.max_num_epochs is not None:
        c.at_least("dapo.max_num_epochs", 1)
        # The rule reads the sampler before a step (data/sampler.py epochs_exhausted); the
        # overlapped stream has drawn ahead of the step then, by a timing-dependent amount.
        c.require(
            c.config.rollout.max_staleness == 0,
            "dapo.max_num_epochs",
            "needs the synchronous loop (rollout.max_staleness=0): overlapped rollouts draw "
            "prompts ahead of training; bound the run with dapo.max_num_steps instead",
        )
    # The loss's limits are written once, beside LossSpec (algorithms/loss_spec.py); each one
    # the config breaks is reported here under its dapo.loss key.
    for name, _, constraint in spec_problems(d.loss, loss_scale_length(c.config)):
        if name == "loss_scale_length" and d.loss.loss_scale_length is None:
            continue  # generation.max_response_length stands in: checked under its own key
        c.require(False, f"dapo.loss.{name}", constraint)
    c.at_least("dapo.advantage.eps", 0)
    ds = d.dynamic_sampling
    if ds.batch_multiplier != "auto":
        c.require(
            ds.batch_multiplier >= 1,
            "dapo.dynamic_sampling.batch_multiplier",
            "must be >= 1 or auto (it multiplies the prompts generated per round)",
        )
    c.at_least("dapo.dynamic_sampling.max_batch_multiplier", 1)
    if ds.max_carry_age is not None:
        c.at_least("dapo.dynamic_sampling.max_carry_age", 1)
    if ds.enabled:
        c.require(
            d.num_generations_per_prompt >= 2,
            "dapo.num_generations_per_prompt",
            "dynamic sampling needs >= 2 samples per prompt (one sample never varies)",
        )
    if ds.skip_predicted.enabled:
        _check_skip_predicted(c)
    # The shaping's limits are written once (algorithms/shaping_limits.py), reported here
    # under their keys.
    ob = d.overlong_buffer
    if ob.enabled:
        keys = {
            "max_response_length": "generation.max_response_length",
            "buffer_length": "dapo.overlong_buffer.length",
            "penalty_factor": "dapo.overlong_buffer.penalty_factor",
        }
        for name, _, constraint in overlong_problems(
            max_response_length=c.config.generation.max_response_length,
            buffer_length=ob.length,
            penalty_factor=ob.penalty_factor,
        ):
            c.require(False, keys[name], constraint)
    rs = d.reward_scaling
    if rs.enabled:
        for name, _, constraint in scaling_problems(
            source_min=rs.source_min,
            source_max=rs.source_max,
            target_min=rs.target_min,
            target_max=rs.target_max,
        ):
            c.require(False, f"dapo.reward_scaling.{name}", constraint)


def _check_validation_data_reward(c: _Checker) -> None:
    cfg = c.config
    c.at_least("sft_warmup.num_steps", 0)
    c.at_least("sft_warmup.batch_size", 1)
    c.positive("sft_warmup.lr")
    c.at_least("validation.val_period", 0)
    c.at_least("validation.num_samples_per_prompt", 1)
    c.positive("validation.temperature")
    c.in_unit("validation.top_p")
    top_k = cfg.validation.top_k
    c.require(top_k == -1 or top_k >= 1, "validation.top_k", "must be -1 (off) or >= 1")
    if cfg.validation.max_prompts is not None:
        c.at_least("validation.max_prompts", 1)
    c.at_least("data.max_prompt_length", 1)
    if cfg.data.format == "arithmetic":
        c.at_least("data.arithmetic.num_train", 1)
        c.at_least("data.arithmetic.num_val", 0)
        c.at_least("data.arithmetic.difficulty", 2)
        if cfg.data.arithmetic.difficulty >= 2:
            distinct = num_distinct_problems(num_operands=cfg.data.arithmetic.difficulty)
            c.require(
                cfg.data.arithmetic.num_val < distinct,
                "data.arithmetic.num_val",
                f"validation problems are held out of training and the task has only "
                f"{distinct} distinct problems at difficulty "
                f"{cfg.data.arithmetic.difficulty}; use fewer",
            )
        c.require(
            cfg.reward.verifier == "arithmetic",
            "reward.verifier",
            "data.format arithmetic is scored by the arithmetic verifier",
        )
    elif cfg.data.format == "remainder":
        _check_remainder(c)
    else:
        c.require(
            cfg.data.train_path is not None,
            "data.train_path",
            f"data.format {cfg.data.format} reads prompts from a file; set its path",
        )
    for key, constraint in data_problems(cfg.data):
        c.require(False, key, constraint)
    c.positive("reward.timeout_s")
    c.at_least("reward.num_workers", 1)


def _check_batches(c: _Checker, dims: ParallelDims) -> None:
    cfg = c.config
    if dims.cp > 1:
        # Each CP rank sees part of every sequence; the per-sequence token count this mode
        # divides by would be the local one.
        c.require(
            cfg.dapo.loss.loss_agg_mode != "seq-mean-token-mean",
            "dapo.loss.loss_agg_mode",
            "seq-mean-token-mean is not supported with context_parallel_size > 1; use "
            "token-mean (DAPO) or seq-mean-token-sum",
        )
    p, d = cfg.policy, cfg.dapo
    if p.max_tokens_per_microbatch is not None:
        multiple = sequence_multiple(
            tp=dims.tp, cp=dims.cp, sequence_parallel=dims.sequence_parallel
        )
        longest = longest_sequence(cfg)  # at most the context with response_cap: context
        need = padded_length(longest, multiple)
        c.require(
            p.max_tokens_per_microbatch >= need,
            "policy.max_tokens_per_microbatch",
            f"must hold the longest sequence, data.max_prompt_length + "
            f"generation.max_response_length{_capped(cfg)} = {longest}"
            + (f" padded to a multiple of {multiple} = {need}" if need != longest else ""),
        )
    if p.train_micro_batch_size < 1 or p.train_global_batch_size < 1:
        return
    per_round = p.train_micro_batch_size * dims.dp
    c.require(
        p.train_global_batch_size % per_round == 0,
        "policy.train_global_batch_size",
        f"must be a multiple of train_micro_batch_size * data_parallel_size = "
        f"{p.train_micro_batch_size} * {dims.dp} = {per_round}",
    )
    samples = d.num_prompts_per_step * d.num_generations_per_prompt
    c.require(
        samples % p.train_global_batch_size == 0,
        "policy.train_global_batch_size",
        f"must divide the samples per step, dapo.num_prompts_per_step * "
        f"dapo.num_generations_per_prompt = {samples}, so every sample is trained on",
    )


def _capped(cfg: DapoMegatronConfig) -> str:
    """How the longest sequence is capped, for a message (response_cap: context)."""
    if cfg.generation.response_cap != "context":
        return ""
    return " (at most policy.max_total_sequence_length)"


def _check_arch(
    c: _Checker, dims: ParallelDims, arch: ModelArch, source: str, warnings: list[str]
) -> None:
    tp_key = "policy.megatron.tensor_model_parallel_size"
    c.require(
        arch.num_attention_heads % dims.tp == 0,
        tp_key,
        f"must divide num_attention_heads = {arch.num_attention_heads} ({source})",
    )
    c.require(
        arch.num_query_groups % dims.tp == 0,
        tp_key,
        f"must divide num_query_groups (key/value heads) = {arch.num_query_groups} ({source})",
    )
    c.require(
        arch.num_layers % dims.pp == 0,
        "policy.megatron.pipeline_model_parallel_size",
        f"must divide num_layers = {arch.num_layers} ({source})",
    )
    ep_key = "policy.megatron.expert_model_parallel_size"
    if arch.moe is None:
        c.require(
            dims.ep == 1,
            ep_key,
            f"= {dims.ep} needs a mixture-of-experts model; {source} is a dense "
            f"{arch.family} model: set it to 1",
        )
        c.require(
            not c.config.policy.moe.routing_replay,
            "policy.moe.routing_replay",
            f"needs a mixture-of-experts model; {source} is a dense {arch.family} model",
        )
    else:
        c.require(
            arch.moe.num_experts % dims.ep == 0,
            ep_key,
            f"must divide num_experts = {arch.moe.num_experts} ({source})",
        )
        _check_moe(c, dims, arch, source)
    engine_tp = c.config.generation.engine.tensor_parallel_size
    if engine_tp >= 1:
        c.require(
            arch.num_query_groups % engine_tp == 0 or engine_tp % arch.num_query_groups == 0,
            "generation.engine.tensor_parallel_size",
            f"must divide or be a multiple of num_query_groups = {arch.num_query_groups}",
        )
    length = c.config.policy.max_total_sequence_length
    if length > arch.max_position_embeddings:
        warnings.append(
            f"policy.max_total_sequence_length = {length} exceeds the model's "
            f"max_position_embeddings = {arch.max_position_embeddings} ({source})"
        )
    if dims.cp > 1 and length % (2 * dims.cp) != 0:
        warnings.append(
            f"policy.max_total_sequence_length = {length} is not a multiple of 2 * CP = "
            f"{2 * dims.cp}; sequences are padded to a multiple of it"
        )


def _check_moe(c: _Checker, dims: ParallelDims, arch: ModelArch, source: str) -> None:
    """policy.moe and the layout against a mixture-of-experts architecture."""
    assert arch.moe is not None
    c.at_least("policy.moe.aux_loss_coef", 0)
    if c.config.policy.moe.routing_replay:
        _check_routing_replay(c, dims)
    # Megatron's MoE layer raises in training when TP > 1 runs without SP (MoELayer.forward).
    c.require(
        dims.tp == 1 or dims.sequence_parallel,
        "policy.megatron.sequence_parallel",
        f"must be true for a mixture-of-experts model with tensor_model_parallel_size = "
        f"{dims.tp} > 1 (Megatron's MoE layer trains only with sequence parallelism under "
        f"TP) ({source})",
    )
    # HF renormalises one probability to 1; Megatron routes top-1 only after a softmax over
    # every expert (it refuses the post-softmax router at top-1), so the two would differ.
    c.require(
        not (arch.moe.norm_topk_prob and arch.moe.experts_per_token == 1),
        "policy.model_name_or_path",
        f"a top-1 router with norm_topk_prob = true is not supported ({source})",
    )


def _check_routing_replay(c: _Checker, dims: ParallelDims) -> None:
    """policy.moe.routing_replay: an engine that records routing, a schedule that replays."""
    key = "policy.moe.routing_replay"
    c.require(
        c.config.generation.backend == "megatron",
        key,
        "needs generation.backend=megatron: vLLM 0.32 returns routed experts only with "
        "Model Runner V2 (vllm/config/vllm.py _verify_aux_output_compatibility), which the "
        "vllm backend cannot use (no Triton on CPU; V2 refuses our V1 logits processor)",
    )
    # A full-recompute backward re-runs the router with the CURRENT target, which is its
    # own micro-batch's only when no other forward runs in between (no pipelining).
    c.require(
        dims.pp == 1 or c.config.policy.megatron.recompute_granularity != "full",
        key,
        "with pipeline_model_parallel_size > 1 needs recompute_granularity none or "
        "selective (a full recompute would replay another micro-batch's routing)",
    )


__all__ = ["validate_config"]
