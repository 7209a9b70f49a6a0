"""The named phases of a DAPO step, called in order by controller/loop.py.

Each function does one thing of DESIGN.md section 2 and returns its metrics; none keeps
state of its own (the RunContext does), so the loop reads like the algorithm. The workers
are passed explicitly, and only the part a phase uses: the rollout engines to generation
phases, the policy to training phases (they are rebuilt after a worker dies; the RunContext
is not).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingStats
from dapo_megatron.algorithms.rollout_correction import mismatch_metrics
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.controller.context import RunContext, decode_text, round_seed
from dapo_megatron.controller.generation_group import Engines
from dapo_megatron.controller.policy_group import PolicyGroup
from dapo_megatron.controller.rollout import RolloutGroup, build_policy_batch, make_groups
from dapo_megatron.data.batch import PolicyBatch
from dapo_megatron.data.datasets import EncodedPrompts
from dapo_megatron.generation.base import Sample, SamplingParams


def _score(
    ctx: RunContext, samples: Sequence[Sequence[Sample]], truths: Sequence[str]
) -> tuple[list[float], dict[str, float]]:
    """Verifier scores of every sample (prompt-major), decoded with the tokenizer."""
    texts: list[str] = []
    refs: list[str] = []
    for group, truth in zip(samples, truths, strict=True):
        for sample in group:
            texts.append(decode_text(ctx.tokenizer, sample.response_token_ids))
            refs.append(truth)
    result = ctx.verifier.score_batch(texts, refs)
    return result.scores, result.metrics


def generate_groups(
    ctx: RunContext,
    engines: Engines,
    prompt_indices: Sequence[int],
    sampling: SamplingParams,
    prompts: EncodedPrompts | None = None,
) -> tuple[list[RolloutGroup], dict[str, float]]:
    """Generate n samples for each prompt (of ``prompts``, default the training set), score
    and shape them."""
    prompts = prompts or ctx.train
    ids = [prompts.input_ids[i] for i in prompt_indices]
    truths = [prompts.records[i].ground_truth for i in prompt_indices]
    start = time.perf_counter()
    samples = engines.generate(ids, sampling)
    generated = time.perf_counter()
    scores, reward_metrics = _score(ctx, samples, truths)
    timing = {
        "timing/generate_s": generated - start,
        "timing/reward_s": time.perf_counter() - generated,
        "num_generated_tokens": float(sum(s.response_length for g in samples for s in g)),
    }
    return make_groups(ids, truths, samples, scores, ctx.config), {**reward_metrics, **timing}


def collect_rollouts(
    ctx: RunContext, engines: Engines, step: int
) -> tuple[list[RolloutGroup], DynamicSamplingStats, dict[str, float]]:
    """Dynamic sampling: generation rounds until num_prompts_per_step groups vary."""
    config = ctx.config
    ctx.dynamic.start_step()
    # A step filled entirely from carried groups runs no round: report zeros, not nothing.
    totals = {"timing/generate_s": 0.0, "timing/reward_s": 0.0, "num_generated_tokens": 0.0}
    round_index = 0
    while not ctx.dynamic.is_complete():
        count = ctx.dynamic.prompts_for_next_round()
        sampling = SamplingParams.from_generation_config(
            config.generation,
            n=config.dapo.num_generations_per_prompt,
            eos_token_ids=ctx.eos_ids,
            seed=round_seed(config.run.seed, step, round_index),
        )
        groups, metrics = generate_groups(ctx, engines, ctx.sampler.next_indices(count), sampling)
        for key, value in metrics.items():
            totals[key] = totals.get(key, 0.0) + value
        scores = torch.tensor([g.scores for g in groups])
        rewards = torch.tensor([g.rewards for g in groups])
        ctx.dynamic.add_round(groups, scores, rewards)  # raises after max_gen_batches rounds
        round_index += 1
    groups, stats = ctx.dynamic.finish_step()
    return groups, stats, totals


def needs_old_logprob_pass(num_samples: int, global_batch_size: int, mode: str) -> bool:
    """Whether the old logprobs need their own forward-only pass before training.

    A batch trained in one optimizer step (num_samples <= global_batch_size) has its old
    logprobs in the training forward already: before the only update, the policy IS the
    old policy (no dropout), so the train step uses its detached logprobs (ratio 1) and
    gives the same loss and gradients. With several mini-batches the later ones need the
    logprobs from before the first update: the pass runs. ``mode="always"`` forces it.
    """
    return mode == "always" or num_samples > global_batch_size


def old_logprobs(policy: PolicyGroup, batch: PolicyBatch) -> dict[str, float]:
    """Fill batch.old_logprobs with the policy before this step's updates; mismatch metrics
    against the engine's rollout logprobs (which build_policy_batch always sets)."""
    if batch.rollout_logprobs is None:
        raise ValueError("old_logprobs: the batch has no rollout_logprobs to compare with")
    start = time.perf_counter()
    lp, _ = policy.logprobs(batch)
    batch.old_logprobs = lp
    metrics = mismatch_metrics(lp, batch.rollout_logprobs, batch.loss_mask)
    metrics["timing/logprob_s"] = time.perf_counter() - start
    return metrics


def reference_logprobs(policy: PolicyGroup, batch: PolicyBatch) -> dict[str, float]:
    """Fill batch.ref_logprobs with the frozen KL reference's (the policy at the start of
    DAPO training, after the SFT warm-up); for ``dapo.loss.kl_coef > 0``."""
    start = time.perf_counter()
    batch.ref_logprobs = policy.ref_logprobs(batch)
    return {"timing/ref_logprob_s": time.perf_counter() - start}


def train_on_batch(
    ctx: RunContext, policy: PolicyGroup, batch: PolicyBatch, step: int
) -> dict[str, float]:
    """Shuffle samples, then one optimizer step per mini-batch; averaged metrics."""
    size = ctx.config.policy.train_global_batch_size
    order = torch.randperm(
        len(batch),
        generator=torch.Generator().manual_seed(round_seed(ctx.config.run.seed, step, -1)),
    )
    start = time.perf_counter()
    per_step = [
        policy.train_step(batch.select(order[i : i + size])) for i in range(0, len(batch), size)
    ]
    metrics = {k: statistics.fmean(m[k] for m in per_step) for k in per_step[0]}
    metrics["grad_norm_max"] = max(m["grad_norm"] for m in per_step)
    metrics["lr"] = per_step[-1]["lr"]
    metrics["num_optimizer_steps"] = float(len(per_step))
    metrics["timing/train_s"] = time.perf_counter() - start
    return metrics


def validation_sampling(
    config: DapoMegatronConfig, eos_ids: Sequence[int], seed: int
) -> SamplingParams:
    """Validation decoding: greedy (one sample, top_k=1) or avg@k sampling."""
    v = config.validation
    return SamplingParams(
        temperature=1.0 if v.greedy else v.temperature,
        top_p=1.0 if v.greedy else v.top_p,
        top_k=1 if v.greedy else -1,
        max_tokens=config.generation.max_response_length,
        stop_token_ids=list(config.generation.stop_token_ids or eos_ids),
        seed=seed,
        n=1 if v.greedy else v.num_samples_per_prompt,
    )


def accuracy_stderr(per_prompt: Sequence[float]) -> float:
    """Standard error of the mean accuracy over prompts (prompts are the independent draws:
    the k samples of one prompt are correlated)."""
    if len(per_prompt) < 2:
        return float("nan")
    return statistics.stdev(per_prompt) / math.sqrt(len(per_prompt))


def validate(ctx: RunContext, engines: Engines, step: int) -> dict[str, float]:
    """Greedy or avg@k accuracy on the validation prompts, with its standard error."""
    if ctx.val is None:
        return {}
    sampling = validation_sampling(
        ctx.config, ctx.eos_ids, round_seed(ctx.config.run.seed, step, 10_000)
    )
    start = time.perf_counter()
    groups, _ = generate_groups(
        ctx, engines, range(len(ctx.val.input_ids)), sampling, prompts=ctx.val
    )
    scores = [x for g in groups for x in g.scores]
    return {
        "val/acc": statistics.fmean(scores),
        "val/acc_stderr": accuracy_stderr([statistics.fmean(g.scores) for g in groups]),
        "val/response_length": statistics.fmean(
            s.response_length for g in groups for s in g.samples
        ),
        "timing/val_s": time.perf_counter() - start,
    }


def sft_warmup(
    ctx: RunContext, policy: PolicyGroup, log: Callable[[int, dict[str, float]], None]
) -> None:
    """Supervised warm-up on reference answers (prompt + answer + EOS, loss on the answer);
    ``log(step, metrics)`` after each step."""
    cfg = ctx.config.sft_warmup
    from dapo_megatron.data.sampler import PromptSampler

    sampler = PromptSampler(len(ctx.train.input_ids), seed=ctx.config.run.seed + 1, shuffle=True)
    for step in range(cfg.num_steps):
        rows: list[tuple[list[int], list[int]]] = []
        for i in sampler.next_indices(cfg.batch_size):
            answer = ctx.tokenizer.encode(
                ctx.train.records[i].ground_truth, add_special_tokens=False
            )
            rows.append((ctx.train.input_ids[i], answer + ctx.eos_ids))
        batch = _supervised_batch(rows, ctx.pad_id)
        metrics = policy.sft_step(batch, lr=cfg.lr)
        log(step, metrics)


def _supervised_batch(rows: Sequence[tuple[list[int], list[int]]], pad_id: int) -> PolicyBatch:
    seq = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), seq), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), seq)
    for i, (prompt, answer) in enumerate(rows):
        ids[i, : len(prompt)] = torch.tensor(prompt)
        ids[i, len(prompt) : len(prompt) + len(answer)] = torch.tensor(answer)
        mask[i, len(prompt) : len(prompt) + len(answer)] = 1.0
    lengths = torch.tensor([len(p) + len(a) for p, a in rows])
    return PolicyBatch(input_ids=ids, loss_mask=mask, lengths=lengths)


def make_batch(ctx: RunContext, groups: Sequence[RolloutGroup]) -> PolicyBatch:
    return build_policy_batch(groups, ctx.config, ctx.pad_id)
