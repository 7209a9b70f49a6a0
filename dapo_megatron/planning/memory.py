"""Per-GPU memory model of a DAPO run: does a recipe fit its devices before anything starts?

Pure arithmetic (no torch). The terms of one policy rank and of one engine GPU, with their
formulas (policy states, parameters, activations, logits, the engine's KV cache), are in
memory_terms.py; this module adds them up into the peak of each phase (train, logprob,
engine start, generation, refit) on the worst pipeline stage, says which knobs to change
when a phase does not fit, and extracts the model's inputs from a run plan.

Capacity and margin (capacity.py): the GPU is what its allocator reports
(torch.cuda.mem_get_info's total: ~79.2 GiB for an "80 GB" H100), and a phase fits only
when its peak leaves the safety margin free: peak <= capacity - margin (default max(5 %
of the card, 2 GiB)). A peak between the two is "within the margin": it does not fit.

Outside the allocator, each phase counts explicitly (memory_terms.Overheads): the policy
process's CUDA context and NCCL buffers (none in a one-GPU world), and, colocated, the
engine worker process's CUDA context in every phase (asleep, plus what a sleeping engine
keeps). vLLM creates its context before it takes its start-up snapshot, so the context
sits outside its gpu_memory_utilization budget; the engine's own runtime is inside it.

Engine start (colocated vLLM): vLLM refuses to start unless gpu_memory_utilization x the
GPU's total is free. At that moment (controller/loop.py start_workers) the policy holds
its weights, its DDP grad buffer and the optimizer's fp32 main params (and a KL reference),
not yet Adam's states, which the first optimizer step creates, nor the ipc refit buffer.
Split, an engine GPU holds only its own context: the start-up check is the generation
phase's sum.

Generation (vLLM): colocated, the policy's weights, grads and optimizer stay resident while
the engine is awake (only the engine sleeps), and the engine maps back on every wake-up
the KV cache it sized at start, when Adam's states did not exist yet: the generation phase
counts them. It needs resident policy + both processes + utilisation x GPU memory <=
capacity - margin. That holds only because the policy ranks return their cached CUDA
blocks before an engine maps its weights or KV cache back (memory_release.py, called by
controller/actors/generation_group.py): PyTorch's caching allocator would otherwise keep the
training peak (activations, logits, workspaces) reserved in the policy process.
``unreleased_generation`` is the generation peak without that release, which dapo-plan
prints next to the modelled one.

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
    margin: float = 0.0
    """Safety margin (GiB) the peak must leave free below ``limit`` (capacity.py)."""

    @property
    def headroom(self) -> float:
        """GiB the peak leaves free on the GPU."""
        return self.limit - self.peak

    @property
    def fits(self) -> bool:
        """The peak leaves at least the safety margin free."""
        return self.peak <= self.limit - self.margin

    @property
    def over(self) -> bool:
        """The peak exceeds the GPU itself (not only the margin)."""
        return self.peak > self.limit

    @property
    def verdict(self) -> str:
        """ "fits with X GiB margin", "within the M GiB margin (X GiB left)" or "DOES NOT FIT"."""
        if self.fits:
            return f"fits with {self.headroom:.1f} GiB margin"
        if not self.over:
            return f"within the {self.margin:.1f} GiB margin ({self.headroom:.1f} GiB left)"
        return f"DOES NOT FIT in {self.limit:g} GiB"


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
    """Every phase leaves the safety margin free and the KV cache holds a full-length
    sequence."""
    reason: str
    """Why it does not fit, naming the term and the knobs; empty when it fits."""
    within_margin: bool = False
    """It does not fit only because a phase eats into the safety margin (every peak is
    below the GPU's capacity itself)."""

    @property
    def tightest(self) -> Phase:
        """The phase leaving the least memory free."""
        return min(self.phases, key=lambda ph: ph.headroom)


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


def colocated_engine(inputs: MemoryInputs) -> bool:
    """A vLLM engine shares the policy's GPUs (its process is there in every phase)."""
    return inputs.colocated and inputs.engine is not None


def sleeping_engine_gib(inputs: MemoryInputs) -> float:
    """What a sleeping vLLM engine keeps on a policy GPU besides its CUDA context
    (colocated runs only)."""
    return inputs.overheads.sleeping_engine_gib if colocated_engine(inputs) else 0.0


def cuda_context_gib(inputs: MemoryInputs) -> float:
    """One process's CUDA context; none on a CPU run (no CUDA, gloo instead of NCCL)."""
    return inputs.overheads.cuda_context_gib if inputs.on_gpu else 0.0


def policy_nccl_gib(inputs: MemoryInputs) -> float:
    """NCCL buffers of the policy process: none without peers (a one-GPU world) or on CPU."""
    return inputs.overheads.nccl_gib if inputs.on_gpu and inputs.dims.world_size > 1 else 0.0


def policy_process_gib(inputs: MemoryInputs) -> float:
    """Outside the allocator in the policy process: its CUDA context and NCCL buffers."""
    return cuda_context_gib(inputs) + policy_nccl_gib(inputs)


def _policy_process(inputs: MemoryInputs) -> Terms:
    return [
        ("policy CUDA context", cuda_context_gib(inputs)),
        ("policy NCCL", policy_nccl_gib(inputs)),
    ]


def _engine_context(inputs: MemoryInputs) -> Terms:
    """The engine worker process's CUDA context on its GPU: one worker per GPU (an
    engine's TP ranks sit on distinct GPUs). Created before vLLM's start-up snapshot, so
    outside its gpu_memory_utilization budget."""
    return [("engine CUDA context", cuda_context_gib(inputs))]


def unreleased_generation(report: MemoryReport) -> tuple[float, float] | None:
    """Colocated vLLM: (GiB the policy process would keep reserved while the engine is
    awake, the generation peak then) if the policy did NOT return its cached blocks: its
    peak of the train and logprob phases (less the sleeping engine's terms, which are the
    engine's) stays in PyTorch's cache. None without a colocated vLLM engine. The modelled
    generation phase counts the resident states only (memory_release.py)."""
    inp = report.inputs
    if not colocated_engine(inp) or inp.engine is None:
        return None
    train, logprob = report.phases[0], report.phases[1]
    peaks = zip(train.per_stage, logprob.per_stage, strict=True)
    engine_process = cuda_context_gib(inp)
    kept = max(max(pair) - sleeping_engine_gib(inp) - engine_process for pair in peaks)
    return kept, kept + engine_process + inp.engine.gpu_memory_utilization * inp.gpu_mem_gib


Terms = list[tuple[str, float]]


def _worst(
    name: str,
    stages: tuple[StageMemory, ...],
    terms_of: Callable[[StageMemory], Terms],
    inputs: MemoryInputs,
) -> Phase:
    """The phase on its worst stage, remembering every stage's peak (zero terms dropped)."""
    per_stage = [tuple((k, v) for k, v in terms_of(s) if v > 0) for s in stages]
    totals = tuple(sum(v for _, v in terms) for terms in per_stage)
    k = max(range(len(stages)), key=lambda i: totals[i])
    return Phase(
        name, stages[k].stage, per_stage[k], totals[k], inputs.gpu_mem_gib, totals, inputs.margin
    )


def _engine_gpu_phase(name: str, inputs: MemoryInputs, terms: Terms) -> Phase:
    """A phase of a split engine's own GPU (no policy rank on it)."""
    total = sum(v for _, v in terms)
    kept = tuple((k, v) for k, v in terms if v > 0)
    return Phase(name, 0, kept, total, inputs.gpu_mem_gib, (total,), inputs.margin)


def _refit_phases(inputs: MemoryInputs, stages: tuple[StageMemory, ...]) -> list[Phase]:
    """The refit's peaks: policy ranks (send side) and engine GPU (receive side)."""
    refit, ov, mem = inputs.refit, inputs.overheads, inputs.gpu_mem_gib
    if refit is None:
        return []
    engine: Terms = []
    e = engine_memory(inputs)
    if inputs.engine is not None and e is not None:
        receive = refit_receive_bytes(refit, inputs.arch, PRECISION_BYTES[inputs.precision]) / GIB
        engine = _engine_context(inputs)
        if refit.engine_asleep:
            # Level-2 sleep freed weights and KV cache; the refit maps the weights back
            # (vllm_backend._llm_for_refit), the KV cache returns with the next generate.
            engine += [("sleeping engine", ov.sleeping_engine_gib), ("engine weights", e.weights)]
        else:
            engine += [("engine budget", inputs.engine.gpu_memory_utilization * mem)]
        engine.append(("refit receive", receive))

    def policy(s: StageMemory) -> Terms:
        return (
            _state_terms(s)
            + _policy_process(inputs)
            + [("refit staging", s.refit_staging), ("refit export", s.refit_export)]
        )

    if inputs.colocated:
        return [_worst("refit", stages, lambda s: policy(s) + engine, inputs)]
    phases = [_worst("refit", stages, policy, inputs)]
    if engine:  # a Megatron engine's GPU is not modelled
        phases.append(_engine_gpu_phase("engine refit", inputs, engine))
    return phases


def _start_terms(s: StageMemory) -> Terms:
    """What the policy holds when a colocated engine starts (controller/loop.py
    start_workers: the policy is built, then its engines; a resume loads its checkpoint
    only afterwards): weights, the DDP grad buffer, the optimizer's fp32 main params and a
    KL reference, all allocated when the model and optimizer are built. Not yet the Adam
    states (created at the first optimizer step, or loaded by a resume) nor the ipc refit
    buffer (created by the first refit)."""
    return [
        ("weights", s.weights),
        ("master weights", s.master),
        ("grads", s.grads),
        ("KL reference", s.reference),
    ]


def _generation_phases(inputs: MemoryInputs, stages: tuple[StageMemory, ...]) -> list[Phase]:
    """ "engine start" (colocated: vLLM's start-up check) and "generation"."""
    if inputs.engine is None:
        return []
    # vLLM asks for gpu_memory_utilization x the total the device reports, and refuses to
    # start when less than that is free: everything else on the GPU at that moment, its
    # own CUDA context included (created before the snapshot), must leave room for it.
    util = inputs.engine.gpu_memory_utilization * inputs.gpu_mem_gib
    budget: Terms = [("engine budget", util)]
    engine = _engine_context(inputs) + budget
    if not inputs.colocated:
        # Alone on its GPU: the start-up check and the generation phase are the same sum.
        return [_engine_gpu_phase("generation", inputs, engine)]
    start = _worst(
        "engine start", stages, lambda s: _start_terms(s) + _policy_process(inputs) + engine, inputs
    )
    # The engine sized its KV cache at start; it maps the same cache back on every wake-up.
    # By then the policy holds its Adam states (created at the first optimizer step, after
    # the engine's start-up check) and the ipc refit buffer: the generation phase counts
    # every resident state.
    generation = _worst(
        "generation", stages, lambda s: _state_terms(s) + _policy_process(inputs) + engine, inputs
    )
    return [start, generation]


def _phases(inputs: MemoryInputs, stages: tuple[StageMemory, ...]) -> tuple[Phase, ...]:
    ov = inputs.overheads
    # Colocated, the sleeping engine's process stays on the GPU while the policy trains.
    asleep: Terms = (
        _engine_context(inputs) + [("sleeping engine", ov.sleeping_engine_gib)]
        if colocated_engine(inputs)
        else []
    )
    common = _policy_process(inputs) + asleep + [("train workspace", ov.train_workspace_gib)]
    train = _worst(
        "train",
        stages,
        lambda s: _state_terms(s) + [("activations", s.activations), ("logits", s.logits)] + common,
        inputs,
    )
    logprob = _worst(
        "logprob",
        stages,
        lambda s: _state_terms(s) + [("logprob pass", s.logprob_pass)] + common,
        inputs,
    )
    phases = [train, logprob, *_generation_phases(inputs, stages)]
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
    fixed = {
        "policy CUDA context",
        "policy NCCL",
        "engine CUDA context",
        "sleeping engine",
        "train workspace",
    }
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
    if phase.over:
        needs = f"needs {phase.peak:.1f} GiB > {phase.limit:g} GiB per GPU"
    else:
        needs = (
            f"needs {phase.peak:.1f} GiB, within the {phase.margin:.1f} GiB safety margin of "
            f"{phase.limit:g} GiB per GPU (only {phase.headroom:.1f} GiB left)"
        )
    if phase.name == "engine start":
        needs += (
            "; vLLM refuses to start unless gpu_memory_utilization x the GPU's total is free "
            "next to the policy's weights, grads and fp32 main params"
        )
    return (
        f"{phase.name} phase {needs} (pipeline stage {phase.stage}: {terms}); largest term: "
        f"{term} {size:.1f} GiB; change {knobs}"
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
            "also over the margin: "
            + ", ".join(f"{ph.name} {ph.peak:.1f} GiB" for ph in failing[1:])
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
        within_margin=bool(failing)
        and not any(ph.over for ph in failing)
        and (engine is None or engine.full_sequences >= 1),
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
    transport = run.refit_transport
    if not run.needs_engine_workers or not transport.needs_group():
        return None
    vllm = cfg.generation.backend == "vllm"
    # Weight-group members per engine: its vLLM workers (TP ranks), one for Megatron.
    engine_workers = run.num_engines * (cfg.generation.engine.tensor_parallel_size if vllm else 1)
    return RefitInputs(
        transport=transport,
        bucket_bytes=max(1, int(cfg.generation.refit_bucket_mb * MIB)),
        exporters=transport.bucket_exporters(run.dims.world_size, engine_workers),
        engine_asleep=vllm and not run.overlapped,  # rollout_source.SyncRollouts.take
    )


def memory_inputs(
    run: RunPlan, gpu_mem_gib: float, margin_gib: float | None = None
) -> MemoryInputs:
    """The memory model's inputs from a run plan with a known architecture, planned for a
    GPU whose allocator reports `gpu_mem_gib` (capacity.py), keeping `margin_gib` free
    (None: capacity.default_margin_gib)."""
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
        margin_gib=margin_gib,
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
