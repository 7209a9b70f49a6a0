"""Rounds and samplers the DynamicSampler tests share (algorithms/test_dynamic_sampling.py;
import: ``unit.sampler_rounds``)."""

from __future__ import annotations

from typing import Any

import torch

from dapo_megatron.algorithms.dynamic_sampling import DynamicSampler

N = 2  # samples per group in the sampler tests


def make_round(
    names: list[str], flags: list[bool], rewards: list[list[float]] | None = None
) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Groups named ``names``; a True flag gives the group a varying metric [1, 0]."""
    metric_GN = torch.tensor(
        [[1.0, 0.0] if flag else [1.0, 1.0] for flag in flags], dtype=torch.float32
    ).reshape(len(flags), N)
    reward_GN = metric_GN.clone() if rewards is None else torch.tensor(rewards).reshape(-1, N)
    return names, metric_GN, reward_GN


def sampler(**overrides: Any) -> DynamicSampler[str]:
    kwargs: dict[str, Any] = dict(
        num_prompts_per_step=4,
        batch_multiplier=1.0,
        max_gen_batches=0,
        surplus="discard",
        max_carry_age=1,
        group_size=N,
    )
    kwargs.update(overrides)
    return DynamicSampler(**kwargs)
