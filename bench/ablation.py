"""The DAPO paper's ablation ladder on the long-response CPU task (issue 31).

Runs ``dapo-train --config recipes/dapo-longcot-cpu.yaml`` once per (variant, seed), one run
after the other (each run uses the whole machine), each in a fresh run directory with its
own model (the seed also draws the initial weights). The variants are the paper's rungs
(arXiv 2503.14476, Table 1), each adding one technique to the one before:

  naive_grpo         clip 0.2/0.2, sample-level loss (seq-mean-token-mean), no overlong
                     filtering, no soft overlong punishment, no dynamic sampling
  +overlong_filter   truncated responses masked out of the loss
  +clip_higher       clip_ratio_high 0.28
  +soft_overlong     the overlong buffer's length penalty
  +token_loss        token-mean loss aggregation
  +dynamic_sampling  groups with zero accuracy variance dropped and refilled (= full DAPO)

All variants of a seed start from the SAME warmed-up model: per seed, one run of the recipe
does the SFT warm-up (from random weights drawn by the seed) and one DAPO step at lr 1e-30
(a no-op: the recipe needs >= 1 step to export), exports it as an HF checkpoint, and the
six variants then start from that checkpoint without warm-up (``sft_warmup.num_steps=0``),
with the same seed (same prompts order). This pairs the comparison (only the technique
differs) and saves five SFT warm-ups per seed: on the shared 2-core machine the warm-up
was most of a run's time. Every run trains the same number of samples (steps x prompts x
group size); dynamic sampling generates more to fill its batches. Per run, from
metrics.jsonl:

  final_acc                 mean greedy validation accuracy of the last 3 evaluations
  final_acc_stderr          one evaluation's standard error (mean of the last 3 evaluations'
                            val/acc_stderr; the three score the same problems, so their mean
                            is not much more precise than one of them)
  entropy_last              mean policy/entropy over the last 10% of steps
  mean_response_length_last mean response_length/mean over the last 10% of steps
  truncated_frac_last       mean response_length/clip_ratio over the last 10% of steps
  samples_generated         samples generated over the run (all dynamic-sampling rounds)
  wall_s                    seconds of the run's command (Ray start included; the shared
                            warm-up's seconds, once per seed, are in warmup_wall_s)

The JSON is rewritten after every run (a re-run skips the (variant, seed) pairs it already
holds), then the summary and the plots (accuracy and entropy over steps, mean over seeds,
PNG beside the JSON) are added.

Usage: nice -n 15 python bench/ablation.py [--seeds 42,1,2] [--variants a,b] [--out PATH]
           [KEY=VALUE overrides for every run ...]
       python bench/ablation.py --report [--out PATH]   # the README table of a results file
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "dapo-longcot-cpu.yaml"

_NAIVE = [
    "dapo.loss.clip_ratio_high=0.2",
    "dapo.loss.loss_agg_mode=seq-mean-token-mean",
    "dapo.overlong_filtering=false",
    "dapo.overlong_buffer.enabled=false",
    "dapo.dynamic_sampling.enabled=false",
]
_RUNGS = [
    ("+overlong_filter", "dapo.overlong_filtering=true"),
    ("+clip_higher", "dapo.loss.clip_ratio_high=0.28"),
    ("+soft_overlong", "dapo.overlong_buffer.enabled=true"),
    ("+token_loss", "dapo.loss.loss_agg_mode=token-mean"),
    ("+dynamic_sampling", "dapo.dynamic_sampling.enabled=true"),
]


def variants() -> dict[str, list[str]]:
    """Variant name -> its overrides of the recipe: each rung keeps the ones before it (the
    later override of a key wins)."""
    out = {"naive_grpo": list(_NAIVE)}
    current = list(_NAIVE)
    for name, override in _RUNGS:
        current = [*current, override]
        out[name] = list(current)
    return out


def _mean_last(rows: list[dict[str, Any]], key: str, frac: float = 0.1) -> float | None:
    """Mean of `key` over the last `frac` of the training steps that logged it."""
    values = [r[key] for r in rows if key in r and r.get("step", 0) >= 1]
    if not values:
        return None
    n = max(1, math.ceil(frac * len(values)))
    return statistics.fmean(values[-n:])


def summarise_run(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-run keys read from a run's metrics.jsonl rows."""
    evals = [(r["step"], r["val/acc"], r.get("val/acc_stderr")) for r in rows if "val/acc" in r]
    last3 = evals[-3:]
    stderrs = [se for _, _, se in last3 if se is not None]
    train_rows = [r for r in rows if "policy/entropy" in r]
    return {
        "final_acc": statistics.fmean(acc for _, acc, _ in last3),
        "final_acc_stderr": statistics.fmean(stderrs) if stderrs else None,
        "entropy_last": _mean_last(rows, "policy/entropy"),
        "mean_response_length_last": _mean_last(rows, "response_length/mean"),
        "truncated_frac_last": _mean_last(rows, "response_length/clip_ratio"),
        "samples_generated": int(
            sum(r.get("dynamic_sampling/num_samples_generated", 0.0) for r in rows)
        ),
        "keep_rate_mean": _mean_last(rows, "dynamic_sampling/keep_rate", frac=1.0),
        "evals": evals,
        "entropy_by_step": [(r["step"], r["policy/entropy"]) for r in train_rows],
        "truncated_by_step": [
            (r["step"], r["response_length/clip_ratio"])
            for r in train_rows
            if "response_length/clip_ratio" in r
        ],
    }


def _train(run_dir: Path, seed: int, model: Path, overrides: list[str], what: str) -> float:
    """One dapo-train of the recipe; returns its wall seconds (exits on failure)."""
    cmd = [
        sys.executable,
        "-c",
        "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())",
        "--config",
        str(RECIPE),
        f"run.output_dir={run_dir}",
        f"run.seed={seed}",
        f"policy.model_name_or_path={model}",
        "logger.progress_bar=false",
        "logger.plots=false",
        *overrides,
    ]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def warm_up(seed: int, tmp: Path, extra: list[str]) -> tuple[Path, float]:
    """The seed's shared starting model: random init + the recipe's SFT warm-up, exported."""
    run_dir = tmp / f"warmup-{seed}"
    wall = _train(
        run_dir,
        seed,
        run_dir / "model",
        [
            "dapo.max_num_steps=1",
            "policy.optimizer.lr=1e-30",  # the one (required) DAPO step changes nothing
            "policy.optimizer.min_lr=0",
            "dapo.dynamic_sampling.enabled=false",
            "validation.val_at_start=false",
            "validation.val_period=0",
            "checkpointing.save_period=1000",
            "checkpointing.export_hf=true",
            *extra,
        ],
        f"warm-up (seed {seed})",
    )
    export = run_dir / "hf" / "step_000001"
    # The char tokenizer as created (save_char_tokenizer: tokenizer_class
    # PreTrainedTokenizerFast), so that it loads with its whitespace tokens.
    for f in (run_dir / "model").glob("*token*"):
        shutil.copy(f, export / f.name)
    return export, wall


def run_once(
    variant: str, overrides: list[str], seed: int, model: Path, tmp: Path, extra: list[str]
) -> dict:
    run_dir = tmp / f"{variant.strip('+')}-{seed}"
    wall = _train(
        run_dir,
        seed,
        model,
        [
            "policy.init_model_if_missing=false",
            "sft_warmup.num_steps=0",
            "checkpointing.enabled=false",
            *overrides,
            *extra,
        ],
        f"run {variant} (seed {seed})",
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"variant": variant, "seed": seed, **summarise_run(rows), "wall_s": wall}


def first_step_at(evals: list[list[float]], target: float) -> int | None:
    """The first evaluated step whose accuracy is >= target (None: never)."""
    return next((int(step) for step, acc, _ in evals if acc >= target), None)


def summarise(runs: list[dict], names: list[str]) -> dict[str, Any]:
    """Per variant: mean, spread and standard error over seeds; the paper's three effects."""
    by = {n: {r["seed"]: r for r in runs if r["variant"] == n} for n in names}
    table = {}
    for name in names:
        rs = list(by[name].values())
        if not rs:
            continue
        finals = [r["final_acc"] for r in rs]
        table[name] = {
            "seeds": len(rs),
            "final_acc_mean": statistics.fmean(finals),
            "final_acc_min": min(finals),
            "final_acc_max": max(finals),
            "final_acc_stderr_mean": statistics.fmean(r["final_acc_stderr"] for r in rs),
            **{
                key: statistics.fmean(r[key] for r in rs)
                for key in (
                    "entropy_last",
                    "mean_response_length_last",
                    "truncated_frac_last",
                    "samples_generated",
                    "wall_s",
                )
            },
        }
    effects: dict[str, Any] = {}
    naive, dapo = by.get("naive_grpo", {}), by.get("+dynamic_sampling", {})
    pairs = []
    for seed in sorted(set(naive) & set(dapo)):
        a, b = dapo[seed], naive[seed]
        se = math.hypot(a["final_acc_stderr"], b["final_acc_stderr"])
        diff = a["final_acc"] - b["final_acc"]
        pairs.append({"seed": seed, "diff": diff, "stderr_diff": se, "above_2se": diff > 2 * se})
    effects["dapo_beats_naive_by_2se"] = {
        "pairs": pairs,
        "every_seed": bool(pairs) and all(p["above_2se"] for p in pairs),
    }
    # Clip-higher: the one rung that changes only clip_ratio_high (0.2 -> 0.28).
    without, with_ = by.get("+overlong_filter", {}), by.get("+clip_higher", {})
    ent = [
        {
            "seed": s,
            "entropy_without": without[s]["entropy_last"],
            "entropy_with": with_[s]["entropy_last"],
        }
        for s in sorted(set(without) & set(with_))
    ]
    effects["entropy_lower_without_clip_higher"] = {
        "pairs": ent,
        "every_seed": bool(ent) and all(e["entropy_without"] < e["entropy_with"] for e in ent),
    }
    # Dynamic sampling: steps to reach the final accuracy of the rung without it.
    base, ds = by.get("+token_loss", {}), by.get("+dynamic_sampling", {})
    steps = []
    for s in sorted(set(base) & set(ds)):
        target = base[s]["final_acc"]
        steps.append(
            {
                "seed": s,
                "target_acc": target,
                "steps_without_ds": first_step_at(base[s]["evals"], target),
                "steps_with_ds": first_step_at(ds[s]["evals"], target),
                "samples_without_ds": base[s]["samples_generated"],
                "samples_with_ds": ds[s]["samples_generated"],
            }
        )

    def fewer(p: dict) -> bool:
        w, wo = p["steps_with_ds"], p["steps_without_ds"]
        return w is not None and (wo is None or w < wo)

    effects["ds_reaches_target_in_fewer_steps"] = {
        "pairs": steps,
        "every_seed": bool(steps) and all(fewer(p) for p in steps),
    }
    return {"variants": table, "effects": effects}


def plot(runs: list[dict], names: list[str], out_png: Path) -> None:
    """Accuracy and entropy over steps, mean over seeds, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_ent) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in names:
        rs = [r for r in runs if r["variant"] == name]
        if not rs:
            continue
        for ax, key in ((ax_acc, "evals"), (ax_ent, "entropy_by_step")):
            curves: dict[int, list[float]] = {}
            for r in rs:
                for point in r[key]:
                    curves.setdefault(int(point[0]), []).append(point[1])
            xs = sorted(curves)
            ax.plot(xs, [statistics.fmean(curves[x]) for x in xs], label=name, marker=".")
    ax_acc.set(xlabel="step", ylabel="greedy val acc (mean over seeds)", title="accuracy")
    ax_ent.set(xlabel="step", ylabel="policy entropy (mean over seeds)", title="entropy")
    ax_acc.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def report(doc: dict[str, Any]) -> str:
    """The README table of a results document: one row per variant, over its seeds."""
    lines = [
        "| variant | final acc mean (min-max) | stderr of one eval | entropy_last | "
        "truncated_frac_last | mean length | samples generated |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in doc["summary"]["variants"].items():
        lines.append(
            f"| {name} | {v['final_acc_mean']:.3f} ({v['final_acc_min']:.3f}-"
            f"{v['final_acc_max']:.3f}) | {v['final_acc_stderr_mean']:.3f} | "
            f"{v['entropy_last']:.3f} | {v['truncated_frac_last']:.3f} | "
            f"{v['mean_response_length_last']:.1f} | {v['samples_generated']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    all_variants = variants()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--variants", default=",".join(all_variants))
    parser.add_argument("--out", default=str(REPO / "bench/results/ablation_cpu.json"))
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    parser.add_argument(
        "--report", action="store_true", help="print the table of --out and redraw its plot"
    )
    args = parser.parse_args(argv)
    if args.report:
        doc = json.loads(Path(args.out).read_text())
        order = list(doc["variant_overrides"])
        plot(doc["runs"], order, Path(args.out).with_suffix(".png"))
        print(report(doc))
        print(json.dumps(doc["summary"]["effects"], indent=1))
        return 0
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.variants.split(",")
    out = Path(args.out)
    runs: list[dict] = []
    if out.exists():
        runs = json.loads(out.read_text()).get("runs", [])
        warmups: dict[str, float] = json.loads(out.read_text()).get("warmup_wall_s", {})
    else:
        warmups = {}
    done = {(r["variant"], r["seed"]) for r in runs}

    def write() -> None:
        doc = {
            "recipe": str(RECIPE.relative_to(REPO)),
            "overrides": args.overrides,
            "variant_overrides": {n: all_variants[n] for n in names},
            "machine_cpus": os.cpu_count(),
            "warmup_wall_s": warmups,
            "runs": runs,
            "summary": summarise(runs, names),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")

    print("| variant | seed | final acc | stderr | entropy_last | truncated | length | wall s |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="ablation-") as tmp:
        # Seed-major: after each seed every variant has a run, so a cut-short ablation still
        # compares all of them.
        for seed in seeds:
            todo = [n for n in names if (n, seed) not in done]
            if not todo:
                continue
            model, warmup_s = warm_up(seed, Path(tmp), args.overrides)
            warmups[str(seed)] = warmup_s
            for name in todo:
                r = run_once(name, all_variants[name], seed, model, Path(tmp), args.overrides)
                runs.append(r)
                write()
                print(
                    f"| {name} | {seed} | {r['final_acc']:.3f} | {r['final_acc_stderr']:.3f} | "
                    f"{r['entropy_last']:.3f} | {r['truncated_frac_last']:.3f} | "
                    f"{r['mean_response_length_last']:.1f} | {r['wall_s']:.0f} |",
                    flush=True,
                )
    write()
    plot(runs, names, out.with_suffix(".png"))
    print(json.dumps(summarise(runs, names)["effects"], indent=1))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
