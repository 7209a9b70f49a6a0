"""The in-process measurements of bench/gpu_run.py: versions, the device, the prompt length,
dapo-plan's peaks, the export check, transformers' generate and the kernel check; and the
decode check's command and reading (bench/decode_step.py, a child process).

They run in gpu_run.py's own process (torch imported lazily: the module imports without
it), under its hard stop's SIGALRM (gpu_run_guard.alarm).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import gpu_run_figures as figures

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "configs" / "dapo_base.yaml"


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


def kernel_check(arch: Any) -> dict[str, Any]:
    """The compiled Triton kernels the policy runs on CUDA (bf16: ``impl="auto"`` picks them,
    kernels/dispatch.py), at the preset's output layer (H x V) on 2,048 tokens, forward and
    backward against the chunked torch path, and the fused PG loss against float64 torch:
    gpu_check/kernels.py's sections at a small size (a few seconds, compilation included).
    Raises what they raise (a compile error, a mismatch: AssertionError with the figures)."""
    from dapo_megatron.gpu_check.kernels import logprob_section, pg_loss_section

    started = time.perf_counter()
    logprob = logprob_section(n=2048, h=arch.hidden_size, v=arch.vocab_size)
    pg = pg_loss_section(b=8, t=1024)
    release_cuda_cache()
    if isinstance(logprob, str) or isinstance(pg, str):
        raise RuntimeError(logprob if isinstance(logprob, str) else str(pg))
    keep = ("max_abs_lp_triton_vs_chunked", "rel_dH_triton_vs_chunked", "rel_dW_triton_vs_chunked")
    return {
        "ok": True,
        "seconds": round(time.perf_counter() - started, 1),
        "logprob": {k: logprob[k] for k in keep if k in logprob},
        "pg_loss": {k: pg[k] for k in ("abs_loss_err", "max_abs_grad_err") if k in pg},
    }


# bench/decode_step.py as a child of gpu_run.py (run_cli runs ``python -c CODE ARGS``).
DECODE_CHECK = (
    "import runpy, sys; sys.argv[0] = 'bench/decode_step.py'; "
    "runpy.run_path('bench/decode_step.py', run_name='__main__')"
)


def decode_check_args(preset: str, out: Path) -> list[str]:
    """The decode check: the preset's first 4 layers (the graph capture does not depend on
    depth; a whole model's load would cost the timed runs' time), 32 rows x 64 tokens,
    eager against graphed, on the card, in ~20 s."""
    return [
        *("--preset", preset, "--layers", "4", "--rows", "4x8", "--tokens", "64"),
        *("--repeats", "2", "--device", "cuda", "--out", str(out)),
    ]


def decode_check_result(out: Path) -> dict[str, Any]:
    """What gpu_run keeps of the decode check's JSON: the graph check and ms per token."""
    record = json.loads(out.read_text())
    return {
        "graph_check": record["graph_check"],
        "layers": record["model"]["layers"],
        "ms_per_token": {
            k: record[k]["ms_per_token"] for k in ("before", "after_eager", "after") if k in record
        },
    }
