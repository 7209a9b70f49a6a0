"""Sequence packing vs padded micro-batches: tokens through the model and train-step time, CPU.

One process (world size 1, gloo, 2 intra-op threads), one MegatronPolicy built with
``policy.max_tokens_per_microbatch`` set (a packed-capable model; it runs padded batches
too, as tests/distributed/test_packed_policy_step.py does), one batch, random weights:
``policy.train_step(batch)`` (forward + backward + optimizer step of the DAPO loss) is
timed with

  padded  ``policy.ctx.max_tokens_per_microbatch = None``: micro-batches of
          ``policy.train_micro_batch_size`` rows, each row right-padded to the batch's
          longest sequence (policy_step._micro_batches);
  packed  the configured token budget: whole sequences concatenated (THD) into micro-batches
          of at most that many tokens (megatron/packed_batches.py, first-fit decreasing).

Both modes run on the same weights and batch, alternately (padded, packed, padded, ...)
after one warm-up step each; the medians are reported. Weights change between steps (each
step is a real optimizer step); the compute per step does not.

The response-length mix is SYNTHETIC, shaped after DAPO (Yu et al., 2025, "DAPO: An
Open-Source LLM Reinforcement Learning System at Scale"): responses capped at 20,480 tokens
(16,384 expected plus a 4,096-token overlong buffer), with mean response lengths growing to
several thousand tokens during training, i.e. a long tail where most responses are far below
the cap and a few run into it. Scaled down to this CPU benchmark's cap ``--cap`` (512):

  response length = min(round(LogNormal(ln(0.2 * cap), sigma=1.0)), cap), at least 1

so the median is 0.2 x cap, the mean about 0.29 x cap, and P(length == cap) ~ 5.4% (the
lognormal mass above the cap: overlong responses truncated at the cap, a point mass).
Prompts are short and fixed-ish: uniform in [--prompt - 8, --prompt + 8] tokens. Seeded
(--seed). The batch is right-padded to its longest row, as controller/rollouts/rollout_groups.py builds it.

Token counts (top-level JSON keys, with the step medians):
  useful_tokens  sum of the real lengths (prompt + response) of the rows;
  padded_tokens  rows x sequence length summed over the padded micro-batches, exactly as
                 policy_step._micro_batches builds them (filler rows included);
  packed_tokens  sum of the packs' lengths (packed_micro_batches(...).micro layouts' totals).

Writes ``--out`` (default bench/results/packing_cpu.json) with exactly the keys
padded_tokens, useful_tokens, packed_tokens, padded_step_s, packed_step_s, and
``<out stem>_details.json`` beside it (mix, model, sizes, per-step times, ratios, machine).
Timings are from whatever machine runs it (bench/results: the 2-core CPU machine). The
details also record the attention score entries of both modes (padded: rows x S^2 per
head and layer; packed: sum of len^2, what block-diagonal attention needs; the CP=1 kernel
pads each sequence to its power-of-two bucket's longest), since attention grows with the
square of the row length and makes the time ratio exceed the token ratio, and the working
tree's HEAD and modified files (the code that was measured).

Usage: .venv/bin/python bench/packing.py [--out bench/results/packing_cpu.json]
           [--rows 32] [--cap 512] [--prompt 32] [--budget-factor 2] [--micro 4]
           [--repeats 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"
THREADS = 2
MODEL = {
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}
MIX = {
    "source": (
        "SYNTHETIC. Shape after DAPO (Yu et al. 2025): a 20,480-token response cap "
        "(16,384 + 4,096 overlong buffer) and mean response lengths growing to several "
        "thousand tokens, i.e. a long tail with most responses far below the cap and a few "
        "truncated at it; scaled down to the CPU cap."
    ),
    "response_length": "min(round(LogNormal(ln(0.2 * cap), sigma=1.0)), cap), >= 1",
    "median_fraction_of_cap": 0.2,
    "sigma": 1.0,
    "prompt_length": "uniform integer in [prompt - 8, prompt + 8]",
}


def response_mix(rows: int, cap: int, prompt: int, seed: int) -> tuple[list[int], list[int]]:
    """Seeded prompt and response lengths (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    mu = math.log(MIX["median_fraction_of_cap"] * cap)
    draws = torch.exp(mu + MIX["sigma"] * torch.randn(rows, generator=gen, dtype=torch.float64))
    responses = [max(1, min(cap, round(float(x)))) for x in draws]
    prompts = torch.randint(prompt - 8, prompt + 9, (rows,), generator=gen).tolist()
    return prompts, responses


def expected_mix(cap: int) -> dict[str, float]:
    """Mean and P(at cap) of the response-length distribution (numerical, 200k draws)."""
    gen = torch.Generator().manual_seed(12345)
    mu = math.log(MIX["median_fraction_of_cap"] * cap)
    x = torch.exp(mu + MIX["sigma"] * torch.randn(200_000, generator=gen, dtype=torch.float64))
    x = x.round().clamp(1, cap)
    return {"mean": float(x.mean()), "p_at_cap": float((x == cap).double().mean())}


def make_batch(prompts: list[int], responses: list[int], vocab: int, seed: int):
    """Right-padded PolicyBatch: random tokens, response tokens in the loss, [B] advantages."""
    from dapo_megatron.shared.batch import PolicyBatch

    gen = torch.Generator().manual_seed(seed + 1)
    lengths = [p + r for p, r in zip(prompts, responses, strict=True)]
    rows, width = len(lengths), max(lengths)
    input_ids = torch.randint(0, vocab, (rows, width), generator=gen)
    loss_mask = torch.zeros(rows, width)
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        loss_mask[i, p:n] = 1.0
        input_ids[i, n:] = 0  # pad
    advantages = torch.randn(rows, generator=gen)
    return PolicyBatch(
        input_ids=input_ids,
        loss_mask=loss_mask,
        advantages=advantages,
        lengths=torch.tensor(lengths),
    )


def make_hf_model(path: Path, max_len: int) -> int:
    """A random-weight Qwen2 (fp32) saved as an HF checkpoint; returns its parameter count."""
    import transformers

    config = transformers.Qwen2Config(
        **MODEL,
        max_position_embeddings=max(1024, max_len),
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def policy_config(hf_dir: Path, args: argparse.Namespace, budget: int):
    from dapo_megatron.config.loader import load_config

    overrides = [
        f"policy.model_name_or_path={hf_dir}",
        "policy.model_arch=null",
        "policy.init_model_if_missing=false",
        "policy.precision=fp32",
        "policy.megatron.use_distributed_optimizer=false",
        "policy.optimizer.lr=1.0e-6",
        "policy.optimizer.min_lr=1.0e-6",
        "policy.scheduler.lr_warmup_steps=0",
        "policy.scheduler.lr_decay_style=constant",
        f"policy.train_micro_batch_size={args.micro}",
        f"policy.logprob_micro_batch_size={args.micro}",
        f"policy.train_global_batch_size={args.rows}",
        f"policy.max_tokens_per_microbatch={budget}",
        f"policy.max_total_sequence_length={args.prompt + 8 + args.cap}",
        f"data.max_prompt_length={args.prompt + 8}",
        f"generation.max_response_length={args.cap}",
    ]
    return load_config(RECIPE, overrides, validate=False).config


def attention_entries(lengths: list[int], padded_rows: int, padded_len: int) -> dict:
    """Score-matrix entries per head and layer: padded rows x S^2; packed sum(len^2)
    (block-diagonal) and the CP=1 kernel's power-of-two buckets (n x longest^2 each)."""
    buckets: dict[int, list[int]] = {}
    for n in lengths:
        if n:
            buckets.setdefault((n - 1).bit_length(), []).append(n)
    bucketed = sum(len(v) * max(v) ** 2 for v in buckets.values())
    padded = padded_rows * padded_len**2
    exact = sum(n * n for n in lengths)
    return {
        "padded": padded,
        "packed_block_diagonal": exact,
        "packed_bucketed": bucketed,
        "padded / packed_block_diagonal": padded / exact,
        "padded / packed_bucketed": padded / bucketed,
    }


def code_state() -> dict:
    """HEAD and the modified tracked files of the working tree that was measured."""
    import subprocess

    def git(*cmd: str) -> str:
        out = subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip()

    return {
        "head": git("rev-parse", "HEAD"),
        "modified_tracked_files": git("diff", "--name-only", "HEAD").splitlines(),
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/packing_cpu.json")
    parser.add_argument("--rows", type=int, default=32, help="rows (samples) in the batch")
    parser.add_argument("--cap", type=int, default=512, help="response-length cap")
    parser.add_argument("--prompt", type=int, default=32, help="mean prompt length")
    parser.add_argument(
        "--budget-factor",
        type=int,
        default=2,
        help="packed token budget = factor x (longest prompt + cap)",
    )
    parser.add_argument("--micro", type=int, default=4, help="padded micro-batch rows")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per mode")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(THREADS)
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    from megatron.core import parallel_state  # noqa: F401  (Megatron before our modules)

    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.packed_batches import packed_micro_batches
    from dapo_megatron.megatron.policy import MegatronPolicy
    from dapo_megatron.megatron.policy_step import _micro_batches

    max_seq = args.prompt + 8 + args.cap
    budget = args.budget_factor * max_seq
    prompts, responses = response_mix(args.rows, args.cap, args.prompt, args.seed)
    batch = make_batch(prompts, responses, MODEL["vocab_size"], args.seed)
    dims = ParallelDims(1, 1, 1, 1, False)

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "qwen2"
        params = make_hf_model(hf_dir, max_seq)
        policy = MegatronPolicy(policy_plan(policy_config(hf_dir, args, budget), dims))
    packed_ctx = policy.ctx
    padded_ctx = dataclasses.replace(packed_ctx, max_tokens_per_microbatch=None)

    # Token counts from the very micro-batches train_step builds (timed: part of a step).
    t0 = time.perf_counter()
    padded = _micro_batches(batch, args.micro, dims)
    padded_build_s = time.perf_counter() - t0
    padded_micro, padded_len = padded.micro, padded.seq_len
    padded_tokens = sum(int(mb.input_ids.numel()) for mb in padded_micro)
    t0 = time.perf_counter()
    packs = packed_micro_batches(batch, budget, dims)
    packed_build_s = time.perf_counter() - t0
    pack_totals = [int(m.layout.total) for m in packs.micro if m.layout is not None]
    packed_tokens = sum(pack_totals)
    useful_tokens = int(batch.lengths.sum())

    times: dict[str, list[float]] = {"padded": [], "packed": []}
    warmup: dict[str, float] = {}
    losses: dict[str, list[float]] = {"padded": [], "packed": []}
    ctxs = {"padded": padded_ctx, "packed": packed_ctx}
    started = time.perf_counter()
    for step in range(args.repeats + 1):
        for mode in ("padded", "packed"):
            policy.ctx = ctxs[mode]
            t0 = time.perf_counter()
            metrics = policy.train_step(batch)
            elapsed = time.perf_counter() - t0
            if step == 0:
                warmup[mode] = elapsed
            else:
                times[mode].append(elapsed)
                losses[mode].append(metrics["loss"])
            print(f"  step {step} {mode:6s} {elapsed:7.3f} s", flush=True)
    timed_wall = time.perf_counter() - started
    policy.ctx = packed_ctx
    policy.shutdown()

    padded_s = statistics.median(times["padded"])
    packed_s = statistics.median(times["packed"])
    token_ratio = padded_tokens / useful_tokens
    speedup = padded_s / packed_s
    ratios = {
        "packed_tokens / useful_tokens": packed_tokens / useful_tokens,
        "padded_tokens / useful_tokens": token_ratio,
        "padded_tokens / packed_tokens": padded_tokens / packed_tokens,
        "padded_step_s / packed_step_s": speedup,
        "speedup / (padded_tokens / useful_tokens)": speedup / token_ratio,
    }
    goals = {
        "packed_tokens <= 1.05 x useful_tokens": packed_tokens / useful_tokens <= 1.05,
        "padded_step_s / packed_step_s >= 0.8 x padded_tokens / useful_tokens": (
            speedup >= 0.8 * token_ratio
        ),
    }
    result = {
        "padded_tokens": padded_tokens,
        "useful_tokens": useful_tokens,
        "packed_tokens": packed_tokens,
        "padded_step_s": padded_s,
        "packed_step_s": packed_s,
    }
    n_at_cap = sum(r == args.cap for r in responses)
    lengths = [int(n) for n in batch.lengths]
    attention = attention_entries(lengths, len(padded_micro) * args.micro, padded_len)
    details = {
        "note": (
            f"Timings taken on a {os.cpu_count()}-core machine ({THREADS} intra-op threads, one "
            "process); a CI run may have been running at the same time."
        ),
        "mix": {
            **MIX,
            "cap": args.cap,
            "expected": expected_mix(args.cap),
            "seed": args.seed,
            "rows": args.rows,
            "prompt_lengths": prompts,
            "response_lengths": responses,
            "response_mean": statistics.fmean(responses),
            "response_median": statistics.median(responses),
            "responses_at_cap": n_at_cap,
            "batch_seq_len": batch.seq_len,
        },
        "model": {
            "arch": "Qwen2 (random weights, tied embeddings)",
            **MODEL,
            "parameters": params,
            "precision": "fp32",
            "attention": (
                "packed-capable local spec at CP1: padded batches use Megatron's "
                "DotProductAttention, packed ones ContextParallelAttention's THD path "
                "(sequences batched per power-of-two length bucket)"
            ),
        },
        "train_step": {
            "what": "policy.train_step: forward + backward + optimizer step (Adam), DAPO loss",
            "optimizer": "adam, lr 1e-6, clip_grad 1.0",
            "warmup_steps_per_mode": 1,
            "timed_steps_per_mode": args.repeats,
            "order": "alternating padded, packed",
            "padded_step_s_all": times["padded"],
            "packed_step_s_all": times["packed"],
            "padded_step_s_min": min(times["padded"]),
            "packed_step_s_min": min(times["packed"]),
            "padded_step_s_min / packed_step_s_min": min(times["padded"]) / min(times["packed"]),
            "warmup_step_s": warmup,
            "loss": losses,
            "timed_wall_s": timed_wall,
        },
        "padded": {
            "micro_batch_rows": args.micro,
            "micro_batches": len(padded_micro),
            "seq_len": padded_len,
            "build_micro_batches_s": padded_build_s,
        },
        "packed": {
            "max_tokens_per_microbatch": budget,
            "budget": f"{args.budget_factor} x (longest prompt + cap) = {budget}",
            "micro_batches": len(pack_totals),
            "pack_tokens": pack_totals,
            "rows_per_pack": [len(m.layout.rows) for m in packs.micro if m.layout is not None],
            "build_micro_batches_s": packed_build_s,
        },
        "attention_score_entries": attention,
        "ratios": ratios,
        "goals": goals,
        "result": result,
        "code": code_state(),
        "machine": {
            "cpus": os.cpu_count(),
            "threads": THREADS,
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
        },
    }

    print()
    print(f"Response-length mix: {MIX['source']}")
    print(f"  {MIX['response_length']}, cap {args.cap}; prompts {MIX['prompt_length']}")
    print(
        f"  {args.rows} rows (seed {args.seed}): response mean {statistics.fmean(responses):.0f}, "
        f"median {statistics.median(responses):.0f}, {n_at_cap} at the cap; "
        f"batch width {batch.seq_len}"
    )
    print(
        f"Model: Qwen2 {MODEL['num_hidden_layers']} layers, hidden {MODEL['hidden_size']}, "
        f"ffn {MODEL['intermediate_size']}, {MODEL['num_attention_heads']}/"
        f"{MODEL['num_key_value_heads']} heads, vocab {MODEL['vocab_size']}, "
        f"{params / 1e6:.2f}M params, fp32, random weights"
    )
    print(
        f"Machine: {os.cpu_count()} cores, {THREADS} threads, one process "
        "(timings on the 2-core machine; a CI run may share it)"
    )
    print(
        f"padded: {len(padded_micro)} micro-batches of {args.micro} x {padded_len}; "
        f"packed: {len(pack_totals)} packs <= {budget} tokens {pack_totals}"
    )
    print(f"tokens: useful {useful_tokens}, padded {padded_tokens}, packed {packed_tokens}")
    print(
        f"train_step median of {args.repeats} (after 1 warm-up): padded {padded_s:.3f} s "
        f"{[round(t, 3) for t in times['padded']]}, packed {packed_s:.3f} s "
        f"{[round(t, 3) for t in times['packed']]}"
    )
    for name, value in ratios.items():
        print(f"  {name} = {value:.3f}")
    print(
        "  attention score entries padded / packed: "
        f"{attention['padded / packed_block_diagonal']:.2f} (block-diagonal), "
        f"{attention['padded / packed_bucketed']:.2f} (power-of-two buckets); "
        f"micro-batch build: padded {padded_build_s * 1e3:.0f} ms, "
        f"packed {packed_build_s * 1e3:.0f} ms"
    )
    for name, ok in goals.items():
        print(f"  goal {name}: {'met' if ok else 'MISSED'}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    details_path = args.out.with_name(args.out.stem + "_details.json")
    details_path.write_text(json.dumps(details, indent=2) + "\n")
    print(f"wrote {args.out} and {details_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
