"""Per-GPU memory model of a DAPO run: does a recipe fit its devices before anything starts?

Pure arithmetic (no torch). The terms of one policy rank and of one engine GPU, with their
formulas (policy states, parameters, activations, logits, the engine's KV cache), are in
memory_terms.py; this module adds them up into the peak of each phase (train, logprob,
generation, refit) on the worst pipeline stage, says which knobs to change when a phase does
not fit, and extracts the model's inputs from a run plan.

Generation (vLLM): colocated, the policy's weights, grads and optimizer stay resident while
the engine is awake (only the engine sleeps), so the generation phase needs resident policy
+ utilisation x GPU memory <= GPU memory. That holds only because the policy ranks return their cached CUDA blocks before an engine maps
its weights or KV cache back (memory_release.py, called by controller/generation_group.py):
PyTorch's caching allocator would otherwise keep the training peak (activations, logits,
workspaces) reserved in the policy process. ``unreleased_generation`` is the generation
peak without that release, which dapo-plan prints next to the modelled one.

Refit (refit_memory.py for the buffers): the policy ranks hold their resident states and
the refit's send buffers; the engine receives into its own buffers with its weights mapped
back and, in the synchronous loop, its KV cache still asleep (else its whole budget).
Colocated, both sides share a GPU: one "refit" phase. Split: "refit" on the policy ranks
and "engine refit" on an engine GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.planning.memory_terms import (
    GIB,
    PRECISION_BYTES,
    RECOMPUTE_MODES,
    EngineInputs,
    EngineMemory,
    MemoryInputs,
    StageMemory,
    engine_memory,
    stage_memory,
)
from dapo_megatron.planning.refit_memory import MIB, RefitInputs, refit_receive_bytes


@dataclass(frozen=True)
class Phase:
    """Peak of one phase on the worst GPU."""

    name: str
    """train | logprob | generation."""
    stage: int
    """Pipeline stage of the peak."""
    terms: tuple[tuple[str, float], ...]
    """(term, GiB) summing to the peak."""
    peak: float
    """GiB."""
    limit: float
    """GiB available."""
    per_stage: tuple[float, ...]
    """The phase's peak on each pipeline stage (GiB); peak is their maximum."""

    @property
    def fits(self) -> bool:
        return self.peak <= self.limit


@dataclass(frozen=True)
class MemoryReport:
    """The memory plan of a run: every term in GiB, the peak per phase, fit and reason."""

    inputs: MemoryInputs
    """What was modelled."""
    stages: tuple[StageMemory, ...]
    """One entry per pipeline stage."""
    engine: EngineMemory | None
    """Generation engine (vLLM only)."""
    phases: tuple[Phase, ...]
    """Peaks of the train, logprob and generation phases."""
    alternatives: dict[str, float]
    """Training-phase peak under each alternative knob setting (GiB)."""
    fits: bool
    """Every phase fits and the KV cache holds a full-length sequence."""
    reason: str
    """Why it does not fit, naming the term and the knobs; empty when it fits."""


# ---------------------------------------------------------------------------------------
# Phases and the report


def _state_terms(s: StageMemory) -> list[tuple[str, float]]:
    """The policy's resident terms (every phase)."""
    return [
        ("weights", s.weights),
        ("master weights", s.master),
        ("grads", s.grads),
        ("optimizer", s.optimizer),
        ("KL reference", s.reference),
        ("refit buffer", s.refit_buffer),
    ]


def sleeping_engine_gib(inputs: MemoryInputs) -> float:
    """What a sleeping vLLM engine keeps on a policy GPU (colocated runs only)."""
    return inputs.overheads.sleeping_engine_gib if inputs.colocated and inputs.engine else 0.0


def unreleased_generation(report: MemoryReport) -> tuple[float, float] | None:
    """Colocated vLLM: (GiB the policy process would keep reserved while the engine is
    awake, the generation peak then) if the policy did NOT return its cached blocks: its
    peak of the train and logprob phases (less the "sleeping engine" term, which is the
    engine's) stays in PyTorch's cache. None without a colocated vLLM engine. The modelled
    generation phase counts the resident states only (memory_release.py)."""
    inp = report.inputs
    if not (inp.colocated and inp.engine is not None):
        return None
    train, logprob = report.phases[0], report.phases[1]
    peaks = zip(train.per_stage, logprob.per_stage, strict=True)
    kept = max(max(pair) - sleeping_engine_gib(inp) for pair in peaks)
    return kept, kept + inp.engine.gpu_memory_utilization * inp.gpu_mem_gib


Terms = list[tuple[str, float]]


def _worst(
    name: str,
    stages: tuple[StageMemory, ...],
    terms_of: Callable[[StageMemory], Terms],
    limit: float,
) -> Phase:
    """The phase on its worst stage, remembering every stage's peak (zero terms dropped)."""
    per_stage = [tuple((k, v) for k, v in terms_of(s) if v > 0) for s in stages]
    totals = tuple(sum(v for _, v in terms) for terms in per_stage)
    k = max(range(len(stages)), key=lambda i: totals[i])
    return Phase(name, stages[k].stage, per_stage[k], totals[k], limit, totals)


def _refit_phases(inputs: MemoryInputs, stages: tuple[StageMemory, ...]) -> list[Phase]:
    """The refit's peaks: policy ranks (send side) and engine GPU (receive side)."""
    refit, ov, mem = inputs.refit, inputs.overheads, inputs.gpu_mem_gib
    if refit is None:
        return []
    engine: Terms = []
    e = engine_memory(inputs)
    if inputs.engine is not None and e is not None:
        receive = refit_receive_bytes(refit, inputs.arch, PRECISION_BYTES[inputs.precision]) / GIB
        if refit.engine_asleep:
            # Level-2 sleep freed weights and KV cache; the refit maps the weights back
            # (vllm_backend._llm_for_refit), the KV cache returns with the next generate.
            engine = [("sleeping engine", ov.sleeping_engine_gib), ("engine weights", e.weights)]
        else:
            engine = [("engine budget", inputs.engine.gpu_memory_utilization * mem)]
        engine.append(("refit receive", receive))

    def policy(s: StageMemory) -> Terms:
        return (
            _state_terms(s)
            + [("policy process", ov.policy_process_gib)]
            + [("refit staging", s.refit_staging), ("refit export", s.refit_export)]
        )

    if inputs.colocated:
        return [_worst("refit", stages, lambda s: policy(s) + engine, mem)]
    phases = [_worst("refit", stages, policy, mem)]
    if engine:  # a Megatron engine's GPU is not modelled
        total = sum(v for _, v in engine)
        terms = tuple((k, v) for k, v in engine if v > 0)
        phases.append(Phase("engine refit", 0, terms, total, mem, (total,)))
    return phases


def _phases(inputs: MemoryInputs, stages: tuple[StageMemory, ...]) -> tuple[Phase, ...]:
    ov, mem = inputs.overheads, inputs.gpu_mem_gib
    sleeping = sleeping_engine_gib(inputs)

    def worst(name: str, terms_of: Callable[[StageMemory], Terms]) -> Phase:
        return _worst(name, stages, terms_of, mem)

    common = [("policy process", ov.policy_process_gib), ("sleeping engine", sleeping)]
    train = worst(
        "train",
        lambda s: (
            _state_terms(s)
            + [("activations", s.activations), ("logits", s.logits)]
            + common
            + [("train workspace", ov.train_workspace_gib)]
        ),
    )
    logprob = worst(
        "logprob",
        lambda s: (
            _state_terms(s)
            + [("logprob pass", s.logprob_pass)]
            + common
            + [("train workspace", ov.train_workspace_gib)]
        ),
    )
    phases = [train, logprob]
    if inputs.engine is not None:
        util = inputs.engine.gpu_memory_utilization * mem
        if inputs.colocated:
            phases.append(
                worst(
                    "generation",
                    lambda s: (
                        _state_terms(s)
                        + [("policy process", ov.policy_process_gib), ("engine budget", util)]
                    ),
                )
            )
        else:
            phases.append(Phase("generation", 0, (("engine budget", util),), util, mem, (util,)))
    return tuple(phases + _refit_phases(inputs, stages))


_LAYOUT = "policy.megatron.tensor_model_parallel_size, policy.megatron.pipeline_model_parallel_size"
_SHARDED = "more data-parallel ranks (cluster.num_nodes), " + _LAYOUT
_KNOBS = {
    "activations": "policy.megatron.recompute_granularity, policy.train_micro_batch_size, "
    "policy.megatron.context_parallel_size, policy.megatron.sequence_parallel, " + _LAYOUT,
    "optimizer": _SHARDED,
    "master weights": _SHARDED,
    "grads": _LAYOUT + " (the grad buffer is not sharded over DP)",
    "weights": _LAYOUT,
    "logits": "policy.train_micro_batch_size, policy.megatron.context_parallel_size, "
    "policy.megatron.tensor_model_parallel_size",
    "logprob pass": "policy.logprob_micro_batch_size, policy.megatron.context_parallel_size",
    "engine budget": "generation.engine.gpu_memory_utilization (lower), or shrink the "
    "resident policy: " + _LAYOUT,
    "KL reference": "dapo.loss.kl_coef=0 (no reference), or "
    + _LAYOUT
    + " (the reference is not sharded over DP)",
    "engine weights": "generation.engine.tensor_parallel_size",
    # Every refit buffer is sized by the bucket (or the largest tensor, which travels alone).
    **dict.fromkeys(
        ("refit buffer", "refit staging", "refit export", "refit receive"),
        "generation.refit_bucket_mb (lower; a larger tensor still travels alone), "
        "generation.refit_transport",
    ),
}


_EXPERT_TERMS = ("weights", "master weights", "grads", "optimizer", "activations", "KL reference")
"""Terms a MoE's experts take part in, which expert parallelism divides."""


def _reason(inputs: MemoryInputs, phase: Phase) -> str:
    """The failure message of a phase: its peak, the largest term and the knobs."""
    fixed = {"policy process", "sleeping engine", "train workspace"}
    term, size = max(((k, v) for k, v in phase.terms if k not in fixed), key=lambda kv: kv[1])
    knobs = _KNOBS.get(term, _LAYOUT)
    if term in ("optimizer", "master weights") and not inputs.distributed_optimizer:
        knobs = "policy.megatron.use_distributed_optimizer=true, " + knobs
    if inputs.arch.moe is not None and term in _EXPERT_TERMS:
        # The experts are most of a MoE's states and its routed activations: EP splits them.
        knobs += ", policy.megatron.expert_model_parallel_size (higher)"
    # Every term, not only the largest: a small one (a KL reference, a refit buffer)
    # that tips a phase over must be visible in the message.
    terms = " + ".join(f"{k} {v:.1f}" for k, v in phase.terms)
    return (
        f"{phase.name} phase needs {phase.peak:.1f} GiB > {phase.limit:.1f} GiB per GPU "
        f"(pipeline stage {phase.stage}: {terms}); largest term: {term} {size:.1f} GiB; "
        f"change {knobs}"
    )


def _kv_reason(inputs: MemoryInputs, engine: EngineMemory) -> str:
    return (
        f"generation: the KV cache of an engine GPU holds {engine.kv_tokens} tokens "
        f"({engine.kv_cache:.1f} GiB of a {engine.budget:.1f} GiB budget after "
        f"{engine.weights:.1f} GiB of weights), less than one sequence of "
        f"policy.max_total_sequence_length = {inputs.seq_len}; raise "
        f"generation.engine.gpu_memory_utilization or generation.engine.tensor_parallel_size"
    )


def _core(inputs: MemoryInputs) -> tuple[tuple[StageMemory, ...], tuple[Phase, ...]]:
    stages = tuple(stage_memory(inputs, k) for k in range(inputs.dims.pp))
    return stages, _phases(inputs, stages)


def _alternatives(inputs: MemoryInputs) -> dict[str, float]:
    """Training-phase peak under each alternative of the memory knobs."""
    replace = dataclasses.replace
    variants = {f"recompute {mode}": replace(inputs, recompute=mode) for mode in RECOMPUTE_MODES}
    variants["distributed optimizer on"] = replace(inputs, distributed_optimizer=True)
    variants["distributed optimizer off"] = replace(inputs, distributed_optimizer=False)
    variants["naive logits"] = replace(inputs, fused_logits=False)
    variants["fused logits"] = replace(inputs, fused_logits=True)
    return {name: _core(variant)[1][0].peak for name, variant in variants.items()}


def plan_memory(inputs: MemoryInputs) -> MemoryReport:
    """The memory report of a run (memory_terms.py's docstring has every formula)."""
    stages, phases = _core(inputs)
    engine = engine_memory(inputs)
    failing = [ph for ph in phases if not ph.fits]
    reasons = [_reason(inputs, failing[0])] if failing else []
    if len(failing) > 1:
        reasons.append(
            "also over: " + ", ".join(f"{ph.name} {ph.peak:.1f} GiB" for ph in failing[1:])
        )
    if engine is not None and engine.full_sequences < 1:
        reasons.append(_kv_reason(inputs, engine))
    return MemoryReport(
        inputs=inputs,
        stages=stages,
        engine=engine,
        phases=phases,
        alternatives=_alternatives(inputs),
        fits=not reasons,
        reason="; ".join(reasons),
    )


def _train_micro_batches(cfg: DapoMegatronConfig, dp: int) -> int:
    """Training micro-batches per DP rank per mini-batch; packed: the most packs its rows
    can need (every row at the full sequence length)."""
    p = cfg.policy
    rows = max(1, p.train_global_batch_size // dp)
    if p.max_tokens_per_microbatch is not None:
        per_pack = max(1, p.max_tokens_per_microbatch // p.max_total_sequence_length)
        return -(-rows // per_pack)
    return max(1, rows // p.train_micro_batch_size)


def _refit_inputs(run: RunPlan) -> RefitInputs | None:
    """The refit's buffers as the controller sizes them (refitter.Refitter.join
    and _share_buffers); None when no bucket moves."""
    cfg = run.config
    if not run.needs_engine_workers or run.refit_transport == "object_store":
        return None
    vllm = cfg.generation.backend == "vllm"
    # Weight-group members per engine: its vLLM workers (TP ranks), one for Megatron.
    engine_workers = run.num_engines * (cfg.generation.engine.tensor_parallel_size if vllm else 1)
    ipc = run.refit_transport == "ipc"
    return RefitInputs(
        transport="ipc" if ipc else "broadcast",
        bucket_bytes=max(1, int(cfg.generation.refit_bucket_mb * MIB)),
        exporters=min(run.dims.world_size, engine_workers) if ipc else 1,
        engine_asleep=vllm and not run.overlapped,  # rollout_source.SyncRollouts.take
    )


def memory_inputs(run: RunPlan, gpu_mem_gib: float) -> MemoryInputs:
    """The memory model's inputs from a run plan with a known architecture."""
    cfg, dims = run.config, run.dims
    p, engine = cfg.policy, cfg.generation.engine
    vllm = cfg.generation.backend == "vllm"
    return MemoryInputs(
        arch=run.require_arch(),
        dims=dims,
        precision=p.precision,
        optimizer=p.optimizer.name,
        distributed_optimizer=p.megatron.use_distributed_optimizer,
        recompute=p.megatron.recompute_granularity,
        micro_batch_size=p.train_micro_batch_size,
        logprob_micro_batch_size=p.logprob_micro_batch_size,
        seq_len=p.max_total_sequence_length,
        micro_batches=_train_micro_batches(cfg, dims.dp),
        gpu_mem_gib=gpu_mem_gib,
        on_gpu=cfg.cluster.device != "cpu",
        colocated=cfg.cluster.colocated,
        packed_tokens=p.max_tokens_per_microbatch,
        kl_reference=cfg.dapo.loss.kl_coef > 0,
        refit=_refit_inputs(run),
        engine=EngineInputs(
            tensor_parallel_size=engine.tensor_parallel_size,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            max_num_seqs=engine.max_num_seqs,
            enforce_eager=engine.enforce_eager,
        )
        if vllm
        else None,
    )
