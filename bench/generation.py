"""Rollout throughput of the Megatron generation backend vs HF transformers ``generate``, CPU.

Both providers run in THIS process, one after the other, on the same random tiny model
(fp32, a ``--preset`` of any family; default: the ``tiny-qwen2`` preset of the CPU
recipe), the same prompts (random token ids, lengths drawn from [min, max] prompt length,
so rows are padded) and the same sampling (temperature 1, no top-k/top-p, no stop token:
every row generates exactly ``--max-tokens`` tokens, so both do the same amount of work):

  megatron  ``MegatronGenerationBackend.generate`` (Megatron-Core GPTModel, static KV
            cache, our decode loop), all prompts x n rows in one batch, world size 1.
  hf        ``model.generate(do_sample=True)`` on the same rows (prompts repeated n times,
            left-padded with an attention mask, KV cache on), HF's default attention
            (SDPA).

Throughput = generated tokens / wall time of one call; the table reports the median of
``--repeats`` timed calls (interleaved between the providers) after one warm-up call
each. As a correctness side check, the
greedy (top_k=1 / do_sample=False) responses of both providers are compared row by row.

Usage: python bench/generation.py [--cases 16x8x16,16x8x128] [--repeats 3] [--threads N]
           [--out bench/results/generation_cpu.json]
Cases are PROMPTSxNxMAX_TOKENS.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from dapo_megatron.config.model_arch import (
    HF_ARCHITECTURES,
    PRESETS,
    ModelArch,
    arch_from_hf_config,
    hf_config,
)
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.shared.sampling import SamplingParams


def _prompts(num: int, lengths: tuple[int, int], vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lengths[0], lengths[1] + 1, (num,), generator=gen)
    return [torch.randint(0, vocab, (int(n),), generator=gen).tolist() for n in sizes]


def _hf_generate(model, rows: list[list[int]], max_tokens: int, greedy: bool) -> list[list[int]]:
    """Batched HF generation of `rows` (left-padded); returns each row's new tokens."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(row)
        mask[b, width - len(row) :] = 1
    sampling = (
        {"do_sample": False}
        if greedy
        else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    )
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        pad_token_id=0,
        **sampling,
    )
    return [row.tolist() for row in out[:, width:]]


def _time(providers: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
    """Wall times of each provider; repeats are interleaved (a, b, a, b, ...) so that a
    change of machine load between repeats hits both providers alike."""
    for fn in providers.values():
        fn()  # warm-up: allocator, lazy inits, rotary caches
    times: dict[str, list[float]] = {name: [] for name in providers}
    for _ in range(repeats):
        for name, fn in providers.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def _case(engine, hf_model, arch: ModelArch, spec: str, args: argparse.Namespace) -> dict:
    num_prompts, n, max_tokens = (int(x) for x in spec.split("x"))
    prompts = _prompts(num_prompts, (args.min_prompt, args.max_prompt), arch.vocab_size, 0)
    rows = [p for p in prompts for _ in range(n)]
    tokens = len(rows) * max_tokens
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, n=n, seed=0)

    def megatron() -> None:
        out = engine.generate(prompts, sampling)
        assert sum(s.response_length for g in out for s in g) == tokens

    def hf() -> None:
        out = _hf_generate(hf_model, rows, max_tokens, greedy=False)
        assert sum(len(r) for r in out) == tokens

    with torch.no_grad():
        times = _time({"megatron": megatron, "hf": hf}, args.repeats)
        greedy = engine.generate(prompts, SamplingParams(top_k=1, max_tokens=max_tokens))
        hf_greedy = _hf_generate(hf_model, prompts, max_tokens, greedy=True)
    same = sum(g[0].response_token_ids == h for g, h in zip(greedy, hf_greedy, strict=True))
    result = {
        "prompts": num_prompts,
        "n": n,
        "rows": len(rows),
        "max_tokens": max_tokens,
        "generated_tokens": tokens,
        "greedy_rows_equal_hf": f"{same}/{len(prompts)}",
    }
    for name, ts in times.items():
        result[name] = {
            "tokens_per_s": tokens / statistics.median(ts),
            "time_s_median": statistics.median(ts),
            "time_s_all": ts,
        }
    result["ratio_megatron_over_hf"] = (
        result["megatron"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny-qwen2", choices=sorted(PRESETS))
    parser.add_argument("--cases", default="16x8x16,16x8x128")
    parser.add_argument("--min-prompt", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "generation_cpu.json"
    )
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
    from dapo_megatron.megatron.inference import MegatronGenerationBackend

    config = hf_config(PRESETS[args.preset])
    torch.manual_seed(0)
    hf_model = getattr(transformers, HF_ARCHITECTURES[config.model_type])(config).eval()
    dims = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)
    initialize_parallel(dims, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        arch = arch_from_hf_config(config.to_dict(), "bench model")
        engine = MegatronGenerationBackend.from_hf_checkpoint(tmp, arch, dims, "fp32")
    load_before = os.getloadavg()
    cases = {spec: _case(engine, hf_model, arch, spec, args) for spec in args.cases.split(",")}
    load_after = os.getloadavg()
    destroy_parallel()

    print(f"\nGeneration throughput, {args.preset} fp32, CPU ({torch.get_num_threads()} threads)")
    print(
        f"{'case (PxNxT)':>14} {'rows':>5} {'megatron tok/s':>15} {'hf tok/s':>10} "
        f"{'ratio':>6} {'greedy = hf':>12}"
    )
    for spec, r in cases.items():
        print(
            f"{spec:>14} {r['rows']:>5} {r['megatron']['tokens_per_s']:>15.0f} "
            f"{r['hf']['tokens_per_s']:>10.0f} {r['ratio_megatron_over_hf']:>6.2f} "
            f"{r['greedy_rows_equal_hf']:>12}"
        )
    record = {
        "benchmark": "generation",
        "model": {"preset": args.preset, "parameters": arch.num_parameters(), "dtype": "fp32"},
        "config": {
            "cases": args.cases,
            "prompt_lengths": [args.min_prompt, args.max_prompt],
            "repeats": args.repeats,
            "temperature": 1.0,
            "stop_tokens": None,
        },
        "cases": cases,
        "machine": platform.platform(),
        "cpu_count": torch.multiprocessing.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # Other processes on the machine inflate both providers' times (the ratio is the
        # figure to read); 1-minute load averages before and after the measurement.
        "loadavg_1min_before_after": [load_before[0], load_after[0]],
        "torch": torch.__version__,
        "megatron_core": importlib.metadata.version("megatron-core"),
        "transformers": transformers.__version__,
        "method": "same process, same model/prompts/sampling; median of interleaved repeats "
        "after one warm-up; tokens/s = generated tokens / wall time (see bench/generation.py)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
