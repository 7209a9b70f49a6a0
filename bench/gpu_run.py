"""End to end on one device: dapo-train, resume, dapo-export and HF generate, per model.

For each model preset (``--models``; on a GPU qwen3-0.6b and qwen3-1.7b, on a CPU the tiny
tiny-qwen3), in ONE command (scripts/gpu_run.sh):

1. a random-weight HF checkpoint of the preset's real shape (vocabulary included; the
   char tokenizer's tokens are its first rows) by the package's own
   ``create_tiny_model``;
2. ``dapo-train`` (the real CLI, a subprocess) on configs/dapo_base.yaml with overrides:
   one device, colocated, Megatron-Core generation (vLLM cannot travel to the test
   machine), the synthetic arithmetic task and verifier, bf16 on a GPU (fp32 on a CPU),
   ``--steps`` steps without checkpoints: the timed run. A random model scores 0
   everywhere, so every group has zero variance: dynamic sampling is off (it would filter
   everything) and a small entropy bonus (``--entropy-coef``) gives the update a non-zero
   gradient, so the resume check below compares a real update. A random model almost never
   samples EOS: responses run to ``--response-length`` tokens. The old-logprob pass is
   forced (``policy.old_logprob_pass=always``) so the logprob phase is timed;
3. the resume check: the same run for one step with a checkpoint, then resumed from it for
   steps 2 and 3 (without a second checkpoint: a 1.7B one is ~24 GB with its optimizer
   states); ``resume_bit_exact`` is whether those steps equal the timed run's exactly on
   every key of gpu_run_figures.RESUME_KEYS (step 3 also depends on the restored Adam
   moments); ``details.step1_mismatches`` compares step 1 of both, where no resume is
   involved: differences there are the device's non-determinism, not the checkpoint's;
4. ``dapo-export`` (the CLI) of the step-1 checkpoint; ``export_ok``: transformers loads
   it, its parameter count is the preset's and a forward gives finite logits;
5. ``transformers`` ``generate`` on the same card, same batch and length (forced with
   min_new_tokens), for the engine comparison (``hf_generate_tokens_per_s``).

Figures (gpu_run_figures.py): median phase times of the timed steps, throughputs, MFU over
the card's dense bf16 peak (null on a CPU), per-phase peak memory measured by the policy
rank (device/phase_memory.py; null on a CPU) and planned by dapo-plan's model
(planning/memory.py) for the same recipe. Writes ``--out`` (default
bench/results/gpu_run_<gpu>.json, rewritten after each model, so a command stopped at its
time limit keeps the models done; ``--deadline-s`` starts no model past it) and prints a
summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a file (bench/ is no package): its sibling helpers and the checkout import.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import gpu_run_figures as figures  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "configs" / "dapo_base.yaml"
GPU_MODELS = "qwen3-0.6b,qwen3-1.7b"
CPU_MODELS = "tiny-qwen3"
TRAIN = "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())"
EXPORT = "import sys; from dapo_megatron.cli import export_main; sys.exit(export_main())"
# Lines of dapo-train's output worth echoing as progress (the rest goes to the log file).
ECHO = ("step ", "[resume]", "dapo-train:", "dapo-export:", "error", "preempted")


def log(msg: str) -> None:
    """One progress line, flushed (the device returns only what was printed)."""
    print(f"[gpu-run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv: list[str] | None, cuda: bool) -> argparse.Namespace:
    """Command-line settings; defaults differ between a GPU and a CPU (CI)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--models",
        default=GPU_MODELS if cuda else CPU_MODELS,
        help="model_arch presets, comma separated",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON to write (default bench/results/gpu_run_<gpu>.json)",
    )
    p.add_argument("--steps", type=int, default=3, help="timed steps (>= 2; the first is warm-up)")
    p.add_argument("--prompts", type=int, default=8 if cuda else 4, help="prompts per step")
    p.add_argument("--samples", type=int, default=8 if cuda else 4, help="samples per prompt")
    p.add_argument(
        "--response-length",
        type=int,
        default=1024 if cuda else 16,
        help="generation.max_response_length (a random model runs to it)",
    )
    p.add_argument(
        "--max-tokens-per-microbatch",
        type=int,
        default=8192 if cuda else 2048,
        help="packed micro-batch size of the logprob and train passes",
    )
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument(
        "--entropy-coef",
        type=float,
        default=1e-3,
        help="entropy bonus: a non-zero gradient when every advantage is 0",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="models and run directories (default: a temporary directory, deleted)",
    )
    p.add_argument("--no-hf-generate", action="store_true", help="skip the transformers baseline")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no further model after this many seconds (the JSON so far stays)",
    )
    p.add_argument(
        "train_overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="extra dapo-train overrides for every run",
    )
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be >= 2: the resume check compares step 2")
    return args


def versions() -> dict[str, str | None]:
    """Versions of what the run uses (None where a package is missing)."""
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "triton", "megatron-core", "transformers", "ray"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def overrides(
    args: argparse.Namespace,
    preset: str,
    model: Path,
    run_dir: Path,
    *,
    device: str,
    steps: int,
    checkpoint: bool,
) -> list[str]:
    """dapo-train's overrides of configs/dapo_base.yaml for one run (module docstring)."""
    seq = 32 + args.response_length  # data.max_prompt_length + the response cap
    batch = args.prompts * args.samples
    return [
        f"run.output_dir={run_dir}",
        "run.name=gpu-run",
        f"run.seed={args.seed}",
        f"policy.model_name_or_path={model}",
        f"policy.model_arch={preset}",
        f"policy.precision={'bf16' if device == 'cuda' else 'fp32'}",
        "policy.allow_local_spec=true",  # no Transformer Engine on the test machine
        f"policy.optimizer.lr={args.lr}",
        f"policy.optimizer.min_lr={args.lr}",
        # Fixed, not derived from max_num_steps: the 1-step and 2-step runs of the resume
        # check must have the timed run's schedule.
        "policy.scheduler.lr_warmup_steps=0",
        "policy.scheduler.lr_decay_steps=1000",
        f"policy.train_global_batch_size={batch}",
        f"policy.max_tokens_per_microbatch={max(args.max_tokens_per_microbatch, seq)}",
        "policy.old_logprob_pass=always",
        f"policy.max_total_sequence_length={seq}",
        "generation.backend=megatron",
        f"generation.max_response_length={args.response_length}",
        f"generation.engine.max_num_seqs={batch}",
        f"dapo.num_prompts_per_step={args.prompts}",
        f"dapo.num_generations_per_prompt={args.samples}",
        f"dapo.max_num_steps={steps}",
        "dapo.dynamic_sampling.enabled=false",
        "dapo.overlong_buffer.enabled=false",
        f"dapo.loss.entropy_coef={args.entropy_coef}",
        "sft_warmup.num_steps=0",
        "validation.val_period=0",
        "validation.val_at_start=false",
        "data.format=arithmetic",
        "data.train_path=null",
        "data.val_path=null",
        "data.max_prompt_length=32",
        "data.apply_chat_template=false",
        "data.arithmetic.difficulty=3",
        "data.arithmetic.num_val=16",
        "reward.verifier=arithmetic",
        "reward.num_workers=1",
        "cluster.num_nodes=1",
        "cluster.gpus_per_node=1",
        f"cluster.device={device}",
        "cluster.colocated=true",
        f"checkpointing.enabled={'true' if checkpoint else 'false'}",
        "checkpointing.save_period=1",
        "checkpointing.keep_last=1",
        "logger.tensorboard_enabled=false",
        "logger.plots=false",
        "logger.progress_bar=false",
        *args.train_overrides,
    ]


def run_cli(code: str, cli_args: list[str], logfile: Path, label: str) -> float:
    """Run a dapo CLI in a subprocess, echoing its progress lines; returns its wall
    seconds. Raises RuntimeError with the log's tail when it fails."""
    env = dict(
        os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1"
    )
    started = time.perf_counter()
    with logfile.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *cli_args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            if line.startswith(ECHO):
                log(f"{label}: {line.rstrip()}")
        code_ = proc.wait()
    wall = time.perf_counter() - started
    if code_ != 0:
        tail = logfile.read_text()[-4000:]
        raise RuntimeError(f"{label} exited {code_} after {wall:.0f} s; log {logfile}:\n{tail}")
    log(f"{label}: done in {wall:.1f} s")
    return wall


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The JSON rows of a run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def by_step(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The training-step rows by step number (a resumed run's last row wins)."""
    return {int(r["step"]): r for r in rows if r.get("step", 0) > 0 and "loss" in r}


def mean_prompt_tokens(model: Path, train_overrides: list[str]) -> float:
    """Mean prompt length in tokens of the training set the runs draw from."""
    import transformers

    from dapo_megatron.config.loader import load_config
    from dapo_megatron.data.datasets import build_datasets

    cfg = load_config(BASE, train_overrides, validate=False).config
    records = build_datasets(cfg.data, seed=cfg.run.seed).train.records[:512]
    tok = transformers.AutoTokenizer.from_pretrained(model)
    lengths = [len(tok.encode(r.text, add_special_tokens=False)) for r in records]
    return sum(lengths) / len(lengths)


def planned_peaks(train_overrides: list[str], gpu_mem_gib: float) -> dict[str, float | None]:
    """dapo-plan's per-phase peak (GiB, worst GPU) for the same recipe; generation is None
    with the Megatron backend (the planner models a vLLM engine's phase only)."""
    from dapo_megatron.config.loader import load_config
    from dapo_megatron.planning.memory import memory_inputs, plan_memory

    plan = load_config(BASE, train_overrides).require_plan()
    report = plan_memory(memory_inputs(plan, gpu_mem_gib))
    planned: dict[str, float | None] = {p: None for p in figures.PHASES}
    planned.update({phase.name: round(phase.peak, 3) for phase in report.phases})
    return planned


def check_export(hf_dir: Path, arch: Any) -> tuple[bool, str]:
    """(export_ok, why): transformers loads the export with the preset's parameter count
    and its forward gives finite logits over the vocabulary."""
    import torch
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
        n = sum(p.numel() for p in model.parameters())
        if n != arch.num_parameters():
            return False, f"{n} parameters, the preset has {arch.num_parameters()}"
        ids = torch.tensor([tok.encode("3+5+1=", add_special_tokens=False)])
        with torch.no_grad():
            logits = model(ids).logits
        if logits.shape[-1] != arch.vocab_size or not bool(torch.isfinite(logits).all()):
            return (
                False,
                f"logits {tuple(logits.shape)}, finite={bool(torch.isfinite(logits).all())}",
            )
        return True, f"loaded {n} parameters, finite logits {tuple(logits.shape)}"
    except Exception as e:  # noqa: BLE001 - any failure to load is the figure
        return False, f"{type(e).__name__}: {e}"


def hf_generate_tps(model_dir: Path, args: argparse.Namespace, device: str) -> float:
    """Tokens/s of transformers ``generate`` (KV cache, sampling at temperature 1) of the
    same weights, batch (prompts x samples) and forced length (min_new_tokens)."""
    import torch
    import transformers

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    model.eval()
    batch = args.prompts * args.samples
    ids = torch.tensor([tok.encode("3+5+1=", add_special_tokens=False)] * batch, device=device)
    mask = torch.ones_like(ids)

    def generate(n: int) -> None:
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )

    generate(4)  # warm-up: kernels, allocator
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    generate(args.response_length)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return batch * args.response_length / seconds


def release_cuda_cache() -> None:
    """Return the driver's cached CUDA blocks (an HF model's) to the device."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_model(
    preset: str, args: argparse.Namespace, work: Path, ctx: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every figure of one preset: (its JSON entry, details)."""
    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.data.tiny_model import create_tiny_model

    arch = PRESETS[preset]
    device = ctx["device_kind"]
    root = work / preset
    model = root / "model"
    started = time.perf_counter()
    create_tiny_model(model, arch=arch, seed=args.seed)
    log(
        f"{preset}: random checkpoint ({arch.num_parameters() / 1e9:.3f} B parameters) "
        f"in {time.perf_counter() - started:.1f} s"
    )

    def ov(run: str, steps: int, checkpoint: bool) -> list[str]:
        return overrides(
            args, preset, model, root / run, device=device, steps=steps, checkpoint=checkpoint
        )

    timed_ov = ov("timed", args.steps, False)
    details: dict[str, Any] = {"wall_s": {}}
    walls = details["wall_s"]
    walls["timed_run"] = run_cli(
        TRAIN, ["--config", str(BASE), *timed_ov], root / "timed.log", f"{preset} timed"
    )
    rows = metrics_rows(root / "timed")

    # Resume: one step with its checkpoint, then steps 2..last from it (no second
    # checkpoint). Step 3 depends on the restored Adam moments too, step 2 only on the
    # restored weights, data order and sampling state.
    last = min(args.steps, 3)
    walls["resume_part1"] = run_cli(
        TRAIN,
        ["--config", str(BASE), *ov("resumed", 1, True)],
        root / "resume1.log",
        f"{preset} resume 1/2",
    )
    walls["resume_part2"] = run_cli(
        TRAIN,
        ["--config", str(BASE), *ov("resumed", last, False)],
        root / "resume2.log",
        f"{preset} resume 2/2",
    )
    resumed_text = (root / "resume2.log").read_text()
    straight, resumed = by_step(rows), by_step(metrics_rows(root / "resumed"))
    if any(k not in resumed for k in range(2, last + 1)) or "[resume]" not in resumed_text:
        mismatches = ["the second part did not resume from the step-1 checkpoint"]
    else:
        mismatches = [
            f"step {k}: {m}"
            for k in range(2, last + 1)
            for m in figures.resume_mismatches(straight[k], resumed[k])
        ]
    details["resume_mismatches"] = mismatches
    # Step 1 of both runs starts from the same weights without any resume: a difference
    # there is the device's non-determinism, not the checkpoint's (it tells the two apart).
    step1 = by_step(metrics_rows(root / "resumed")).get(1)
    details["step1_mismatches"] = (
        figures.resume_mismatches(straight[1], step1) if step1 and 1 in straight else None
    )

    checkpoint = root / "resumed" / "checkpoints" / "step_000001"
    hf_dir = root / "hf"
    walls["export"] = run_cli(
        EXPORT,
        ["--checkpoint", str(checkpoint), "--out", str(hf_dir)],
        root / "export.log",
        f"{preset} export",
    )
    export_ok, details["export"] = check_export(hf_dir, arch)
    log(f"{preset}: export_ok={export_ok} ({details['export']})")

    shape = figures.Shape(
        matmul_params=figures.matmul_params(
            arch.num_parameters(), arch.vocab_size, arch.hidden_size, arch.tie_word_embeddings
        ),
        num_layers=arch.num_layers,
        query_width=arch.query_width,
    )
    prompt_tokens = mean_prompt_tokens(model, timed_ov)
    step = figures.step_figures(
        rows,
        shape=shape,
        samples_per_step=args.prompts * args.samples,
        mean_prompt_tokens=prompt_tokens,
        peak=ctx["peak"],
    )
    details.update(
        mean_prompt_tokens=prompt_tokens,
        train_tokens_per_step=step.pop("train_tokens_per_step"),
        mean_seq_len=step.pop("mean_seq_len"),
        response_length_mean=figures.median_of(figures.timed_rows(rows), "response_length/mean"),
        timed_steps=len(figures.timed_rows(rows)),
    )

    hf_tps = None
    if not args.no_hf_generate:
        started = time.perf_counter()
        hf_tps = hf_generate_tps(model, args, device)
        release_cuda_cache()  # the model is gone: its blocks back before the next model
        walls["hf_generate"] = time.perf_counter() - started
        log(f"{preset}: transformers generate {hf_tps:.0f} tokens/s")
    entry = figures.model_entry(
        {
            "model": preset,
            "params": arch.num_parameters(),
            **step,
            "peak_gib_measured": figures.measured_peaks(rows),
            "peak_gib_planned": planned_peaks(timed_ov, ctx["gpu_mem_gib"]),
            "resume_bit_exact": not mismatches,
            "export_ok": export_ok,
            "hf_generate_tokens_per_s": hf_tps,
        }
    )
    if not args.work_dir:  # a 1.7B model, checkpoint and export are ~35 GB: free the disk
        shutil.rmtree(root, ignore_errors=True)
    return entry, details


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return "/".join(
            _fmt(v if not isinstance(v, dict) else v.get("allocated")) for v in value.values()
        )
    return str(value)


def summary_table(models: dict[str, dict[str, Any]]) -> str:
    """The per-model figures as a text table, one row per key."""
    names = list(models)
    rows = [["key", *names]] + [
        [k, *(_fmt(models[m][k]) for m in names)] for k in figures.MODEL_KEYS[1:]
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def device_context() -> dict[str, Any]:
    """The device's name, kind, memory and MFU peak."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        mem = torch.cuda.get_device_properties(0).total_memory / 2**30
        return {
            "device": name,
            "device_kind": "cuda",
            "gpu_mem_gib": round(mem, 1),
            "peak": figures.peak_for(name),
        }
    # The memory plan needs a card size; the CPU numbers are informative only.
    return {
        "device": f"cpu ({platform.processor() or platform.machine()})",
        "device_kind": "cpu",
        "gpu_mem_gib": 80.0,
        "peak": None,
    }


def write_json(out: Path, result: dict[str, Any], started: float) -> None:
    """Write the results so far (atomically: a kill never leaves half a file)."""
    result["wall_s"] = round(time.perf_counter() - started, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    """Run every model, write the JSON, print the table."""
    ctx = device_context()
    args = parse_args(argv, ctx["device_kind"] == "cuda")
    slug = figures.device_slug(ctx["device"] if ctx["device_kind"] == "cuda" else None)
    out = args.out or REPO / "bench" / "results" / f"gpu_run_{slug}.json"
    log(f"device {ctx['device']}; models {args.models}; out {out}")
    peak = ctx["peak"]
    result: dict[str, Any] = {
        "device": ctx["device"],
        "gpu_mem_gib": ctx["gpu_mem_gib"] if ctx["device_kind"] == "cuda" else None,
        "versions": versions(),
        "spec": "local spec, no Transformer Engine",
        "generation_backend": "megatron (Megatron-Core inference on the policy's model)",
        "mfu_peak": None if peak is None else {"name": peak.name, "tflops": peak.tflops},
        "mfu_note": None
        if peak is not None
        else (
            "no CUDA device: MFU needs a card's dense bf16 peak"
            if ctx["device_kind"] == "cpu"
            else f"no known dense bf16 peak for {ctx['device']}"
        ),
        "peak_gib_measured_note": "torch.cuda max_memory_allocated/reserved of the policy "
        "rank per phase (device/phase_memory.py); null without CUDA",
        "peak_gib_planned_note": "dapo-plan's model (planning/memory.py) for the same recipe "
        "and card size; it plans a generation phase for vLLM engines only: null here",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "models": {},
        "details": {},
    }
    started = time.perf_counter()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu-run-"))
    work.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        for preset in [m for m in args.models.split(",") if m]:
            elapsed = time.perf_counter() - started
            if args.deadline_s is not None and elapsed > args.deadline_s:
                log(f"{preset}: skipped, {elapsed:.0f} s > --deadline-s {args.deadline_s:g}")
                result["details"][preset] = {"skipped": f"deadline after {elapsed:.0f} s"}
                failed = True
                continue
            try:
                entry, details = run_model(preset, args, work, ctx)
            except Exception as e:  # noqa: BLE001 - the next model still runs
                log(f"{preset}: FAILED: {e}")
                result["details"][preset] = {"error": str(e)[-4000:]}
                failed = True
                continue
            result["models"][preset] = entry
            result["details"][preset] = details
            log(f"{preset}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in entry.items()))
            write_json(out, result, started)  # a run killed by its time limit keeps these
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    write_json(out, result, started)
    if result["models"]:
        print(summary_table(result["models"]), flush=True)
    log(f"wrote {out} in {result['wall_s']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
