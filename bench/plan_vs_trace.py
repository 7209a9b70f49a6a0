"""The memory plan against the trace for every GPU recipe: bench/results/plan_vs_trace.json.

    python bench/plan_vs_trace.py [RECIPE ...]      # default: every non-CPU recipe

Per recipe, rank role (one rank per pipeline stage) and phase (train, logprob): the plan's
tensor terms (planned_gib), the traced peak (traced_gib), their ratio (planned / traced),
both by category, and the phase's trace time. The baseline is measured in the same run: the
plan is computed by dapo-plan's model from the same recipe. Prints one line per role and
phase, and the worst ratio. Exit status 1 when a role cannot be traced or a ratio is outside
0.9-1.1 (MoE recipes are reported as not traced and do not fail the run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dapo_megatron.config.loader import load_config
from dapo_megatron.planning.capacity import DEFAULT_GPU_MEM_GIB
from dapo_megatron.planning.memory import memory_inputs, plan_memory
from dapo_megatron.planning.trace import trace_recipe

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "plan_vs_trace.json"


def gpu_recipes() -> list[Path]:
    return sorted(p for p in (ROOT / "recipes").glob("*.yaml") if "cpu" not in p.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    results: dict[str, dict[str, dict[str, object]]] = {}
    failed = 0
    worst = (0.0, "")
    for recipe in args.recipes or gpu_recipes():
        run = load_config(recipe, []).require_plan()
        report = plan_memory(memory_inputs(run, DEFAULT_GPU_MEM_GIB))
        t0 = time.perf_counter()
        rows, traces = trace_recipe(recipe, [], report)
        name = recipe.stem
        for trace in traces:
            if trace.error is not None:
                print(f"{name:<44} {trace.role.name:<22} {trace.error}")
                failed += report.inputs.arch.moe is None
        for row in rows:
            results.setdefault(name, {}).setdefault(row.role, {})[row.phase] = row.as_json()
            off = abs(row.ratio - 1)
            if off > worst[0]:
                worst = (off, f"{name} {row.role} {row.phase}")
            print(
                f"{name:<44} {row.role:<22} {row.phase:<8} planned {row.planned_gib:7.2f}"
                f"  traced {row.traced_gib:7.2f}  ratio {row.ratio:.3f}  {row.trace_s:5.1f} s"
            )
        print(f"{name}: {len(traces)} role(s) in {time.perf_counter() - t0:.1f} s", flush=True)
        failed += sum(not r.agrees for r in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"worst |ratio - 1|: {worst[0]:.3f} ({worst[1]}); wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
