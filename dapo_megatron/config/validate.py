"""Cross-field validation of a loaded config: every constraint of a run, in one place.

All violations are collected and reported together, each naming the key, its value, the
file that set it and the constraint, so one edit-run cycle fixes a whole recipe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.model_arch import ModelArch, resolve_arch
from dapo_megatron.config.parallel import ParallelDims, generation_devices, parallel_dims
from dapo_megatron.config.run_plan import RunPlan, make_plan, resolve_device
from dapo_megatron.data.pack_plan import padded_length, sequence_multiple

if TYPE_CHECKING:  # the loader imports this module: no runtime import back
    from dapo_megatron.config.loader import LoadedConfig


class _Checker:
    def __init__(self, loaded: LoadedConfig) -> None:
        self.loaded = loaded
        self.errors: list[str] = []

    def value(self, key: str) -> Any:
        node: Any = self.loaded.config
        for part in key.split("."):
            node = getattr(node, part)
        return node

    def require(self, ok: bool, key: str, constraint: str) -> None:
        if not ok:
            source = self.loaded.sources.get(key, "configs")
            self.errors.append(f"{key} = {self.value(key)!r} (set in {source}): {constraint}")

    def at_least(self, key: str, low: float) -> None:
        self.require(self.value(key) >= low, key, f"must be >= {low}")

    def positive(self, key: str) -> None:
        self.require(self.value(key) > 0, key, "must be > 0")

    def in_unit(self, key: str) -> None:
        v = self.value(key)
        self.require(0 < v <= 1, key, "must be in (0, 1]")


def validate_config(loaded: LoadedConfig) -> RunPlan:
    """Check every constraint; raise ConfigError listing all violations. Returns the run
    plan: the config with every value derived from it (config/run_plan.py)."""
    c = _Checker(loaded)
    _check_run_and_cluster(c)
    _check_policy(c)
    _check_generation(c)
    _check_dapo(c)
    _check_validation_data_reward(c)
    dims = None
    try:
        dims = parallel_dims(loaded.config)
    except ConfigError as e:
        c.errors.append(str(e))
    arch, arch_source = None, ""
    try:
        arch, arch_source = resolve_arch(
            loaded.config.policy.model_name_or_path, loaded.config.policy.model_arch
        )
    except ConfigError as e:
        c.errors.append(str(e))
    warnings: list[str] = []
    if dims is not None:
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
        loaded.config,
        dims=dims,
        arch=arch,
        arch_source=arch_source,
        warnings=tuple(warnings),
        device=resolve_device(loaded.config.cluster),
    )


def _check_run_and_cluster(c: _Checker) -> None:
    c.require(bool(c.value("run.name")), "run.name", "must not be empty")
    c.at_least("run.max_restarts", 0)
    c.at_least("cluster.num_nodes", 1)
    c.at_least("cluster.gpus_per_node", 1)
    cl = c.loaded.config.cluster
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
    p = c.loaded.config.policy
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
    needed = c.loaded.config.data.max_prompt_length + c.loaded.config.generation.max_response_length
    c.require(
        p.max_total_sequence_length >= needed,
        "policy.max_total_sequence_length",
        f"must be >= data.max_prompt_length + generation.max_response_length = {needed}",
    )


def _check_generation(c: _Checker) -> None:
    g = c.loaded.config.generation
    c.positive("generation.temperature")
    c.in_unit("generation.top_p")
    c.require(g.top_k == -1 or g.top_k >= 1, "generation.top_k", "must be -1 (off) or >= 1")
    c.at_least("generation.max_response_length", 1)
    c.at_least("generation.engine.tensor_parallel_size", 1)
    c.in_unit("generation.engine.gpu_memory_utilization")
    c.at_least("generation.engine.max_num_seqs", 1)
    c.positive("generation.refit_bucket_mb")
    cluster = c.loaded.config.cluster
    c.require(
        not (g.refit_transport == "ipc" and cluster.num_nodes > 1 and not cluster.colocated),
        "generation.refit_transport",
        "ipc shares memory between processes of one node; split engines on a multi-node "
        "cluster need generation.refit_transport=broadcast (or auto)",
    )
    if g.engine.tensor_parallel_size < 1:
        return
    devices = generation_devices(c.loaded.config)
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
    if g.backend == "megatron" and not c.loaded.config.cluster.colocated:
        # A split Megatron engine is one process with a model of its own (TP1); colocated,
        # the policy ranks generate on their own layout instead.
        c.require(
            tp == 1,
            "generation.engine.tensor_parallel_size",
            "must be 1 for the megatron backend in split mode (use generation.backend=vllm "
            "for tensor-parallel engines)",
        )
    if g.backend == "vllm" and c.loaded.config.cluster.colocated:
        # A colocated vLLM engine is a second process on a policy rank's GPU.
        c.require(
            c.loaded.config.cluster.device != "cpu",
            "generation.backend",
            "vllm cannot be colocated with the policy on CPU; use generation.backend=megatron "
            "or cluster.colocated=false with cluster.generation_num_devices",
        )


def _check_dapo(c: _Checker) -> None:
    d = c.loaded.config.dapo
    c.at_least("dapo.num_prompts_per_step", 1)
    c.at_least("dapo.num_generations_per_prompt", 1)
    c.at_least("dapo.max_num_steps", 1)
    c.require(
        0 <= d.loss.clip_ratio_low < 1,
        "dapo.loss.clip_ratio_low",
        "eps_low must be in [0, 1) (the lower clip bound 1 - eps_low must stay > 0)",
    )
    c.at_least("dapo.loss.clip_ratio_high", 0)
    if d.loss.clip_ratio_c is not None:
        c.require(
            d.loss.clip_ratio_c > 1,
            "dapo.loss.clip_ratio_c",
            "the dual-clip bound must be > 1 (or null to disable)",
        )
    if d.loss.loss_scale_length is not None:
        c.at_least("dapo.loss.loss_scale_length", 1)
    c.at_least("dapo.loss.kl_coef", 0)
    c.at_least("dapo.loss.entropy_coef", 0)
    c.positive("dapo.loss.tis_cap")
    c.require(0 <= d.loss.mis_low < 1, "dapo.loss.mis_low", "must be in [0, 1)")
    c.require(d.loss.mis_high > 1, "dapo.loss.mis_high", "must be > 1")
    c.at_least("dapo.advantage.eps", 0)
    ds = d.dynamic_sampling
    if ds.batch_multiplier != "auto":
        c.require(
            ds.batch_multiplier >= 1,
            "dapo.dynamic_sampling.batch_multiplier",
            "must be >= 1 or auto (it multiplies the prompts generated per round)",
        )
    c.at_least("dapo.dynamic_sampling.max_batch_multiplier", 1)
    c.at_least("dapo.dynamic_sampling.max_carry_age", 1)
    if ds.enabled:
        c.require(
            d.num_generations_per_prompt >= 2,
            "dapo.num_generations_per_prompt",
            "dynamic sampling needs >= 2 samples per prompt (one sample never varies)",
        )
    ob = d.overlong_buffer
    if ob.enabled:
        max_len = c.loaded.config.generation.max_response_length
        c.require(
            0 < ob.length < max_len,
            "dapo.overlong_buffer.length",
            f"must be in (0, generation.max_response_length = {max_len}): the buffer "
            f"is the last part of the response cap",
        )
        c.at_least("dapo.overlong_buffer.penalty_factor", 0)
    rs = d.reward_scaling
    if rs.enabled:
        c.require(
            rs.source_max > rs.source_min,
            "dapo.reward_scaling.source_max",
            f"must be > dapo.reward_scaling.source_min = {rs.source_min}",
        )


def _check_validation_data_reward(c: _Checker) -> None:
    cfg = c.loaded.config
    c.at_least("sft_warmup.num_steps", 0)
    c.at_least("sft_warmup.batch_size", 1)
    c.positive("sft_warmup.lr")
    c.at_least("validation.val_period", 0)
    c.at_least("validation.num_samples_per_prompt", 1)
    c.positive("validation.temperature")
    c.in_unit("validation.top_p")
    if cfg.validation.max_prompts is not None:
        c.at_least("validation.max_prompts", 1)
    c.at_least("data.max_prompt_length", 1)
    if cfg.data.format == "arithmetic":
        c.at_least("data.arithmetic.num_train", 1)
        c.at_least("data.arithmetic.num_val", 0)
        c.at_least("data.arithmetic.difficulty", 2)
        if cfg.data.arithmetic.difficulty >= 2:
            from dapo_megatron.data.arithmetic import num_distinct_problems

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
    else:
        c.require(
            cfg.data.train_path is not None,
            "data.train_path",
            f"data.format {cfg.data.format} reads prompts from a file; set its path",
        )
    c.positive("reward.timeout_s")
    c.at_least("reward.num_workers", 1)


def _check_batches(c: _Checker, dims: ParallelDims) -> None:
    cfg = c.loaded.config
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
        longest = cfg.data.max_prompt_length + cfg.generation.max_response_length
        need = padded_length(longest, multiple)
        c.require(
            p.max_tokens_per_microbatch >= need,
            "policy.max_tokens_per_microbatch",
            f"must hold the longest sequence, data.max_prompt_length + "
            f"generation.max_response_length = {longest}"
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
    engine_tp = c.loaded.config.generation.engine.tensor_parallel_size
    if engine_tp >= 1:
        c.require(
            arch.num_query_groups % engine_tp == 0 or engine_tp % arch.num_query_groups == 0,
            "generation.engine.tensor_parallel_size",
            f"must divide or be a multiple of num_query_groups = {arch.num_query_groups}",
        )
    length = c.loaded.config.policy.max_total_sequence_length
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


__all__ = ["validate_config"]
