"""Does the main job learn, robustly? The tiny recipe over several seeds, DS on and off.

Runs ``dapo-train --config recipes/dapo-tiny-cpu.yaml`` (or --recipe) once per (seed,
dynamic sampling on/off), one run after the other (each run uses the whole machine), each
in a fresh run directory with its own model (``policy.model_name_or_path`` inside the run
directory: the seed also draws the initial weights), and reads its metrics.jsonl:

  first >= 0.90   the first step whose validation accuracy is >= --threshold
  final acc       mean of the last three validation accuracies (one evaluation's standard
                  error is logged as val/acc_stderr; the mean of three has ~1/sqrt(3) of it)
  samples         samples generated over the run (all dynamic-sampling rounds)
  wall            seconds of the whole command, model creation and SFT warm-up included

Prints a markdown table and the spread over seeds; writes bench/results/learning_cpu.json.

Usage: python bench/learning.py [--seeds 42,1,2] [--modes on,off] [--recipe PATH]
           [--out PATH] [KEY=VALUE overrides for every run ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(recipe: Path, run_dir: Path, seed: int, ds: bool, overrides: list[str]) -> dict:
    cmd = [
        sys.executable, "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config", str(recipe),
        f"run.output_dir={run_dir}",
        f"run.seed={seed}",
        f"policy.model_name_or_path={run_dir / 'model'}",
        f"dapo.dynamic_sampling.enabled={'true' if ds else 'false'}",
        "logger.progress_bar=false",
        *overrides,
    ]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"run failed (seed {seed}, ds {ds}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["val/acc"], r.get("val/acc_stderr")) for r in rows if "val/acc" in r]
    first = next((step for step, acc, _ in evals if acc >= THRESHOLD), None)
    last3 = [acc for _, acc, _ in evals[-3:]]
    stderrs = [se for _, _, se in evals if se is not None]
    return {
        "seed": seed,
        "dynamic_sampling": ds,
        "first_step_at_threshold": first,
        "final_acc": statistics.fmean(last3),
        "last_three_evals": last3,
        "best_acc": max(acc for _, acc, _ in evals),
        "eval_stderr_median": statistics.median(stderrs) if stderrs else None,
        "samples_generated": int(
            sum(r.get("dynamic_sampling/num_samples_generated", 0.0) for r in rows)
        ),
        "wall_s": wall,
        "evals": evals,
    }


THRESHOLD = 0.90


def main(argv: list[str] | None = None) -> int:
    global THRESHOLD
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--modes", default="on,off", help="dynamic sampling: on, off or both")
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "dapo-tiny-cpu.yaml"))
    parser.add_argument("--threshold", type=float, default=0.90)
    parser.add_argument("--out", default=str(REPO / "bench/results/learning_cpu.json"))
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    args = parser.parse_args(argv)
    # A relative --recipe means the caller's directory: runs start in REPO, the JSON says it
    # relative to REPO.
    args.recipe = str(Path(args.recipe).resolve())
    THRESHOLD = args.threshold
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    print(f"| dynamic sampling | seed | first step >= {THRESHOLD:.2f} | final acc (mean of last 3)"
          " | best | samples generated | wall s |")
    print("|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="learning-") as tmp:
        for mode in args.modes.split(","):
            for seed in seeds:
                r = run_once(Path(args.recipe), Path(tmp) / f"{mode}-{seed}", seed,
                             mode == "on", args.overrides)
                results.append(r)
                print(f"| {mode} | {seed} | {r['first_step_at_threshold'] or 'never'} | "
                      f"{r['final_acc']:.3f} | {r['best_acc']:.3f} | {r['samples_generated']} | "
                      f"{r['wall_s']:.0f} |", flush=True)
    summary = {}
    for mode in args.modes.split(","):
        rs = [r for r in results if r["dynamic_sampling"] == (mode == "on")]
        finals = [r["final_acc"] for r in rs]
        summary[mode] = {
            "final_acc_mean": statistics.fmean(finals),
            "final_acc_min": min(finals),
            "final_acc_max": max(finals),
            "seeds_final_at_threshold": sum(f >= THRESHOLD for f in finals),
            "seeds": len(rs),
            "wall_s_max": max(r["wall_s"] for r in rs),
        }
        s = summary[mode]
        print(f"dynamic sampling {mode}: final acc {s['final_acc_mean']:.3f} "
              f"(min {s['final_acc_min']:.3f}, max {s['final_acc_max']:.3f}); "
              f"{s['seeds_final_at_threshold']}/{s['seeds']} seeds end >= {THRESHOLD}; "
              f"slowest run {s['wall_s_max']:.0f} s")
    out = {"recipe": str(Path(args.recipe).relative_to(REPO)), "overrides": args.overrides,
           "threshold": THRESHOLD, "machine_cpus": os.cpu_count(), "runs": results,
           "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
