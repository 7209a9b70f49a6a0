"""Rollout efficiency on the long-response CPU task: pre-rollout skipping and tail abort (issue 32).

Runs ``dapo-train --config recipes/dapo-longcot-cpu.yaml`` with the overrides of ``TASK``
once per (variant, seed), one run after the other (each run uses the whole machine), each in
a fresh run directory. The variants:

  dapo        full DAPO as the recipe has it (dynamic sampling on): the baseline
  skip        + pre-rollout skipping (dapo.dynamic_sampling.skip_predicted.enabled=true):
              prompts whose recent groups were all-correct or all-wrong are not generated
  abort       + tail abort (rollout.abort_tail=true): once a generation round has enough
              finished groups, the rest are aborted and not trained
  skip_abort  both

The task (``TASK``) makes prompts saturate: only ``data.remainder.num_train`` = 64 distinct
training problems (the split repeats none of them when num_train is below the problems
left after the held-out validation set), each drawn ~50 times over the 80 steps, so the
short ones become all-correct and those whose solution is longer than the response cap
(6-18 of the 64, by seed) stay all-wrong; their solutions spread over 4-130 tokens against
a cap of 56, a long tail. The baseline's keep rate falls from ~0.56 over the first 10 steps
to ~0.23 over the last 10 (seed 42).

All variants of a seed start from the SAME warmed-up model, as in bench/ablation.py: per
seed, one run of the recipe as it is (its 4096 training rows, all but the held-out problems)
does the SFT warm-up from random weights drawn by the seed, plus one DAPO step at lr 1e-30,
and exports it; the variants start from that export without warm-up and with the same seed
(same prompt order, same validation problems). Every run trains the same number of samples:
max_num_steps x num_prompts_per_step x num_generations_per_prompt.

Per run, from metrics.jsonl (sums over the run's steps):

  generated_per_trained   groups generated per group trained:
                          sum(num_prompts_generated) / (steps x num_prompts_per_step)
  ideal_generated_per_trained
                          1 / k_est, what drawing prompts and generating every one of them
                          would cost at the run's own keep rate. Skipped prompts count as
                          drawn; the audited share of skipped prompts that was confirmed
                          zero-variance (precision) says how many of them would have been
                          kept:
                            k_est = (kept + skipped x (1 - precision)) / (generated + skipped)
                          with kept = sum(num_kept_groups_generated), generated =
                          sum(num_prompts_generated), skipped = sum(num_skipped), precision =
                          the run's overall audited precision (sum over steps of
                          predicted_zero_var_precision x num_audited / sum num_audited; 1 when
                          nothing was audited). Without skipping (skipped = 0) this is
                          generated / kept. Tail abort: num_prompts_generated counts the
                          groups that finished (the aborted ones are neither scored nor
                          counted there), so both of these leave the aborted groups out;
                          generated_per_trained_with_aborted adds them back
                          (rollout/num_aborted_groups).
  generated_tokens_per_trained_token
                          sum(num_generated_tokens) / trained response tokens, the latter
                          sum over steps of response_length/mean x num_prompts_per_step x
                          num_generations_per_prompt (response_length/mean is the mean over
                          the step's trained samples; truncated responses that overlong
                          filtering masks out of the loss are counted as trained). The
                          generated tokens include the partial responses of aborted groups.
  step_s                  median timing/step_s (validation steps included; the median
                          ignores them)
  final_acc               mean greedy validation accuracy of the last 3 evaluations
  final_acc_stderr        one evaluation's standard error (mean of the last 3 val/acc_stderr)

plus the sums they come from, dynamic_sampling/num_audited and rollout/num_aborted_groups
totals, wall_s and the load average around the run (the machine is shared: a load above
~2 before a run means its timings are not clean).

The summary, per variant: mean and standard deviation over seeds of each key, and the goals
of issue 32 as ratio lines (per seed, then the mean over seeds):

  skip (and skip_abort): generated_per_trained / ideal_generated_per_trained  (goal <= 0.75)
                         generated_per_trained / the seed's dapo run's         (context)
  every variant:         (final_acc - dapo's) / hypot(both stderrs) per seed    (goal |z| <= 2)
  abort (and skip_abort): step_s / the seed's dapo run's                       (goal <= 0.80)

The JSON is rewritten after every run (a re-run skips the (variant, seed) pairs it already
holds).

Usage: nice -n 15 python bench/rollout_efficiency.py [--seeds 42,1,2] [--variants a,b]
           [--out PATH] [KEY=VALUE overrides for every run ...]
       python bench/rollout_efficiency.py --report [--out PATH]   # README table + ratios
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeGuard

import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "dapo-longcot-cpu.yaml"
OUT = REPO / "bench" / "results" / "rollout_efficiency_cpu.json"

TASK = [
    "data.remainder.num_train=64",  # 64 distinct problems, each drawn ~50 times in a run
    "dapo.max_num_steps=80",
    "validation.val_period=10",
    # Skipping saturates the 64 problems faster (skip_abort, seed 2: keep rate 0.017 at step
    # 36, past the recipe's 10 rounds). The bound only raises when reached, so runs that
    # never reach it are the same under either value.
    "dapo.dynamic_sampling.max_gen_batches=50",
]
"""Overrides of the recipe for every variant run (not the warm-up)."""

_SKIP = "dapo.dynamic_sampling.skip_predicted.enabled=true"
_ABORT = "rollout.abort_tail=true"
VARIANTS: dict[str, list[str]] = {
    "dapo": [],
    "skip": [_SKIP],
    "abort": [_ABORT],
    "skip_abort": [_SKIP, _ABORT],
}
BASELINE = "dapo"

RUN_KEYS = (
    "variant",
    "seed",
    "generated_per_trained",
    "ideal_generated_per_trained",
    "generated_tokens_per_trained_token",
    "step_s",
    "final_acc",
    "final_acc_stderr",
)
"""Every run record carries these (and more)."""
EXTRA_KEYS = (
    "generated_per_trained_with_aborted",
    "prompts_skipped",
    "aborted_groups",
    "audited_precision",
    "wall_s",
)
"""Further run keys summarised over seeds (where every run of the variant has them)."""

GOAL_SKIP_VS_IDEAL = 0.75  # generated_per_trained at least 25% below its ideal
GOAL_ACC_Z = 2.0  # final accuracy within 2 standard errors of the baseline's
GOAL_ABORT_STEP = 0.80  # median step time at least 20% below the baseline's


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _total(rows: Iterable[dict[str, Any]], key: str) -> float:
    """Sum of a per-step metric over the steps that logged it (NaN/absent count 0)."""
    return float(sum(r[key] for r in rows if _finite(r.get(key))))


def audited_precision(rows: Iterable[dict[str, Any]]) -> float:
    """The run's overall audited precision: per-step precision weighted by the audits scored
    that step (dynamic_sampling/num_audits_scored; num_audited, the audits drawn, where that
    is not logged); 1.0 when nothing was audited (or no precision was logged)."""
    num = den = 0.0
    for r in rows:
        audits = r.get("dynamic_sampling/num_audits_scored", r.get("dynamic_sampling/num_audited"))
        precision = r.get("dynamic_sampling/predicted_zero_var_precision")
        if _finite(audits) and audits > 0 and _finite(precision):
            num += precision * audits
            den += audits
    return num / den if den > 0 else 1.0


def ideal_generated_per_trained(
    kept: float, generated: float, skipped: float = 0.0, precision: float = 1.0
) -> float:
    """1 / k_est with k_est = (kept + skipped (1 - precision)) / (generated + skipped): the
    groups a sampler that generates every drawn prompt needs per trained group."""
    k_est = (kept + skipped * (1.0 - precision)) / (generated + skipped)
    return 1.0 / k_est if k_est > 0 else math.inf


def summarise_run(
    rows: list[dict[str, Any]], num_prompts_per_step: int, group_size: int
) -> dict[str, Any]:
    """The per-run keys (RUN_KEYS but variant and seed) read from metrics.jsonl rows."""
    train = [r for r in rows if "timing/step_s" in r and r.get("step", 0) >= 1]
    evals = [(r["step"], r["val/acc"], r.get("val/acc_stderr")) for r in rows if "val/acc" in r]
    last3 = evals[-3:]
    stderrs = [se for _, _, se in last3 if _finite(se)]
    steps = len(train)
    trained_groups = steps * num_prompts_per_step
    generated = _total(train, "dynamic_sampling/num_prompts_generated")
    kept = _total(train, "dynamic_sampling/num_kept_groups_generated")
    skipped = _total(train, "dynamic_sampling/num_skipped")
    precision = audited_precision(train)
    aborted = _total(train, "rollout/num_aborted_groups")
    generated_tokens = _total(train, "num_generated_tokens")
    trained_tokens = sum(
        r["response_length/mean"] * num_prompts_per_step * group_size
        for r in train
        if _finite(r.get("response_length/mean"))
    )
    return {
        "generated_per_trained": generated / trained_groups if trained_groups else math.nan,
        "generated_per_trained_with_aborted": (
            (generated + aborted) / trained_groups if trained_groups else math.nan
        ),
        "ideal_generated_per_trained": ideal_generated_per_trained(
            kept, generated, skipped, precision
        ),
        "generated_tokens_per_trained_token": (
            generated_tokens / trained_tokens if trained_tokens else math.nan
        ),
        "step_s": statistics.median(r["timing/step_s"] for r in train) if train else math.nan,
        "final_acc": statistics.fmean(acc for _, acc, _ in last3) if last3 else math.nan,
        "final_acc_stderr": statistics.fmean(stderrs) if stderrs else math.nan,
        "num_steps": steps,
        "groups_trained": trained_groups,
        "prompts_generated": generated,
        "kept_groups_generated": kept,
        "prompts_skipped": skipped,
        "prompts_audited": _total(train, "dynamic_sampling/num_audited"),
        "audited_precision": precision,
        "aborted_groups": aborted,
        "generated_tokens": generated_tokens,
        "trained_tokens": trained_tokens,
        "generate_s": _median(r.get("timing/generate_s") for r in train),
        "keep_rate_mean": statistics.fmean(
            r["dynamic_sampling/keep_rate"]
            for r in train
            if _finite(r.get("dynamic_sampling/keep_rate"))
        )
        if train
        else math.nan,
        "evals": evals,
    }


def _median(values: Iterable[Any]) -> float:
    finite = [x for x in values if _finite(x)]
    return statistics.median(finite) if finite else math.nan


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def _paired(
    runs: list[dict[str, Any]], variant: str, ratio: Any, baseline: str = BASELINE
) -> list[tuple[int, float]]:
    """(seed, ratio(run, baseline run)) for every seed that has both runs."""
    ok = [r for r in runs if "failed" not in r]
    base = {r["seed"]: r for r in ok if r["variant"] == baseline}
    return [
        (r["seed"], ratio(r, base[r["seed"]]))
        for r in sorted(ok, key=lambda r: r["seed"])
        if r["variant"] == variant and r["seed"] in base
    ]


def _acc_z(run: dict[str, Any], base: dict[str, Any]) -> float:
    se = math.hypot(run["final_acc_stderr"], base["final_acc_stderr"])
    return (run["final_acc"] - base["final_acc"]) / se if se > 0 else math.nan


def summarise(runs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per variant: mean/sd/min/max over seeds of the run keys, and the goal ratios; failed
    runs are left out (``failed``: seed -> the run's error line)."""
    keys = [k for k in RUN_KEYS if k not in ("variant", "seed")]
    out: dict[str, Any] = {}
    for name in names:
        failed = {r["seed"]: r["failed"] for r in runs if r["variant"] == name and "failed" in r}
        rs = [r for r in runs if r["variant"] == name and "failed" not in r]
        if not rs:
            continue
        v: dict[str, Any] = {"seeds": sorted(r["seed"] for r in rs), "failed": failed}
        for key in keys:
            v[key] = _stats([r[key] for r in rs])
        for key in EXTRA_KEYS:  # where every run has it
            if all(_finite(r.get(key)) for r in rs):
                v[key] = _stats([r[key] for r in rs])
        v["gen_vs_ideal"] = [
            (r["seed"], r["generated_per_trained"] / r["ideal_generated_per_trained"])
            for r in sorted(rs, key=lambda r: r["seed"])
        ]
        if name != BASELINE:
            v["gen_vs_baseline"] = _paired(
                runs, name, lambda a, b: a["generated_per_trained"] / b["generated_per_trained"]
            )
            v["acc_z_vs_baseline"] = _paired(runs, name, _acc_z)
            v["acc_diff_vs_baseline"] = _paired(
                runs, name, lambda a, b: a["final_acc"] - b["final_acc"]
            )
            v["step_s_vs_baseline"] = _paired(runs, name, lambda a, b: a["step_s"] / b["step_s"])
        out[name] = v
    return out


def _fmt_pairs(pairs: list[tuple[int, float]], fmt: str) -> str:
    return ", ".join(f"{format(x, fmt)} (seed {s})" for s, x in pairs)


def _mean(pairs: list[tuple[int, float]]) -> float:
    return statistics.fmean(x for _, x in pairs)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def ratio_lines(summary: dict[str, Any]) -> list[str]:
    """The issue's goals as one line each: the ratio per seed, its mean, the goal, met or not."""
    lines = []
    for name, v in summary.items():
        for seed, error in sorted(v.get("failed", {}).items()):
            lines.append(f"{name}: seed {seed} FAILED (left out above): {error}")
        if name == BASELINE:
            continue
        if "skip" in name and v["gen_vs_ideal"]:
            m = _mean(v["gen_vs_ideal"])
            lines.append(
                f"{name}: generated_per_trained / its ideal = {m:.3f} "
                f"[{_fmt_pairs(v['gen_vs_ideal'], '.3f')}] "
                f"(goal <= {GOAL_SKIP_VS_IDEAL:.2f}: {_met(m <= GOAL_SKIP_VS_IDEAL)})"
            )
            if v.get("gen_vs_baseline"):
                lines.append(
                    f"{name}: generated_per_trained / {BASELINE}'s = "
                    f"{_mean(v['gen_vs_baseline']):.3f} "
                    f"[{_fmt_pairs(v['gen_vs_baseline'], '.3f')}]"
                )
        if "abort" in name and v.get("step_s_vs_baseline"):
            m = _mean(v["step_s_vs_baseline"])
            lines.append(
                f"{name}: median step_s / {BASELINE}'s = {m:.3f} "
                f"[{_fmt_pairs(v['step_s_vs_baseline'], '.3f')}] "
                f"(goal <= {GOAL_ABORT_STEP:.2f}: {_met(m <= GOAL_ABORT_STEP)})"
            )
        if v.get("acc_z_vs_baseline"):
            zs = v["acc_z_vs_baseline"]
            ok = all(abs(z) <= GOAL_ACC_Z for _, z in zs)
            lines.append(
                f"{name}: final acc - {BASELINE}'s = {_mean(v['acc_diff_vs_baseline']):+.3f}, "
                f"in standard errors [{_fmt_pairs(zs, '+.2f')}] "
                f"(goal |z| <= {GOAL_ACC_Z:.0f} on every seed: {_met(ok)})"
            )
    return lines


def report(doc: dict[str, Any]) -> str:
    """The README table of a results document (mean ± sd over seeds), then the ratio lines."""
    lines = [
        "| variant | seeds | generated / trained groups | ideal (1/k) | generated / trained "
        "tokens | median step s | final acc | stderr of one eval | skipped prompts / run | "
        "aborted groups / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def pm(s: dict[str, float], fmt: str) -> str:
        return f"{format(s['mean'], fmt)} ± {format(s['sd'], fmt)}"

    def seeds(v: dict[str, Any]) -> str:
        failed = len(v.get("failed", {}))
        return f"{len(v['seeds'])}" + (f" (+{failed} failed)" if failed else "")

    def total(v: dict[str, Any], key: str) -> str:
        return f"{v[key]['mean']:.0f}" if key in v else "-"

    for name, v in doc["summary"].items():
        lines.append(
            f"| {name} | {seeds(v)} | {pm(v['generated_per_trained'], '.2f')} | "
            f"{pm(v['ideal_generated_per_trained'], '.2f')} | "
            f"{pm(v['generated_tokens_per_trained_token'], '.2f')} | "
            f"{pm(v['step_s'], '.2f')} | {pm(v['final_acc'], '.3f')} | "
            f"{v['final_acc_stderr']['mean']:.3f} | {total(v, 'prompts_skipped')} | "
            f"{total(v, 'aborted_groups')} |"
        )
    return "\n".join([*lines, "", *ratio_lines(doc["summary"])])


class RunFailed(RuntimeError):
    """A dapo-train exited non-zero; ``wall_s`` and the output's error line are kept."""

    def __init__(self, message: str, wall_s: float, error: str) -> None:
        super().__init__(message)
        self.wall_s, self.error = wall_s, error


def _error_line(output: str) -> str:
    """The run's own error line (``error: ...``), else the output's last line."""
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1]


def _train(run_dir: Path, seed: int, model: Path, overrides: list[str], what: str) -> float:
    """One dapo-train of the recipe; returns its wall seconds (RunFailed on failure)."""
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
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RunFailed(
            f"{what} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}",
            wall,
            _error_line(proc.stdout + "\n" + proc.stderr),
        )
    return wall


def warm_up(seed: int, tmp: Path, extra: list[str]) -> tuple[Path, float]:
    """The seed's shared starting model: random init + the recipe's SFT warm-up (on the
    recipe's full training set, not the small one of TASK), exported."""
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
    for f in (run_dir / "model").glob("*token*"):  # the char tokenizer as created
        shutil.copy(f, export / f.name)
    return export, wall


def run_once(variant: str, seed: int, model: Path, tmp: Path, extra: list[str]) -> dict:
    """One variant run. A run that fails is recorded with ``failed`` (its error line) and
    the keys of the steps it logged; the summary leaves it out and counts it."""
    run_dir = tmp / f"{variant}-{seed}"
    load_before = os.getloadavg()[0]
    failed: dict[str, Any] = {}
    try:
        wall = _train(
            run_dir,
            seed,
            model,
            [
                "policy.init_model_if_missing=false",
                "sft_warmup.num_steps=0",
                "checkpointing.enabled=false",
                *TASK,
                *VARIANTS[variant],
                *extra,
            ],
            f"run {variant} (seed {seed})",
        )
    except RunFailed as e:
        print(e, file=sys.stderr, flush=True)
        wall, failed = e.wall_s, {"failed": e.error}
    config_file, metrics_file = run_dir / "config.yaml", run_dir / "metrics.jsonl"
    config = yaml.safe_load(config_file.read_text()) if config_file.exists() else {}
    recipe = yaml.safe_load(RECIPE.read_text())  # where a failed run wrote no config
    dapo = config.get("dapo", recipe["dapo"])
    rows = (
        [json.loads(line) for line in metrics_file.read_text().splitlines()]
        if metrics_file.exists()
        else []
    )
    return {
        "variant": variant,
        "seed": seed,
        **summarise_run(rows, dapo["num_prompts_per_step"], dapo["num_generations_per_prompt"]),
        "wall_s": wall,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        **failed,
    }


def _commit() -> str | None:
    """The code's commit: git's HEAD, or $BENCH_COMMIT for a copy without .git (git archive)."""
    proc = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else os.environ.get("BENCH_COMMIT")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for every run")
    parser.add_argument("--report", action="store_true", help="print the table of --out")
    parser.add_argument(
        "--workdir", default=None, help="keep the run directories here (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report:
        doc = json.loads(out.read_text())
        doc["summary"] = summarise(doc["runs"], list(doc["variant_overrides"]))
        print(report(doc))
        return 0
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    previous = json.loads(out.read_text()) if out.exists() else {}
    runs: list[dict] = previous.get("runs", [])
    warmups: dict[str, float] = previous.get("warmup_wall_s", {})
    done = {(r["variant"], r["seed"]) for r in runs}
    order = [n for n in VARIANTS if n in names or any(r["variant"] == n for r in runs)]
    commits: list[str] = previous.get("commits", [])
    if previous.get("commit") and previous["commit"] not in commits:
        commits.append(previous["commit"])
    current = _commit()
    if current and current not in commits:
        commits.append(current)  # every commit whose code ran some of the runs
    started = time.perf_counter()
    total_s = float(previous.get("total_wall_s", 0.0))

    def write() -> None:
        doc = {
            "commits": commits,
            "recipe": str(RECIPE.relative_to(REPO)),
            "task_overrides": TASK,
            "overrides": args.overrides,
            "variant_overrides": {n: VARIANTS[n] for n in order},
            "machine_cpus": os.cpu_count(),
            "warmup_wall_s": warmups,
            "total_wall_s": total_s + time.perf_counter() - started,
            "runs": runs,
            "summary": summarise(runs, order),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")

    print(
        "| variant | seed | gen/trained | ideal | gen/trained tokens | step s | final acc | "
        "stderr | skipped | aborted | wall s | load before |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with (
        contextlib.nullcontext(args.workdir)
        if args.workdir
        else tempfile.TemporaryDirectory(prefix="rollout-eff-")
    ) as tmp:
        for seed in seeds:  # seed-major: a cut-short run still compares every variant
            todo = [n for n in names if (n, seed) not in done]
            if not todo:
                continue
            try:
                model, warmup_s = warm_up(seed, Path(tmp), args.overrides)
            except RunFailed as e:
                raise SystemExit(str(e)) from None
            warmups[str(seed)] = warmup_s
            for name in todo:
                r = run_once(name, seed, model, Path(tmp), args.overrides)
                runs.append(r)
                write()
                print(
                    f"| {name} | {seed} | {r['generated_per_trained']:.2f} | "
                    f"{r['ideal_generated_per_trained']:.2f} | "
                    f"{r['generated_tokens_per_trained_token']:.2f} | {r['step_s']:.2f} | "
                    f"{r['final_acc']:.3f} | {r['final_acc_stderr']:.3f} | "
                    f"{r['prompts_skipped']:.0f} | {r['aborted_groups']:.0f} | "
                    f"{r['wall_s']:.0f} | {r['load_before']:.1f} |",
                    flush=True,
                )
    write()
    print(report(json.loads(out.read_text())))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
