"""From generated samples to a training batch: scoring, reward shaping, advantages.

A RolloutGroup is one prompt with its n samples, their raw verifier scores and shaped
rewards; groups are what dynamic sampling keeps, carries and discards, so they are plain
picklable data. Shaping (docs/ARCHITECTURE.md): scale the raw score, add the soft
overlong penalty measured on the RESPONSE length against the engine's response cap.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dapo_megatron.algorithms.advantages import group_advantages
from dapo_megatron.algorithms.reward_shaping import (
    overlong_filter_mask,
    shape_rewards,
    truncated_from_finish_reasons,
)
from dapo_megatron.algorithms.shaping_limits import RewardShaping
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.shared.batch import PolicyBatch
from dapo_megatron.shared.sampling import Sample


@dataclass
class RolloutGroup:
    """One prompt's samples, scored and shaped."""

    prompt_ids: list[int]
    """Prompt token ids."""
    ground_truth: str
    """Reference answer given to the verifier."""
    samples: list[Sample]
    """The n responses, with engine logprobs and finish reasons."""
    scores: list[float]
    """Raw verifier score per sample (1 correct / 0 wrong): the dynamic-sampling metric."""
    rewards: list[float]
    """Shaped reward per sample: scaled score plus the soft overlong penalty."""
    penalties: list[float]
    """The overlong penalty part of each reward (<= 0)."""
    version: int = 0
    """The policy version that generated the samples (optimizer updates before it)."""


def make_groups(
    prompts: Sequence[Sequence[int]],
    ground_truths: Sequence[str],
    samples: Sequence[Sequence[Sample]],
    scores: Sequence[float],
    shaping: RewardShaping,
    version: int = 0,
) -> list[RolloutGroup]:
    """Attach scores (flat, prompt-major) and shaped rewards to each prompt's samples;
    ``shaping`` is the run's ``RunPlan.reward_shaping``, validated once per run."""
    flat = [s for group in samples for s in group]
    lengths = torch.tensor([s.response_length for s in flat])
    rewards, penalties = shape_rewards(torch.tensor(scores, dtype=torch.float64), lengths, shaping)
    groups, start = [], 0
    for prompt, truth, group in zip(prompts, ground_truths, samples, strict=True):
        end = start + len(group)
        groups.append(
            RolloutGroup(
                list(prompt),
                truth,
                list(group),
                list(scores[start:end]),
                rewards[start:end].tolist(),
                penalties[start:end].tolist(),
                version,
            )
        )
        start = end
    return groups


def build_policy_batch(
    groups: Sequence[RolloutGroup], config: DapoMegatronConfig, pad_id: int
) -> PolicyBatch:
    """Token-aligned batch (prompt + response, right-padded) with group advantages.

    The loss mask covers response tokens; samples that hit the length cap are masked out
    entirely when overlong filtering is on. Rollout logprobs are the engine's.
    """
    adv = config.dapo.advantage
    rewards_GN = torch.tensor([g.rewards for g in groups], dtype=torch.float64)
    advantages = group_advantages(
        rewards_GN,
        norm_by_std=adv.norm_by_std,
        leave_one_out=adv.leave_one_out,
        eps=adv.eps,
        std_over=adv.std_over,
    ).reshape(-1)
    rows = [(g.prompt_ids, s) for g in groups for s in g.samples]
    # One flat list per field and one scatter each: a per-row loop of small tensor copies
    # costs ~20 us a row, which at thousands of rows a step is controller time on the
    # trainer's path.
    prompt_lens = torch.tensor([len(p) for p, _ in rows])
    lengths = prompt_lens + torch.tensor([s.response_length for _, s in rows])
    seq_len = int(lengths.max())
    row_B = torch.repeat_interleave(torch.arange(len(rows)), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    col_B = torch.arange(len(row_B)) - torch.repeat_interleave(starts, lengths)
    in_response = col_B >= torch.repeat_interleave(prompt_lens, lengths)
    tokens = [t for p, s in rows for t in (*p, *s.response_token_ids)]
    logprobs = [x for p, s in rows for x in (*(0.0 for _ in p), *s.logprobs)]
    if len(logprobs) != len(tokens):  # a flat list would misalign every later row
        bad = next(i for i, (_, s) in enumerate(rows) if len(s.logprobs) != s.response_length)
        raise ValueError(
            f"sample {bad} of the batch has {len(rows[bad][1].logprobs)} logprobs for "
            f"{rows[bad][1].response_length} response tokens: the engines must return "
            "logprobs (SamplingParams.logprobs) for training rollouts"
        )
    input_ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    input_ids[row_B, col_B] = torch.tensor(tokens, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), seq_len)
    loss_mask[row_B, col_B] = in_response.float()
    rollout_lp = torch.zeros(len(rows), seq_len)
    rollout_lp[row_B, col_B] = torch.tensor(logprobs, dtype=torch.float32)
    if config.dapo.overlong_filtering:
        truncated = truncated_from_finish_reasons([s.finish_reason for _, s in rows])
        loss_mask = overlong_filter_mask(loss_mask, truncated)
    routed = None
    if config.policy.moe.routing_replay:
        routed = _routed_experts(rows, lengths, row_B, col_B)
    return PolicyBatch(
        input_ids=input_ids,
        loss_mask=loss_mask,
        advantages=advantages.float(),
        rollout_logprobs=rollout_lp,
        lengths=lengths,
        routed_experts=routed,
    )


def _routed_experts(
    rows: Sequence[tuple[list[int], Sample]],
    lengths: torch.Tensor,
    row_B: torch.Tensor,
    col_B: torch.Tensor,
) -> torch.Tensor:
    """``PolicyBatch.routed_experts`` ``[B, S, layers, k]``: each sample's recorded routing
    of its first ``length - 1`` tokens (the engine never feeds the last one), zeros
    elsewhere; one scatter, as the other fields."""
    recorded = []
    for i, (_, sample) in enumerate(rows):
        routed = sample.routed_experts
        expected = int(lengths[i]) - 1
        if routed is None or routed.shape[0] != expected:
            got = "none" if routed is None else f"{routed.shape[0]} tokens"
            raise ValueError(
                f"sample {i} of the batch carries routed experts for {got}, expected "
                f"{expected} (prompt + response - 1): policy.moe.routing_replay needs the "
                "megatron engine's recorded routing"
            )
        recorded.append(routed)
    fed = col_B < torch.repeat_interleave(lengths - 1, lengths)
    out = recorded[0].new_zeros((len(rows), int(lengths.max()), *recorded[0].shape[1:]))
    out[row_B[fed], col_B[fed]] = torch.cat(recorded)
    return out


def staleness_metrics(groups: Sequence[RolloutGroup], version: int) -> dict[str, float]:
    """How many policy versions behind ``version`` (the one trained) the groups were
    generated: mean and max over the groups."""
    lags = [version - g.version for g in groups]
    return {
        "rollout/staleness_mean": statistics.fmean(lags),
        "rollout/staleness_max": float(max(lags)),
    }


def rollout_metrics(groups: Sequence[RolloutGroup], config: DapoMegatronConfig) -> dict[str, float]:
    """Reward and length statistics of the samples trained on."""
    scores = [x for g in groups for x in g.scores]
    rewards = [x for g in groups for x in g.rewards]
    penalties = [x for g in groups for x in g.penalties]
    samples = [s for g in groups for s in g.samples]
    lengths = [s.response_length for s in samples]
    truncated = [s.finish_reason == "length" for s in samples]
    return {
        "reward/raw_mean": statistics.fmean(scores),
        "reward/acc": statistics.fmean(1.0 if x > 0 else 0.0 for x in scores),
        "reward/shaped_mean": statistics.fmean(rewards),
        "reward/overlong_penalty_mean": statistics.fmean(penalties),
        "reward/overlong_frac": statistics.fmean(1.0 if x < 0 else 0.0 for x in penalties),
        "response_length/mean": statistics.fmean(lengths),
        "response_length/max": float(max(lengths)),
        "response_length/clip_ratio": statistics.fmean(float(t) for t in truncated),
        "response_length/cap": float(config.generation.max_response_length),
    }
