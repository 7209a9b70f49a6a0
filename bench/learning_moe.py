"""Does the tiny MoE job learn like the main job? recipes/dapo-tiny-moe-cpu.yaml over seeds.

The runs are bench/learning.py's (one fresh run directory and model per seed, one after the
other, dynamic sampling as the recipe has it); this adds what a learning claim over seeds
needs: the spread of the final accuracies (min, max, sample standard deviation) and the
standard error of ONE evaluation (binomial over the held-out problems, val/acc_stderr of
the last evaluation), so that seed-to-seed differences can be told from evaluation noise.

  final acc   mean of the last three validation accuracies (as bench/learning.py)
  curve       every evaluation: [step, greedy accuracy, its standard error]
  wall        seconds of the whole command, model creation and SFT warm-up included

Usage: python bench/learning_moe.py [--seeds 42,1,2] [--out PATH] [KEY=VALUE ...]
Writes bench/results/learning_tiny_moe_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning  # noqa: E402  (bench/ is scripts, not a package)

REPO = learning.REPO
RECIPE = REPO / "recipes" / "dapo-tiny-moe-cpu.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--out", default=str(REPO / "bench/results/learning_tiny_moe_cpu.json"))
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    args = parser.parse_args(argv)
    recipe = Path(args.recipe).resolve()
    runs = []
    print(
        "| seed | first step >= 0.90 | final acc (mean of last 3) | last eval +- stderr | wall s |"
    )
    print("|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="learning-moe-") as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            # ds=True: the recipe's own setting (dynamic sampling on, as the main job).
            r = learning.run_once(recipe, Path(tmp) / str(seed), seed, True, args.overrides)
            _, last_acc, last_se = r["evals"][-1]
            r["final_eval_acc"], r["final_eval_stderr"] = last_acc, last_se
            runs.append(r)
            print(
                f"| {seed} | {r['first_step_at_threshold'] or 'never'} | {r['final_acc']:.3f} | "
                f"{last_acc:.3f} +- {last_se:.3f} | {r['wall_s']:.0f} |",
                flush=True,
            )
    finals = [r["final_acc"] for r in runs]
    summary = {
        "final_acc_mean": statistics.fmean(finals),
        "final_acc_min": min(finals),
        "final_acc_max": max(finals),
        "final_acc_spread": max(finals) - min(finals),
        "final_acc_stdev_over_seeds": statistics.stdev(finals) if len(finals) > 1 else None,
        # One evaluation of 400 held-out problems at the runs' final accuracies; the mean of
        # three evaluations of one run has at most this (they share the problems).
        "one_eval_stderr_median": statistics.median(r["final_eval_stderr"] for r in runs),
        "seeds_final_at_0.90": sum(f >= 0.90 for f in finals),
        "seeds": len(runs),
        "wall_s_max": max(r["wall_s"] for r in runs),
    }
    print(
        f"final acc {summary['final_acc_mean']:.3f} (min {summary['final_acc_min']:.3f}, max "
        f"{summary['final_acc_max']:.3f}, stdev over seeds "
        f"{summary['final_acc_stdev_over_seeds'] or 0:.3f}); one evaluation's stderr "
        f"{summary['one_eval_stderr_median']:.3f}; slowest run {summary['wall_s_max']:.0f} s"
    )
    out = {
        "recipe": str(recipe.relative_to(REPO)),
        "overrides": args.overrides,
        "machine_cpus": os.cpu_count(),
        "runs": runs,
        "summary": summary,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
