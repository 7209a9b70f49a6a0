"""The Megatron engine's decode loop before and after the host-sync-free step, CPU.

Two variants of ``MegatronGenerationBackend`` on the same random model (a ``--preset``,
fp32), prompts (random ids, padded rows) and sampling (temperature 1, no stop token: every
row decodes ``T`` tokens), in THIS process, interleaved:

  before  the per-token loop: the host reads the rows' state after every token
          (``check_every=1``), the growing cache slice, and Megatron's RNG-tracker fork
          around attention dropout at every layer (its CPU-state ``.item()`` included);
  after   the defaults: a look every 16 tokens, the static step (fixed shapes: what a
          CUDA graph replays on a GPU), forks off during generation.

Per variant: ms per decoded token step (wall time of a call / T; one step decodes every
row), aten ops per token step and host syncs per token step (``HostSyncCounter``,
device/host_syncs.py: from the difference between a T and a 2T call, so the prefill and
the per-call costs cancel), and for ``after`` the ops the host would still launch per
token with the forward in a CUDA graph (everything outside the captured step).
On a GPU the launch count and the syncs set the pace; this CPU's wall times are shown
for the record and for the ratio only.

Usage: python bench/decode_step.py [--preset tiny-qwen2] [--rows 4x8] [--tokens 128]
           [--repeats 3] [--out bench/results/decode_step_cpu.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from dapo_megatron.config.model_arch import (
    HF_ARCHITECTURES,
    PRESETS,
    arch_from_hf_config,
    hf_config,
)
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.shared.sampling import SamplingParams


def _count(engine, prompts, sampling: SamplingParams) -> dict[str, float]:
    """Ops and host syncs of one call, and the ops inside the (graphable) static step."""
    from dapo_megatron.device.host_syncs import HostSyncCounter
    from dapo_megatron.megatron import decode_step

    inner = {"ops": 0}
    real_run = decode_step.StaticDecodeStep._run

    def counted(step):
        with HostSyncCounter() as nested:
            out = real_run(step)
        inner["ops"] += nested.ops
        return out

    decode_step.StaticDecodeStep._run = counted
    try:
        with HostSyncCounter() as counter:
            engine.generate(prompts, sampling)
    finally:
        decode_step.StaticDecodeStep._run = real_run
    return {"ops": counter.ops, "syncs": counter.total, "graphed_ops": inner["ops"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny-qwen2", choices=sorted(PRESETS))
    parser.add_argument("--rows", default="4x8", help="PROMPTSxN")
    parser.add_argument("--tokens", type=int, default=128, help="decoded tokens per row (T)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "decode_step_cpu.json"
    )
    args = parser.parse_args()
    from dapo_megatron.megatron import decode_mode, inference
    from dapo_megatron.megatron.decode_step import DecodeOptions
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel

    num_prompts, n = (int(x) for x in args.rows.split("x"))
    config = hf_config(PRESETS[args.preset])
    torch.manual_seed(0)
    hf_model = getattr(transformers, HF_ARCHITECTURES[config.model_type])(config)
    dims = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)
    initialize_parallel(dims, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        arch = arch_from_hf_config(config.to_dict(), "bench model")
        model = inference.MegatronGenerationBackend.from_hf_checkpoint(
            tmp, arch, dims, "fp32"
        )._model
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(8, 33, (num_prompts,), generator=gen)
    prompts = [torch.randint(0, arch.vocab_size, (int(s),), generator=gen).tolist() for s in sizes]
    engines = {
        "before": inference.MegatronGenerationBackend(
            model, arch, dims, decode=DecodeOptions(check_every=1, static_cache=False)
        ),
        "after": inference.MegatronGenerationBackend(model, arch, dims),
    }
    real_forks_off = decode_mode.rng_forks_off

    @contextlib.contextmanager
    def variant(name: str):
        # "before" keeps Megatron's per-layer RNG fork, as the loop did.
        inference.rng_forks_off = real_forks_off if name == "after" else contextlib.nullcontext
        try:
            yield engines[name]
        finally:
            inference.rng_forks_off = real_forks_off

    def sampling(tokens: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, max_tokens=tokens, n=n, seed=0)

    load_before = os.getloadavg()
    result: dict[str, dict] = {}
    for name in engines:
        with variant(name) as engine:
            engine.generate(prompts, sampling(args.tokens))  # warm-up
            short = _count(engine, prompts, sampling(args.tokens))
            long = _count(engine, prompts, sampling(2 * args.tokens))
        per_token = {k: (long[k] - short[k]) / args.tokens for k in long}
        result[name] = {
            "ops_per_token": per_token["ops"],
            "host_syncs_per_token": per_token["syncs"],
            "host_launched_ops_per_token_graphed": (
                per_token["ops"] - per_token["graphed_ops"] if name == "after" else None
            ),
            "ms_per_token_all": [],
        }
    for _ in range(args.repeats):
        for name in engines:
            with variant(name) as engine:
                start = time.perf_counter()
                engine.generate(prompts, sampling(args.tokens))
                result[name]["ms_per_token_all"].append(
                    1e3 * (time.perf_counter() - start) / args.tokens
                )
    load_after = os.getloadavg()
    destroy_parallel()
    for r in result.values():
        r["ms_per_token"] = statistics.median(r["ms_per_token_all"])
        # On a busy machine the fastest repeat is the one least disturbed by others.
        r["ms_per_token_min"] = min(r["ms_per_token_all"])
    before, after = result["before"], result["after"]
    ratios = {
        "ms_per_token_after_over_before": after["ms_per_token"] / before["ms_per_token"],
        "ops_per_token_after_over_before": after["ops_per_token"] / before["ops_per_token"],
    }
    print(f"\nDecode step, {args.preset} fp32, {num_prompts * n} rows x {args.tokens} tokens, CPU")
    print(
        f"{'':>8} {'ms/token':>9} {'ops/token':>10} {'syncs/token':>12} {'host ops/token (graph)':>23}"
    )
    for name, r in result.items():
        graphed = r["host_launched_ops_per_token_graphed"]
        print(
            f"{name:>8} {r['ms_per_token']:>9.2f} {r['ops_per_token']:>10.0f} "
            f"{r['host_syncs_per_token']:>12.4f} {'-' if graphed is None else f'{graphed:.0f}':>23}"
        )
    print(", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    record = {
        "benchmark": "decode_step",
        "model": {"preset": args.preset, "parameters": arch.num_parameters(), "dtype": "fp32"},
        "config": {"rows": num_prompts * n, "tokens": args.tokens, "repeats": args.repeats},
        "before": before,
        "after": after,
        **ratios,
        "machine": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1min_before_after": [load_before[0], load_after[0]],
        "torch": torch.__version__,
        "method": "same process, same model/prompts/sampling; counts from the difference of "
        "a T and a 2T call; times: median of interleaved repeats after a warm-up "
        "(see bench/decode_step.py)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
