"""The set-up the tests of tests/distributed share: tiny random HF checkpoints (built in the
pytest process) and the Megatron models the rank functions build from them.

``tiny_hf_checkpoint(directory, config, seed)`` saves an HF model of ``config`` with every
weight random (HF zero-inits biases and one-inits norms, which would hide mapping bugs)
and returns it with its ModelArch; ``megatron_model(hf_dir, arch, dims, precision)`` is
this rank's model stage with that checkpoint loaded (after ``initialize_parallel``).

Megatron is imported inside ``megatron_model`` only (the pytest process never imports it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

from dapo_megatron.config.model_arch import ModelArch, arch_from_hf_config
from dapo_megatron.config.parallel import ParallelDims


def hf_arch(config: transformers.PretrainedConfig) -> ModelArch:
    """The ModelArch our HF config reader derives (also exercises its rope parsing)."""
    return arch_from_hf_config(config.to_dict(), f"{config.model_type} test config")


def randomise(model: torch.nn.Module, scale: float = 0.1) -> None:
    """Every weight random: norms (also q_norm / k_norm) ~ 1 + 0.2 N(0, 1), the rest
    (biases, experts and router included) ~ N(0, scale^2)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, scale)


def tiny_hf_checkpoint(
    directory: str | Path,
    config: transformers.PretrainedConfig,
    seed: int,
    **save_options: Any,
) -> tuple[transformers.PreTrainedModel, ModelArch]:
    """Seed torch's global generator with ``seed``, build ``config``'s model, randomise it
    and save it to ``directory`` (``save_options`` go to ``save_pretrained``); the model
    (in eval mode, for reference logits) and its ModelArch."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomise(model)
    model.save_pretrained(directory, **save_options)
    return model, hf_arch(config)


def megatron_model(
    hf_dir: str | Path,
    arch: ModelArch,
    dims: ParallelDims,
    precision: str = "fp32",
    **build_options: Any,
) -> torch.nn.Module:
    """This rank's model stage (``build_model``'s options) with ``hf_dir`` loaded."""
    from dapo_megatron.megatron.hf_weights import load_hf_checkpoint
    from dapo_megatron.megatron.model import build_model

    model = build_model(arch, dims, precision, **build_options)
    load_hf_checkpoint(model, hf_dir, arch, dims)
    return model
