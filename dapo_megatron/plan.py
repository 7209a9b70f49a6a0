"""The run plan printed by dapo-train and dapo-plan: layout and batch arithmetic of a step.

Pure arithmetic on a validated config; nothing is started. The memory estimate per device
belongs here too once the planner lands (it needs the layout computed below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dapo_megatron.config.loader import LoadedConfig
from dapo_megatron.config.parallel import generation_devices


@dataclass(frozen=True)
class StepPlan:
    """How one DAPO step is split into generation rounds, mini-batches and micro-batches."""

    samples_per_step: int
    """num_prompts_per_step * num_generations_per_prompt."""
    optimizer_steps_per_step: int
    """Mini-batches (optimizer updates) per DAPO step."""
    micro_batches_per_rank: int
    """Forward/backward micro-batches per DP rank per mini-batch."""
    first_round_prompts: int | None
    """Prompts generated in the first round (None when the multiplier is automatic)."""
    num_engines: int
    """Generation engines."""


def step_plan(loaded: LoadedConfig) -> StepPlan:
    """Derive the step arithmetic of a validated config."""
    assert loaded.report is not None, "step_plan needs a validated config"
    cfg, dims = loaded.config, loaded.report.dims
    samples = cfg.dapo.num_prompts_per_step * cfg.dapo.num_generations_per_prompt
    ds = cfg.dapo.dynamic_sampling
    if not ds.enabled:
        first: int | None = cfg.dapo.num_prompts_per_step
    elif ds.batch_multiplier == "auto":
        first = None
    else:
        first = math.ceil(ds.batch_multiplier * cfg.dapo.num_prompts_per_step)
    engine = cfg.generation.engine
    engines = engine.num_engines or generation_devices(cfg) // engine.tensor_parallel_size
    return StepPlan(
        samples_per_step=samples,
        optimizer_steps_per_step=samples // cfg.policy.train_global_batch_size,
        micro_batches_per_rank=cfg.policy.train_global_batch_size
        // (cfg.policy.train_micro_batch_size * dims.dp),
        first_round_prompts=first,
        num_engines=engines,
    )


def _human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def format_plan(loaded: LoadedConfig) -> str:
    """A short human-readable table of the run's layout."""
    assert loaded.report is not None
    cfg, report = loaded.config, loaded.report
    dims, arch, plan = report.dims, report.arch, step_plan(loaded)
    rows: list[tuple[str, str]] = [("recipe", " <- ".join(reversed(loaded.files)))]
    if arch is not None:
        rows.append(
            (
                "model",
                f"{arch.family}, {arch.num_layers} layers, hidden {arch.hidden_size}, heads "
                f"{arch.num_attention_heads}/{arch.num_query_groups} kv, vocab {arch.vocab_size}, "
                f"{_human_count(arch.num_parameters())} params ({report.arch_source})",
            )
        )
    else:
        rows.append(("model", f"architecture unknown: {report.arch_source}"))
    cl = cfg.cluster
    mode = "colocated" if cl.colocated else f"split, {cl.generation_num_devices} for generation"
    rows.append(
        ("cluster", f"{cl.num_nodes} node(s) x {cl.gpus_per_node} devices ({cl.device}), {mode}")
    )
    rows.append(
        (
            "policy",
            f"TP{dims.tp} PP{dims.pp} CP{dims.cp} DP{dims.dp}"
            f"{' +SP' if dims.sequence_parallel else ''}, world {dims.world_size}, "
            f"{cfg.policy.precision}",
        )
    )
    rows.append(
        (
            "generation",
            f"{cfg.generation.backend}: {plan.num_engines} engine(s) x TP"
            f"{cfg.generation.engine.tensor_parallel_size}, response cap "
            f"{cfg.generation.max_response_length} tokens",
        )
    )
    d = cfg.dapo
    rows.append(
        (
            "step",
            f"{d.num_prompts_per_step} prompts x {d.num_generations_per_prompt} = "
            f"{plan.samples_per_step} samples -> {plan.optimizer_steps_per_step} "
            f"optimizer step(s) of {cfg.policy.train_global_batch_size}, "
            f"{plan.micro_batches_per_rank} micro-batch(es) of "
            f"{cfg.policy.train_micro_batch_size} per DP rank",
        )
    )
    ds = d.dynamic_sampling
    if ds.enabled:
        first = (
            "set from the keep rate (auto)"
            if plan.first_round_prompts is None
            else f"{plan.first_round_prompts} prompts in round 1"
        )
        limit = "unlimited" if ds.max_gen_batches <= 0 else f"at most {ds.max_gen_batches}"
        rows.append(("dyn. sampling", f"{first}, {limit} rounds, surplus {ds.surplus}"))
    else:
        rows.append(("dyn. sampling", "off"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)
