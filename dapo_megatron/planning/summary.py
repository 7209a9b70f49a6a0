"""The run plan printed by dapo-train and dapo-plan: layout and batch arithmetic of a step.

Pure arithmetic on a validated config; nothing is started. The per-GPU memory estimate
comes from planning/memory.py; format_memory prints it next to the layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dapo_megatron.config.loader import LoadedConfig
from dapo_megatron.config.model_arch import ModelArch
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.planning.memory import (
    MemoryReport,
    colocated_engine,
    cuda_context_gib,
    policy_nccl_gib,
    policy_process_gib,
    sleeping_engine_gib,
    unreleased_generation,
)


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


def step_plan(run: RunPlan) -> StepPlan:
    """The step arithmetic of a run plan."""
    cfg, dims = run.config, run.dims
    samples = cfg.dapo.num_prompts_per_step * cfg.dapo.num_generations_per_prompt
    ds = cfg.dapo.dynamic_sampling
    if not ds.enabled:
        first: int | None = cfg.dapo.num_prompts_per_step
    elif ds.batch_multiplier == "auto":
        first = None
    else:
        first = math.ceil(ds.batch_multiplier * cfg.dapo.num_prompts_per_step)
    return StepPlan(
        samples_per_step=samples,
        optimizer_steps_per_step=samples // cfg.policy.train_global_batch_size,
        micro_batches_per_rank=cfg.policy.train_global_batch_size
        // (cfg.policy.train_micro_batch_size * dims.dp),
        first_round_prompts=first,
        num_engines=run.num_engines,
    )


def _human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def layout(dims: ParallelDims) -> str:
    """The policy layout as dapo-plan prints it: TP PP CP DP, +SP, and EP with its expert
    data-parallel size (the group the experts' optimizer states shard over) when EP > 1."""
    text = f"TP{dims.tp} PP{dims.pp} CP{dims.cp} DP{dims.dp}"
    if dims.ep > 1:
        text += f" EP{dims.ep} (expert DP{dims.dp * dims.cp // dims.ep})"
    return text + (" +SP" if dims.sequence_parallel else "")


def _experts(arch: ModelArch) -> str:
    """The MoE part of the model row; empty for a dense model."""
    if arch.moe is None:
        return ""
    m = arch.moe
    return f", {m.num_experts} experts (top-{m.experts_per_token}, FFN {m.moe_ffn_hidden_size})"


def format_plan(loaded: LoadedConfig) -> str:
    """A short human-readable table of the run's layout."""
    report = loaded.require_plan()
    cfg, dims, arch, plan = report.config, report.dims, report.arch, step_plan(report)
    rows: list[tuple[str, str]] = [("recipe", " <- ".join(reversed(loaded.files)))]
    if arch is not None:
        rows.append(
            (
                "model",
                f"{arch.family}, {arch.num_layers} layers, hidden {arch.hidden_size}, heads "
                f"{arch.num_attention_heads}/{arch.num_query_groups} kv{_experts(arch)}, vocab "
                f"{arch.vocab_size}, {_human_count(arch.num_parameters())} params "
                f"({report.arch_source})",
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
            f"{layout(dims)}, world {dims.world_size}, {cfg.policy.precision}",
        )
    )
    rows.append(
        (
            "generation",
            f"{cfg.generation.backend}: {plan.num_engines} engine(s) x TP"
            f"{cfg.generation.engine.tensor_parallel_size}, response cap "
            f"{cfg.generation.max_response_length} tokens"
            # generation.response_cap: context (NeMo RL's): less for a long prompt.
            + (
                f" (at most {cfg.policy.max_total_sequence_length} - prompt)"
                if cfg.generation.response_cap == "context"
                else ""
            ),
        )
    )
    d = cfg.dapo
    rows.append(
        (
            "step",
            f"{d.num_prompts_per_step} prompts x {d.num_generations_per_prompt} = "
            f"{plan.samples_per_step} samples -> {plan.optimizer_steps_per_step} "
            f"optimizer step(s) of {cfg.policy.train_global_batch_size}, "
            + (
                f"packed micro-batches of <= {cfg.policy.max_tokens_per_microbatch} tokens, "
                f"rows dealt to DP ranks by tokens"
                if cfg.policy.max_tokens_per_microbatch is not None
                else f"{plan.micro_batches_per_rank} micro-batch(es) of "
                f"{cfg.policy.train_micro_batch_size} per DP rank"
            ),
        )
    )
    ds = d.dynamic_sampling
    if ds.enabled:
        first = (
            "set from the keep rate (auto)"
            if plan.first_round_prompts is None
            else f"{plan.first_round_prompts} prompts in round 1"
        )
        limit = (
            "unlimited"
            if ds.max_gen_batches <= 0
            else f"at most {ds.max_gen_batches} full rounds' worth of prompts"
        )
        rows.append(("dyn. sampling", f"{first}, {limit}, surplus {ds.surplus}"))
    else:
        rows.append(("dyn. sampling", "off"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)


def _memory_rows(report: MemoryReport) -> list[tuple[str, tuple[float, ...], str]]:
    """(term, GiB per pipeline stage, what the alternatives of its knob give)."""
    inp, alt = report.inputs, report.alternatives
    dist = "on" if inp.distributed_optimizer else "off"
    other = "off" if inp.distributed_optimizer else "on"
    train, logprob = report.phases[0], report.phases[1]
    swap = alt[f"distributed optimizer {other}"]
    recompute = ", ".join(
        f"{mode} {alt[f'recompute {mode}']:.1f}"
        for mode in ("none", "selective", "full")
        if mode != inp.recompute
    )
    logits_alt = "naive logits" if inp.fused_logits else "fused logits"

    def col(attr: str) -> tuple[float, ...]:
        return tuple(getattr(s, attr) for s in report.stages)

    def flat(value: float) -> tuple[float, ...]:
        return (value,) * len(report.stages)

    ov = inp.overheads
    context = cuda_context_gib(inp)
    in_flight = "/".join(str(s.in_flight) for s in report.stages)
    # Resident in every phase, shown only when the run has them.
    extra: list[tuple[str, tuple[float, ...], str]] = []
    if inp.kl_reference:
        extra.append((f"KL reference ({inp.precision})", col("reference"), "dapo.loss.kl_coef > 0"))
    if any(s.refit_buffer for s in report.stages):
        extra.append(("refit buffer (ipc)", col("refit_buffer"), "kept between refits"))
    moe = _expert_rows(report)
    return [
        (f"weights ({inp.precision})", col("weights"), ""),
        *moe[0],
        (
            "master weights (fp32)",
            col("master"),
            f"distributed optimizer {dist}; train peak with it {other}: {swap:.1f}",
        ),
        *moe[1],
        ("grads (fp32 buffer)", col("grads"), "not sharded over DP"),
        *moe[2],
        (f"optimizer ({inp.optimizer}, fp32)", col("optimizer"), f"distributed optimizer {dist}"),
        *moe[3],
        *extra,
        (
            "activations",
            col("activations"),
            f"recompute {inp.recompute}, {in_flight} micro-batch(es) in flight; "
            f"train peak with recompute {recompute}",
        ),
        *moe[4],
        (
            "logits (train step)",
            col("logits"),
            f"{'fused' if inp.fused_logits else 'naive'}; train peak with "
            f"{logits_alt}: {alt[logits_alt]:.1f}",
        ),
        ("policy CUDA context", flat(context), "outside the allocator (estimate)"),
        (
            "policy NCCL",
            flat(policy_nccl_gib(inp)),
            "communicator buffers (estimate)" if policy_nccl_gib(inp) else "no NCCL peers",
        ),
        ("train workspace", flat(ov.train_workspace_gib), "allocator, workspaces, buffers"),
        (
            "engine CUDA context",
            flat(context if colocated_engine(inp) else 0.0),
            "colocated vLLM worker process" if colocated_engine(inp) else "no colocated engine",
        ),
        ("sleeping engine", flat(sleeping_engine_gib(inp)), "colocated vLLM asleep (level 2)"),
        ("= train peak", train.per_stage, train.verdict),
        (
            "logprob pass",
            col("logprob_pass"),
            "forward only, "
            + (
                f"packed micro-batches of {inp.packed_tokens} tokens"
                if inp.packed_tokens is not None
                else f"{inp.logprob_micro_batch_size} sample(s) per micro-batch"
            ),
        ),
        (
            "= logprob peak",
            logprob.per_stage,
            f"{logprob.verdict} (states + logprob pass + overheads)",
        ),
    ]


Row = tuple[str, tuple[float, ...], str]


def _expert_rows(report: MemoryReport) -> list[list[Row]]:
    """The experts' share of weights, master, grads, optimizer and activations: one
    "of which experts" row under each (MoE only; five empty lists for a dense model)."""
    inp = report.inputs
    moe, dims = inp.arch.moe, inp.dims
    if moe is None:
        return [[] for _ in range(5)]
    local = f"{moe.num_experts // dims.ep} of {moe.num_experts} experts per rank (EP{dims.ep})"
    expert_dp = dims.dp * dims.cp // dims.ep if inp.distributed_optimizer else 1
    sharded = f"sharded over expert DP{expert_dp}"
    notes = (local, sharded, "not sharded over expert DP", sharded)
    rows = [
        [("  of which experts", tuple(s.expert_states[i] for s in report.stages), note)]
        for i, note in enumerate(notes)
    ]
    routed = (
        f"top-{moe.experts_per_token} routed copies of every token through the expert MLPs, "
        "router scores"
    )
    rows.append(
        [("  of which experts", tuple(s.expert_activations for s in report.stages), routed)]
    )
    return rows


def format_memory(report: MemoryReport) -> str:
    """The per-GPU memory table: each term per pipeline stage, the knobs' alternatives,
    the peak of every phase and the verdict."""
    inp = report.inputs
    dims = inp.dims
    header = (
        f"memory per GPU ({inp.gpu_mem_gib:g} GiB as the allocator reports it, safety margin "
        f"{inp.margin:.1f} GiB; {inp.precision}; policy {layout(dims)}, "
        + (
            f"packed, {inp.packed_tokens} tokens per micro-batch"
            if inp.packed_tokens is not None
            else f"{inp.micro_batch_size} x {inp.seq_len} tokens per micro-batch"
        )
        + f"{'' if inp.on_gpu else '; CPU run: informative only'})"
    )
    rows = _memory_rows(report)
    stage_head = [f"stage {s.stage}" for s in report.stages]
    width = max(len(r[0]) for r in rows)
    lines = [header, f"  {'term (GiB)'.ljust(width)}  " + "  ".join(h.rjust(8) for h in stage_head)]
    for name, values, note in rows:
        cells = "  ".join(f"{v:8.2f}" for v in values)
        lines.append(f"  {name.ljust(width)}  {cells}  {note}".rstrip())
    for phase in report.phases[2:]:
        terms = " + ".join(f"{k} {v:.1f}" for k, v in phase.terms)
        lines.append(
            f"  {phase.name} peak {phase.peak:.1f} GiB (stage {phase.stage}: {terms}): "
            f"{phase.verdict}"
        )
    unreleased = unreleased_generation(report)
    if unreleased is not None:
        resident = max(s.resident for s in report.stages) + policy_process_gib(inp)
        kept, peak = unreleased
        lines.append(
            f"  policy while the engine is awake: {resident:.1f} GiB (resident states + "
            f"process) once it returns its cached blocks; without that release it would keep "
            f"its training peak, {kept:.1f} GiB, and generation would need {peak:.1f} GiB"
        )
    e = report.engine
    if e is not None and inp.engine is not None:
        lines.append(
            f"  vLLM engine GPU (TP{inp.engine.tensor_parallel_size}, utilization "
            f"{inp.engine.gpu_memory_utilization}): budget {e.budget:.1f} = weights "
            f"{e.weights:.1f}"
            + (f" (experts {e.expert_weights:.1f}: all of them)" if e.expert_weights else "")
            + f" + runtime/profile {e.overhead:.1f} + KV cache {e.kv_cache:.1f} GiB"
            f" -> {e.kv_tokens:,} tokens ({e.kv_bytes_per_token:,} B each), "
            f"{e.full_sequences} concurrent sequence(s) of {inp.seq_len} tokens"
        )
    else:
        lines.append("  generation: Megatron backend on the policy's weights (not modelled)")
    lines.append(verdict_line(report))
    return "\n".join(lines)


def verdict_line(report: MemoryReport) -> str:
    """The plan's last line: "memory: fits with X GiB margin (...)", "memory: within the
    margin: ..." or "memory: DOES NOT FIT: ..."."""
    if report.fits:
        tight = report.tightest
        return (
            f"memory: fits with {tight.headroom:.1f} GiB margin (tightest phase: {tight.name}, "
            f"{tight.peak:.1f} of {tight.limit:g} GiB; safety margin {report.inputs.margin:.1f} "
            "GiB)"
        )
    if report.within_margin:
        return f"memory: within the margin: {report.reason}"
    return f"memory: DOES NOT FIT: {report.reason}"
