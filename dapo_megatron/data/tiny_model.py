"""Create the tiny CPU recipe's policy: a randomly initialised checkpoint, offline.

The tiny recipe (policy.init_model_if_missing) starts from a model no hub has: the HF model
of a ModelArch preset (any family: Qwen2ForCausalLM, Qwen3ForCausalLM,
Qwen3MoeForCausalLM...) with random weights, saved as an ordinary Hugging Face
checkpoint (config.json, model.safetensors) with the char tokenizer next to it, so every
later stage (Megatron weight loading, generation, evaluation) reads it like a real model.

The directory is written atomically (a temporary sibling renamed into place), so a crash
never leaves a half-written checkpoint that a later run would mistake for a model, and
creation is idempotent: an existing complete checkpoint is left untouched. Several processes
may race to create it (e.g. every rank of a first run); one rename wins and the others
use its result.

CLI: ``python -m dapo_megatron.data.tiny_model --out DIR [--seed N] [--preset NAME]``
(default preset: tiny-qwen2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dapo_megatron.config.model_arch import (
    HF_ARCHITECTURES,
    PRESETS,
    ModelArch,
    arch_from_hf_config,
    hf_config,
)
from dapo_megatron.data.tokenizer import build_char_tokenizer, save_char_tokenizer

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
"""Files whose presence makes a checkpoint directory complete."""


def is_complete_checkpoint(path: str | Path) -> bool:
    """Whether `path` holds every file of REQUIRED_FILES."""
    return all((Path(path) / name).is_file() for name in REQUIRED_FILES)


def _check_existing(out: Path, arch: ModelArch) -> None:
    """Refuse to reuse a checkpoint of another architecture: the run would silently train a
    model different from the one its recipe names."""
    config_path = out / "config.json"
    existing = arch_from_hf_config(json.loads(config_path.read_text("utf-8")), str(config_path))
    if existing != arch:
        raise ValueError(
            f"{out} already holds a model of another architecture ({existing}) than the one "
            f"asked for ({arch}); delete the directory or point policy.model_name_or_path "
            "elsewhere"
        )


def _write_checkpoint(out: Path, arch: ModelArch, seed: int) -> None:
    """Write config, random weights and tokenizer into the (temporary) directory `out`."""
    import torch
    import transformers

    if arch.family not in HF_ARCHITECTURES or arch.rope_scaling_factor is not None:
        # hf_config writes no RoPE scaling (the exporter adds Llama's); a tiny model never
        # needs it.
        raise ValueError(
            f"create_tiny_model builds models of the families {', '.join(HF_ARCHITECTURES)} "
            f"with unscaled RoPE; got family {arch.family!r}, rope scaling "
            f"{arch.rope_scaling_factor}"
        )
    tokenizer = build_char_tokenizer(model_max_length=arch.max_position_embeddings)
    if len(tokenizer) > arch.vocab_size:
        raise ValueError(
            f"the char tokenizer has {len(tokenizer)} tokens but the architecture's vocabulary "
            f"has {arch.vocab_size}; choose a preset with vocab_size >= {len(tokenizer)}"
        )
    config = hf_config(
        arch,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # A private RNG state: the caller's torch seed (and its later draws) stay untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, HF_ARCHITECTURES[arch.family])(config)
    with _no_progress_bars():
        model.save_pretrained(out)
    save_char_tokenizer(tokenizer, out)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' own bars ("Writing model shards") off, then back as they were: a
    one-file model gains nothing from a bar, and a bar's carriage returns garble the
    run's log file when the output is not a terminal."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def create_tiny_model(
    out_dir: str | Path, *, arch: ModelArch = PRESETS["tiny-qwen2"], seed: int
) -> Path:
    """Create a random HF model of `arch` with the char tokenizer at `out_dir`.

    Does nothing when `out_dir` already holds a complete checkpoint of `arch`.

    Args:
        out_dir: checkpoint directory to create (its parents are created too).
        arch: the architecture (default: the tiny-qwen2 preset); its vocabulary must hold
            the char tokenizer.
        seed: weight initialisation seed; the same seed gives the same weights.

    Returns:
        `out_dir` as a Path.

    Raises:
        FileExistsError: `out_dir` exists and is neither empty nor a complete checkpoint.
        ValueError: the existing checkpoint has another architecture, or `arch` has no HF
            model class, scaled RoPE, or a vocabulary smaller than the tokenizer's.
    """
    out = Path(out_dir)
    if is_complete_checkpoint(out):
        _check_existing(out, arch)
        return out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        missing = [name for name in REQUIRED_FILES if not (out / name).is_file()]
        raise FileExistsError(
            f"{out} exists but is not a complete checkpoint (missing {', '.join(missing)}); "
            "delete it to let it be created, or point policy.model_name_or_path elsewhere"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    # A sibling of out_dir, so the final rename stays on one filesystem (atomic).
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_checkpoint(tmp, arch, seed)
        # mkdtemp (and the safetensors writer) make owner-only entries; a model directory is
        # normally read by other users and jobs too.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
        try:
            os.rename(tmp, out)  # replaces an empty out_dir; fails on a non-empty one
        except OSError:
            if not is_complete_checkpoint(out):
                raise
            _check_existing(out, arch)  # another process created it first: use theirs
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry: create the model and print its directory."""
    parser = argparse.ArgumentParser(
        prog="python -m dapo_megatron.data.tiny_model",
        description="Create a randomly initialised tiny checkpoint with the char tokenizer.",
    )
    parser.add_argument(
        "--preset",
        default="tiny-qwen2",
        choices=sorted(PRESETS),
        help="ModelArch preset (default tiny-qwen2)",
    )
    parser.add_argument("--out", required=True, help="checkpoint directory to create")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    args = parser.parse_args(argv)
    print(create_tiny_model(args.out, arch=PRESETS[args.preset], seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
