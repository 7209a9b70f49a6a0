"""The memory plan beside the trace: per rank role and phase, GiB by category, and the verdict.

Compared are the tensor terms both sides have: the rank's states (weights, fp32 master
weights, the fp32 grad buffer, optimizer states, a KL reference) and what a phase adds on top
(``activations``: saved activations, the backward's working set, the logprob head; for the
refit's export, the gathered HF tensors it holds at once). Not
compared, because the trace has no such tensors: the CUDA context, NCCL buffers, kernel
workspaces and the caching allocator's slack (the plan's budgeted overheads), the refit
buffers, and the vLLM engine (generation is not traced).

``ratio`` is planned / traced: below 1 the plan under-counts. A phase agrees when its ratio
is within ``TOLERANCE`` of 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo_megatron.planning.memory_terms import GIB, StageMemory
from dapo_megatron.planning.trace.launch import RoleTrace

TOLERANCE = 0.10
"""A phase's plan agrees with its trace when |planned / traced - 1| <= this."""

STATE_CATEGORIES = ("weights", "master", "grads", "optimizer", "reference")
PHASES = ("train", "logprob", "export")
NOT_TRACED = (
    "not traced: the vLLM generation phase and engine start, the refit's bucket buffers "
    "(export: the gathers only), and what "
    "lies outside PyTorch's tensors (CUDA contexts, NCCL buffers, kernel workspaces: the "
    "plan's budgeted overheads)"
)


@dataclass(frozen=True)
class PhaseComparison:
    """One rank role's phase, planned beside traced."""

    role: str
    """Rank role ("stage 0", ...)."""
    phase: str
    """train | logprob."""
    planned: dict[str, float]
    """Category -> GiB in the memory plan."""
    traced: dict[str, float]
    """Category -> GiB at the traced peak."""
    trace_s: float
    """Wall time of the traced phase."""

    @property
    def planned_gib(self) -> float:
        return sum(self.planned.values())

    @property
    def traced_gib(self) -> float:
        return sum(self.traced.values())

    @property
    def ratio(self) -> float:
        return self.planned_gib / self.traced_gib if self.traced_gib else float("inf")

    @property
    def agrees(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE

    def as_json(self) -> dict[str, object]:
        """The keys of bench/results/plan_vs_trace.json."""
        cats = sorted(set(self.planned) | set(self.traced))
        return {
            "planned_gib": round(self.planned_gib, 3),
            "traced_gib": round(self.traced_gib, 3),
            "ratio": round(self.ratio, 4),
            "categories": {
                c: {
                    "planned_gib": round(self.planned.get(c, 0.0), 3),
                    "traced_gib": round(self.traced.get(c, 0.0), 3),
                }
                for c in cats
            },
            "trace_s": self.trace_s,
        }


def planned_categories(
    stage: StageMemory, phase: str, export_bytes: float = 0.0
) -> dict[str, float]:
    """The plan's tensor terms of a phase on a stage's rank, in the trace's categories;
    ``export_bytes``: what the refit's export holds at once on a rank that collects no
    bucket (refit_memory.export_only_bytes)."""
    states = {
        "weights": stage.weights,
        "master": stage.master,
        "grads": stage.grads,
        "optimizer": stage.optimizer,
        "reference": stage.reference,
    }
    if phase == "train":
        added = stage.activations + stage.logits
    elif phase == "logprob":
        added = stage.logprob_pass
    elif phase == "export":
        added = export_bytes / GIB
    else:
        raise ValueError(f"phase {phase!r}: expected one of {PHASES}")
    return {k: v for k, v in {**states, "activations": added}.items() if v}


def traced_categories(trace: RoleTrace, phase: str) -> dict[str, float]:
    """GiB by category at a phase's traced peak; what the rank built and owns nothing of
    (Megatron's persistent buffers) counts as activations."""
    cats = trace.phases[phase]["categories"]
    out: dict[str, float] = {}
    for name, n_bytes in cats.items():
        key = name if name in STATE_CATEGORIES else "activations"
        out[key] = out.get(key, 0.0) + n_bytes / GIB
    return {k: v for k, v in out.items() if v}


def compare(
    stages: tuple[StageMemory, ...], traces: list[RoleTrace], export_bytes: float
) -> list[PhaseComparison]:
    """Every traced role and phase beside its plan (failed traces are left out)."""
    out = []
    for trace in traces:
        if trace.error is not None:
            continue
        stage = stages[trace.role.stage]
        for phase in PHASES:
            out.append(
                PhaseComparison(
                    role=trace.role.name,
                    phase=phase,
                    planned=planned_categories(stage, phase, export_bytes),
                    traced=traced_categories(trace, phase),
                    trace_s=float(trace.phases[phase]["trace_s"]),
                )
            )
    return out


def format_comparison(rows: list[PhaseComparison], traces: list[RoleTrace]) -> str:
    """The side-by-side table dapo-plan --trace prints, with the verdict."""
    lines = ["memory plan vs trace (one rank per role, fake CUDA tensors; GiB, planned / traced)"]
    for trace in traces:
        if trace.error is not None:
            lines.append(f"  {trace.role.name}: trace failed: {trace.error}")
        else:
            lines.append(
                f"  {trace.role.name}: rank {trace.role.rank}, traced in {trace.wall_s:.1f} s"
            )
    for row in rows:
        cats = "  ".join(
            f"{c} {row.planned.get(c, 0):.2f}/{row.traced.get(c, 0):.2f}"
            for c in sorted(set(row.planned) | set(row.traced))
        )
        mark = "ok" if row.agrees else "DIFFERS"
        lines.append(
            f"  {row.role:<22} {row.phase:<8} {row.planned_gib:7.2f} / {row.traced_gib:7.2f}"
            f"  ratio {row.ratio:.3f} {mark}   {cats}"
        )
    lines.append(f"  {NOT_TRACED}")
    failed = [t for t in traces if t.error is not None]
    off = [r for r in rows if not r.agrees]
    if failed:
        verdict = (
            f"trace: {len(failed)} role(s) could not be traced; the plan above is unchecked there"
        )
    elif off:
        worst = max(off, key=lambda r: abs(r.ratio - 1))
        verdict = (
            f"trace: the plan differs from the trace by more than {TOLERANCE:.0%} "
            f"({worst.role} {worst.phase}: planned {worst.planned_gib:.2f}, traced "
            f"{worst.traced_gib:.2f} GiB): its 'fits' is not backed by the trace"
        )
    else:
        verdict = f"trace: every role and phase within {TOLERANCE:.0%} of the plan"
    lines.append(verdict)
    return "\n".join(lines)
