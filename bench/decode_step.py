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

On CUDA (``--device cuda``, bf16) a third variant, ``after_eager`` (the static step without
its CUDA graph), and the graph check: greedy tokens of the graphed engine against the
eager one (``graph_ok``: no error and every row equal); the counts are left to the CPU run
(they do not depend on the device). ``--layers`` keeps the preset's first layers, for a
quick check: scripts/gpu_run.sh runs one before its timed runs and decodes eagerly
(generation.engine.enforce_eager) if the graph fails it.

Usage: python bench/decode_step.py [--preset tiny-qwen2] [--rows 4x8] [--tokens 128]
           [--repeats 3] [--device cpu|cuda] [--layers N]
           [--out bench/results/decode_step_<device>.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = args.out or Path(__file__).parent / "results" / f"decode_step_{device}.json"
    from dapo_megatron.megatron import decode_mode, inference
    from dapo_megatron.megatron.decode_step import DecodeOptions
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel

    num_prompts, n = (int(x) for x in args.rows.split("x"))
    preset = PRESETS[args.preset]
    if args.layers:
        preset = dataclasses.replace(preset, num_layers=min(args.layers, preset.num_layers))
    config = hf_config(preset)
    torch.manual_seed(0)
    hf_model = getattr(transformers, HF_ARCHITECTURES[config.model_type])(config)
    dims = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)
    initialize_parallel(dims, seed=0)
    precision = "bf16" if device == "cuda" else "fp32"
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        del hf_model
        arch = arch_from_hf_config(config.to_dict(), "bench model")
        model = inference.MegatronGenerationBackend.from_hf_checkpoint(
            tmp, arch, dims, precision
        )._model
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(8, 33, (num_prompts,), generator=gen)
    prompts = [torch.randint(0, arch.vocab_size, (int(s),), generator=gen).tolist() for s in sizes]
    options = {"before": DecodeOptions(check_every=1, static_cache=False), "after": None}
    if device == "cuda":
        options["after_eager"] = DecodeOptions(cuda_graphs=False)
    engines = {
        name: inference.MegatronGenerationBackend(model, arch, dims, decode=opt)
        for name, opt in options.items()
    }
    graph = _graph_check(engines, prompts, args.tokens) if device == "cuda" else None
    real_forks_off = decode_mode.rng_forks_off

    @contextlib.contextmanager
    def variant(name: str):
        # "before" keeps Megatron's per-layer RNG fork, as the loop did.
        inference.rng_forks_off = contextlib.nullcontext if name == "before" else real_forks_off
        try:
            yield engines[name]
        finally:
            inference.rng_forks_off = real_forks_off

    def sampling(tokens: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, max_tokens=tokens, n=n, seed=0)

    load_before = os.getloadavg()
    result: dict[str, dict] = {name: {"ms_per_token_all": []} for name in engines}
    timed = [k for k in engines if not (k == "after" and graph and not graph["graph_ok"])]
    for name in timed:
        with variant(name) as engine:
            engine.generate(prompts, sampling(args.tokens))  # warm-up (and graph capture)
            if device != "cpu":
                continue  # the counts are the CPU run's: they do not depend on the device
            short = _count(engine, prompts, sampling(args.tokens))
            long = _count(engine, prompts, sampling(2 * args.tokens))
        per_token = {k: (long[k] - short[k]) / args.tokens for k in long}
        result[name].update(
            ops_per_token=per_token["ops"],
            host_syncs_per_token=per_token["syncs"],
            host_launched_ops_per_token_graphed=(
                per_token["ops"] - per_token["graphed_ops"] if name == "after" else None
            ),
        )
    for _ in range(args.repeats):
        for name in timed:
            with variant(name) as engine:
                start = time.perf_counter()
                engine.generate(prompts, sampling(args.tokens))
                if device == "cuda":
                    torch.cuda.synchronize()
                result[name]["ms_per_token_all"].append(
                    1e3 * (time.perf_counter() - start) / args.tokens
                )
    load_after = os.getloadavg()
    destroy_parallel()
    for r in result.values():
        times = r["ms_per_token_all"]
        r["ms_per_token"] = statistics.median(times) if times else None
        # On a busy machine the fastest repeat is the one least disturbed by others.
        r["ms_per_token_min"] = min(times) if times else None
    ratios = {
        f"{key}_after_over_before": _ratio(result["after"], result["before"], key)
        for key in ("ms_per_token", "ms_per_token_min", "ops_per_token")
    }
    print(
        f"\nDecode step, {args.preset} ({arch.num_layers} layers) {precision}, "
        f"{num_prompts * n} rows x {args.tokens} tokens, {device}"
    )
    print(
        f"{'':>12} {'ms/token':>9} {'min':>7} {'ops/token':>10} {'syncs/token':>12} {'graph host ops':>15}"
    )
    for name, r in result.items():
        print(
            f"{name:>12} {_fmt(r.get('ms_per_token'), '.2f'):>9} "
            f"{_fmt(r.get('ms_per_token_min'), '.2f'):>7} "
            f"{_fmt(r.get('ops_per_token'), '.0f'):>10} "
            f"{_fmt(r.get('host_syncs_per_token'), '.4f'):>12} "
            f"{_fmt(r.get('host_launched_ops_per_token_graphed'), '.0f'):>15}"
        )
    print(", ".join(f"{k} {_fmt(v, '.3f')}" for k, v in ratios.items()))
    if graph is not None:
        print(f"graph check: {graph}")
    record = {
        "benchmark": "decode_step",
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "model": {
            "preset": args.preset,
            "layers": arch.num_layers,
            "parameters": arch.num_parameters(),
            "dtype": precision,
        },
        "config": {"rows": num_prompts * n, "tokens": args.tokens, "repeats": args.repeats},
        **result,
        "graph_check": graph,
        **ratios,
        "machine": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1min_before_after": [load_before[0], load_after[0]],
        "torch": torch.__version__,
        "method": "same process, same model/prompts/sampling; counts (CPU) from the "
        "difference of a T and a 2T call; times: median of interleaved repeats after a "
        "warm-up (see bench/decode_step.py)",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


def _ratio(a: dict, b: dict, key: str) -> float | None:
    return a[key] / b[key] if a.get(key) and b.get(key) else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _graph_check(engines: dict, prompts: list[list[int]], tokens: int) -> dict:
    """Greedy tokens of the graphed engine against the eager static one (CUDA)."""
    greedy = SamplingParams(top_k=1, max_tokens=tokens)
    started = time.perf_counter()
    try:
        eager = engines["after_eager"].generate(prompts, greedy)
        graphed = engines["after"].generate(prompts, greedy)
    except Exception as e:  # noqa: BLE001 - the failure is the figure
        return {"graph_ok": False, "error": f"{type(e).__name__}: {e}"[:4000]}
    same = sum(
        a[0].response_token_ids == b[0].response_token_ids
        for a, b in zip(eager, graphed, strict=True)
    )
    return {
        "graph_ok": same == len(prompts),
        "greedy_rows_equal": f"{same}/{len(prompts)}",
        "seconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    main()
