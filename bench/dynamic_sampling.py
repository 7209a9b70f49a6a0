"""Generation efficiency of dynamic sampling strategies, measured on a simulated prompt pool.

Every strategy runs in the same process on the same seeded prompt pool, so the ratios are
like for like. Each prompt has a pass rate p; a group's N samples are Bernoulli(p), and a
group is kept when its outcomes differ. Costs reported per step:
  - samples generated per sample trained on (1.0 would waste nothing),
  - generation rounds (each round is a sequential generation pass: latency),
  - valid samples thrown away.
Strategies:
  peer        fixed-size rounds of ceil(m * P) prompts, surplus valid groups discarded
              (how verl and NeMo RL behave);
  carry       rounds sized ceil(m * groups still needed), surplus carried to the next step;
  carry+auto  as carry, with m set every step from the observed keep rate.

Usage: python bench/dynamic_sampling.py [--steps 200] [--out bench/results/dynamic_sampling.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

from dapo_megatron.algorithms.dynamic_sampling import DynamicSampler
from dapo_megatron.algorithms.group_filter import auto_batch_multiplier

# Pools of pass rates: share of unsolvable prompts, share of trivial ones, the rest Beta(2, 2).
POOLS = {"easy": (0.05, 0.25), "medium": (0.25, 0.25), "hard": (0.60, 0.15)}


def pass_rates(pool: str, size: int, gen: torch.Generator) -> torch.Tensor:
    hard, easy = POOLS[pool]
    u = torch.rand(size, generator=gen)
    beta = torch.distributions.Beta(2.0, 2.0).sample((size,))
    return torch.where(u < hard, 0.0, torch.where(u < hard + easy, 1.0, beta))


def run_strategy(
    strategy: str, pool: str, *, steps: int, prompts: int, group: int, multiplier: float, seed: int
) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # Beta sampling uses the global generator
    sampler: DynamicSampler[int] = DynamicSampler(
        num_prompts_per_step=prompts,
        batch_multiplier=multiplier,
        max_gen_batches=0,
        surplus="discard" if strategy == "peer" else "carry",
        max_carry_age=1,
        group_size=group,
    )
    keep_rate_ema: float | None = None
    generated = rounds = discarded = 0
    max_rounds = 0
    keep_sum = 0.0
    for _ in range(steps):
        if strategy == "carry+auto" and keep_rate_ema is not None:
            sampler.batch_multiplier = auto_batch_multiplier(keep_rate_ema, max_multiplier=8.0)
        sampler.start_step()
        while not sampler.is_complete():
            asked = sampler.prompts_for_next_round()
            n = math.ceil(multiplier * prompts) if strategy == "peer" else asked
            p = pass_rates(pool, n, gen)
            metric_GN = (torch.rand(n, group, generator=gen) < p[:, None]).float()
            sampler.add_round(list(range(n)), metric_GN, metric_GN)
        _, stats = sampler.finish_step()
        generated += stats.num_samples_generated
        rounds += stats.num_gen_batches
        max_rounds = max(max_rounds, stats.num_gen_batches)
        discarded += stats.num_discarded_valid_samples
        keep = stats.keep_rate
        keep_sum += keep
        keep_rate_ema = keep if keep_rate_ema is None else 0.5 * keep_rate_ema + 0.5 * keep
    trained = steps * prompts * group
    return {
        "generated_per_trained": generated / trained,
        "rounds_per_step": rounds / steps,
        "max_rounds": max_rounds,
        "discarded_valid_per_step": discarded / steps,
        "keep_rate": keep_sum / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=64, help="num_prompts_per_step")
    parser.add_argument("--group", type=int, default=16, help="num_generations_per_prompt")
    parser.add_argument("--multiplier", type=float, default=3.0, help="batch_multiplier")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "dynamic_sampling.json"
    )
    args = parser.parse_args()

    rows = []
    start = time.perf_counter()
    for pool in POOLS:
        base = None
        for strategy in ("peer", "carry", "carry+auto"):
            r = run_strategy(
                strategy,
                pool,
                steps=args.steps,
                prompts=args.prompts,
                group=args.group,
                multiplier=args.multiplier,
                seed=args.seed,
            )
            base = base or r
            r["generated_ratio_vs_peer"] = (
                r["generated_per_trained"] / base["generated_per_trained"]
            )
            r["rounds_ratio_vs_peer"] = r["rounds_per_step"] / base["rounds_per_step"]
            rows.append({"pool": pool, "strategy": strategy, **r})

    header = (
        f"{'pool':7} {'strategy':11} {'keep':>5} {'gen/trained':>11} {'vs peer':>7} "
        f"{'rounds':>6} {'max':>4} {'discarded/step':>14}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['pool']:7} {r['strategy']:11} {r['keep_rate']:5.2f} "
            f"{r['generated_per_trained']:11.3f} {r['generated_ratio_vs_peer']:7.3f} "
            f"{r['rounds_per_step']:6.2f} {r['max_rounds']:4d} "
            f"{r['discarded_valid_per_step']:14.1f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "dynamic_sampling",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": platform.platform(),
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
