"""``dapo-plan --trace``: the memory plan checked against a trace of the real Megatron step.

Each rank role of a recipe (launch.py) runs the policy worker's code path on a fake CUDA
device in a process of its own (dapo_megatron/megatron/fake_trace/, with the shim of
shim.py preloaded), at the recipe's real shapes and world size, in seconds and without a GPU;
compare.py sets the traced bytes beside the plan's. docs/guides/memory-trace.md says what is
traced, what stands in for the GPU's kernels, and what is not traced.
"""

from __future__ import annotations

from pathlib import Path

from dapo_megatron.planning.memory import MemoryReport
from dapo_megatron.planning.memory_terms import GIB, PRECISION_BYTES
from dapo_megatron.planning.refit_memory import export_only_bytes
from dapo_megatron.planning.trace.compare import PhaseComparison, compare
from dapo_megatron.planning.trace.launch import RoleTrace, roles, trace_role


def trace_micro_batches(report: MemoryReport) -> int:
    """Micro-batches a traced mini-batch share holds: enough for the first stage's 1F1B
    in-flight count (PP) and one more, never more than the recipe's."""
    return max(1, min(report.inputs.micro_batches, report.inputs.dims.pp + 1))


def trace_recipe(
    recipe: Path, overrides: list[str], report: MemoryReport
) -> tuple[list[PhaseComparison], list[RoleTrace]]:
    """Trace every role of the planned recipe and compare; prints progress per role."""
    traces = []
    dims = report.inputs.dims
    for role in roles(dims):
        print(f"tracing {role.name} (rank {role.rank} of {dims.world_size}) ...", flush=True)
        traces.append(
            trace_role(
                recipe,
                overrides,
                role,
                micro_batches=trace_micro_batches(report),
                gpu_bytes=int(report.inputs.gpu_mem_gib * GIB),
            )
        )
    inputs = report.inputs
    export = export_only_bytes(inputs.arch, dims, PRECISION_BYTES[inputs.precision])
    return compare(report.stages, traces, export), traces
