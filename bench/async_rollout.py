"""Overlapped rollouts: trained samples per second at rollout.max_staleness K = 0, 1, 2.

Split mode on this machine: the tiny recipe with one policy rank (one core, training) and
one Megatron generation engine (the other core, generating), so the synchronous loop
(K = 0) leaves one of them idle at any time and the overlapped loop (K >= 1) can keep both
busy. Every (K, seed) is one ``dapo-train`` run, one after the other (each uses the whole
machine), in a fresh run directory with its own model (the seed draws the initial
weights), all in this one invocation, so the ratios compare runs of the same machine state;
each seed rotates the order of the K values, so a drift of the machine's speed during the
invocation does not favour one K.

  samples/s      trained samples (dapo.num_prompts_per_step x group size per step) over the
                 steps' wall time, validation excluded, the first --skip steps left out
  trainer idle   mean share of a step the policy rank was not in a train step (its own
                 time: waiting for a batch, in the refit, between calls all count as idle)
  engine idle    mean share of a step the engine was not generating training rollouts
                 (its own time per request)
  final acc      mean of the last three greedy validation accuracies (400 held-out
                 problems); every run trains the same number of samples

Writes bench/results/async_cpu.json (throughput and idle fractions) and
async_cpu_details.json (per seed, with the accuracies).

Usage: python bench/async_rollout.py [--seeds 42,1,2] [--ks 0,1,2] [--steps 150]
           [KEY=VALUE overrides for every run ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"
SPLIT = [
    "cluster.gpus_per_node=2",
    "cluster.colocated=false",
    "cluster.generation_num_devices=1",
    "generation.backend=megatron",
    "dapo.loss.rollout_correction=tis",  # the same loss for every K (ratio 1 when fresh)
    "checkpointing.export_hf=false",
    "logger.progress_bar=false",
    "logger.plots=false",
]


def run_once(run_dir: Path, seed: int, k: int, steps: int, overrides: list[str]) -> dict:
    cmd = [
        sys.executable, "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config", str(RECIPE),
        f"run.output_dir={run_dir}",
        f"run.seed={seed}",
        f"policy.model_name_or_path={run_dir / 'model'}",
        f"dapo.max_num_steps={steps}",
        f"rollout.max_staleness={k}",
        *SPLIT,
        *overrides,
    ]  # fmt: skip
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(
            f"run failed (seed {seed}, K {k}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return {"rows": [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()],
            "wall_s": wall}  # fmt: skip


def summarise(rows: list[dict], skip: int, samples_per_step: int) -> dict:
    steps = [r for r in rows if r["step"] > skip and "timing/step_s" in r]
    train_s = sum(r["timing/step_s"] - r.get("timing/val_s", 0.0) for r in steps)
    evals = [r["val/acc"] for r in rows if "val/acc" in r]
    return {
        "samples_per_s": len(steps) * samples_per_step / train_s,
        "trainer_idle_frac": statistics.fmean(r["timing/trainer_idle_frac"] for r in steps),
        "engine_idle_frac": statistics.fmean(r["timing/engine_idle_frac"] for r in steps),
        "staleness_mean": statistics.fmean(r["rollout/staleness_mean"] for r in steps),
        "stale_groups_dropped": sum(r["rollout/stale_groups_dropped"] for r in steps)
        if "rollout/stale_groups_dropped" in steps[0] else 0.0,
        "samples_generated": sum(r["dynamic_sampling/num_samples_generated"] for r in rows
                                 if "dynamic_sampling/num_samples_generated" in r),
        "final_acc": statistics.fmean(evals[-3:]),
        "step_s_median": statistics.median(r["timing/step_s"] for r in steps),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the rates")
    parser.add_argument("--out", default=str(REPO / "bench/results/async_cpu.json"))
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    samples_per_step = 32 * 8  # the tiny recipe's num_prompts_per_step x group size

    per_run: dict[int, list[dict]] = {k: [] for k in ks}
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        for i, seed in enumerate(seeds):
            # The machine's speed drifts over minutes (shared host): each seed runs the
            # K values in a rotated order, so every K takes each position once in 3 seeds.
            for k in ks[i % len(ks) :] + ks[: i % len(ks)]:
                result = run_once(Path(tmp) / f"k{k}-s{seed}", seed, k, args.steps, args.overrides)
                summary = summarise(result["rows"], args.skip, samples_per_step)
                summary.update(seed=seed, k=k, wall_s=result["wall_s"])
                per_run[k].append(summary)
                print(f"K={k} seed={seed}: {summary['samples_per_s']:.1f} samples/s, "
                      f"trainer idle {summary['trainer_idle_frac']:.2f}, engine idle "
                      f"{summary['engine_idle_frac']:.2f}, staleness "
                      f"{summary['staleness_mean']:.2f}, stale dropped "
                      f"{summary['stale_groups_dropped']:.0f}, final acc "
                      f"{summary['final_acc']:.3f}, wall {summary['wall_s']:.0f} s",
                      flush=True)  # fmt: skip

    def mean(k: int, key: str) -> float:
        return statistics.fmean(r[key] for r in per_run[k])

    def name(k: int, what: str) -> str:
        return f"sync_{what}" if k == 0 else f"async_{what}_k{k}"

    result = {}
    for k in ks:
        result[name(k, "samples_per_s")] = mean(k, "samples_per_s")
    for k in ks:
        result[name(k, "trainer_idle_frac")] = mean(k, "trainer_idle_frac")
        result[name(k, "engine_idle_frac")] = mean(k, "engine_idle_frac")
    print("\n| K | samples/s | x sync | trainer idle | engine idle | staleness | final acc "
          "(mean +- sd over seeds) |\n|---|---|---|---|---|---|---|")  # fmt: skip
    accs = {k: [r["final_acc"] for r in per_run[k]] for k in ks}
    for k in ks:
        ratio = mean(k, "samples_per_s") / mean(0, "samples_per_s") if 0 in ks else math.nan
        sd = statistics.stdev(accs[k]) if len(accs[k]) > 1 else 0.0
        print(f"| {k} | {mean(k, 'samples_per_s'):.1f} | {ratio:.2f} | "
              f"{mean(k, 'trainer_idle_frac'):.2f} | {mean(k, 'engine_idle_frac'):.2f} | "
              f"{mean(k, 'staleness_mean'):.2f} | {statistics.fmean(accs[k]):.3f} +- {sd:.3f} |")
    if 0 in ks:
        for k in ks:
            if k:
                print(f"async_samples_per_s_k{k} / sync_samples_per_s = "
                      f"{result[name(k, 'samples_per_s')] / result['sync_samples_per_s']:.2f}; "
                      f"final acc difference {statistics.fmean(accs[k]) - statistics.fmean(accs[0]):+.3f}")  # noqa: E501
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    details = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "recipe": str(RECIPE.relative_to(REPO)),
        "overrides": SPLIT + args.overrides,
        "steps": args.steps,
        "skipped_steps": args.skip,
        "runs": per_run,
        "final_acc_mean": {str(k): statistics.fmean(accs[k]) for k in ks},
    }
    out.with_name(out.stem + "_details.json").write_text(json.dumps(details, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
