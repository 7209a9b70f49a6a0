"""Start-up check: the engines report the policy's own logprobs for one short rollout.

Every trained token's rollout logprob is the engine's ``log_softmax(logits / T)`` over the
full vocabulary before top-k/top-p (``shared.sampling.Sample.logprobs``), and the loss
compares it with the policy's. Whether the engine really reports that depends on decisions
vLLM takes differently on a GPU than on the CPU twin (its model runner, where the
temperature and the truncation happen), on the refit, and on the dtype. So once the policy's
weights are in the engines (after the first refit of every attempt), the controller samples
one short continuation of one prompt on every engine with the training sampling settings,
has the policy score the same tokens, and stops the run with ``EngineLogprobMismatch`` when
the two disagree beyond a tolerance for the run's precision. It costs one short generate
call and one forward pass over a few rows.

``compare_logprobs`` is the pure part (two logprob vectors and the settings in, metrics out
or a raise); ``check_engine_logprobs`` runs the probe with the controller's objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dapo_megatron.shared.batch import PolicyBatch
from dapo_megatron.shared.sampling import Sample, SamplingParams

if TYPE_CHECKING:
    from dapo_megatron.controller.actors.generation_group import Engines
    from dapo_megatron.controller.actors.policy_group import PolicyGroup
    from dapo_megatron.controller.context import RunContext

PROBE_TOKENS = 16
"""Most tokens sampled per probe row (fewer when generation.max_response_length is)."""


@dataclass(frozen=True)
class Tolerance:
    """Largest accepted |engine - policy| logprob difference over the probe's tokens."""

    max_abs: float
    mean_abs: float


# fp32 engines and policies agree to ~1e-5 (tests/vllm_backend); half precision differs by
# rounding (~1e-2 on average, single tokens more). The faults this check is for are far
# larger on average: a renormalisation over the top-p set shifts every token by -log(kept
# mass) (0.36 at top_p 0.7), a temperature applied after the log-softmax scales each
# logprob by 1/T, stale or mis-tied weights move everything.
TOLERANCES = {
    "fp32": Tolerance(max_abs=1e-2, mean_abs=1e-3),
    "bf16": Tolerance(max_abs=2.0, mean_abs=0.1),
    "fp16": Tolerance(max_abs=2.0, mean_abs=0.1),
}


class EngineLogprobMismatch(RuntimeError):
    """The engines' logprobs are not the policy's (message: numbers and what to check)."""


def compare_logprobs(
    engine_lp: torch.Tensor,
    policy_lp: torch.Tensor,
    *,
    sampling: SamplingParams,
    precision: str,
    tolerance: Tolerance | None = None,
) -> dict[str, float]:
    """Compare the logprobs of the same tokens; returns ``startup/*`` metrics.

    Args:
        engine_lp: [N] the engines' logprobs of N sampled tokens.
        policy_lp: [N] the policy's logprobs of the same tokens (same temperature).
        sampling: the sampling settings the tokens were drawn with (for the message).
        precision: policy.precision ("fp32", "bf16", "fp16"): picks the tolerance.
        tolerance: overrides ``TOLERANCES[precision]``.

    Raises:
        EngineLogprobMismatch: max or mean |engine - policy| above the tolerance, or a
            non-finite logprob.
        ValueError: the vectors differ in shape or are empty.
    """
    if engine_lp.shape != policy_lp.shape or engine_lp.dim() != 1 or engine_lp.numel() == 0:
        raise ValueError(
            f"compare_logprobs needs two [N] vectors, N > 0; got {tuple(engine_lp.shape)} "
            f"and {tuple(policy_lp.shape)}"
        )
    limit = tolerance or TOLERANCES[precision]
    diff = (engine_lp.double() - policy_lp.double()).abs()
    finite = bool(torch.isfinite(diff).all())
    worst = float(diff.max()) if finite else float("inf")
    mean = float(diff.mean()) if finite else float("inf")
    metrics = {
        "startup/engine_logprob_diff_max": worst,
        "startup/engine_logprob_diff_mean": mean,
        "startup/engine_logprob_tokens": float(diff.numel()),
    }
    if finite and worst <= limit.max_abs and mean <= limit.mean_abs:
        return metrics
    from dapo_megatron.generation import vllm_backend  # no vllm import: names only

    at = int(diff.nan_to_num(float("inf")).argmax())
    raise EngineLogprobMismatch(
        "the rollout engines' logprobs disagree with the policy's on the start-up probe: "
        f"max |engine - policy| = {worst:.4g} (token {at}: engine {float(engine_lp[at]):.4g}, "
        f"policy {float(policy_lp[at]):.4g}), mean {mean:.4g} over {diff.numel()} tokens; "
        f"tolerance for policy.precision={precision}: max {limit.max_abs:g}, mean "
        f"{limit.mean_abs:g}. Sampling: temperature={sampling.temperature}, "
        f"top_p={sampling.top_p}, top_k={sampling.top_k}. The engines must report "
        "log_softmax(logits / temperature) over the full vocabulary before top-k/top-p: "
        f"vLLM's {vllm_backend.MODEL_RUNNER} model runner with "
        f"logprobs_mode={vllm_backend.LOGPROBS_MODE!r} and {vllm_backend.LOGITS_PROCESSOR}. "
        "Check: (1) the engine log says it uses that runner, not 'Using V2 Model Runner' "
        f"({'='.join(vllm_backend.RUNNER_ENVIRONMENT)} in the engines' environment; V2 "
        "applies logits processors before the temperature); (2) a mismatch growing as "
        "temperature moves away from 1 or as top_p / top_k truncate points at where the "
        "temperature or the truncation is applied; (3) a large mismatch at any setting "
        "points at the refit (weights not delivered, a tied lm_head / embedding not "
        "refreshed, a padded vocabulary) or a different checkpoint; (4) policy and engine "
        "dtypes (policy.precision) and the policy's logprob temperature "
        "(generation.temperature)."
    )


def probe_batch(
    prompts: Sequence[Sequence[int]], samples: Sequence[Sample], pad_id: int
) -> PolicyBatch:
    """Prompt + response rows (right-padded) with the engines' logprobs as
    ``rollout_logprobs`` at the response positions (the loss mask)."""
    lengths = [len(p) + len(s.response_token_ids) for p, s in zip(prompts, samples, strict=True)]
    ids = torch.full((len(samples), max(lengths)), pad_id, dtype=torch.long)
    mask = torch.zeros(ids.shape)
    engine = torch.zeros(ids.shape)
    for row, (prompt, sample) in enumerate(zip(prompts, samples, strict=True)):
        start, end = len(prompt), lengths[row]
        ids[row, :end] = torch.tensor([*prompt, *sample.response_token_ids], dtype=torch.long)
        mask[row, start:end] = 1.0
        engine[row, start:end] = torch.tensor(sample.logprobs, dtype=torch.float32)
    return PolicyBatch(
        input_ids=ids,
        loss_mask=mask,
        rollout_logprobs=engine,
        lengths=torch.tensor(lengths, dtype=torch.long),
    )


def check_engine_logprobs(
    ctx: RunContext, engines: Engines, policy: PolicyGroup
) -> dict[str, float]:
    """Run the probe (module docstring) after a refit; prints one line, returns the metrics.

    One row per engine (the generate call deals prompts out evenly) and at least one per
    policy DP replica; every row continues the first training prompt.

    Raises:
        EngineLogprobMismatch: see ``compare_logprobs``.
    """
    from dapo_megatron.config.run_plan import num_engines
    from dapo_megatron.controller.rollouts.response_cap import capped

    config = ctx.config
    sampling = dataclasses.replace(
        SamplingParams.from_generation_config(
            config.generation, n=1, eos_token_ids=ctx.eos_ids, seed=config.run.seed
        ),
        max_tokens=min(PROBE_TOKENS, config.generation.max_response_length),
        logprobs=True,
    )
    prompts = [ctx.train.input_ids[0]] * max(num_engines(config), policy.dp)
    sampling = capped(config, sampling, prompts)  # generation.response_cap
    samples = [group[0] for group in engines.generate(prompts, sampling)]
    batch = probe_batch(prompts, samples, ctx.pad_id)
    policy_lp, _ = policy.logprobs(batch)
    assert batch.rollout_logprobs is not None
    tokens = batch.loss_mask.bool()
    metrics = compare_logprobs(
        batch.rollout_logprobs[tokens],
        policy_lp.float().cpu()[tokens],
        sampling=sampling,
        precision=config.policy.precision,
    )
    print(
        "[startup] engine logprobs match the policy's: max |diff| "
        f"{metrics['startup/engine_logprob_diff_max']:.2e}, mean "
        f"{metrics['startup/engine_logprob_diff_mean']:.2e} over "
        f"{int(metrics['startup/engine_logprob_tokens'])} tokens "
        f"(temperature {sampling.temperature}, top_p {sampling.top_p}, top_k {sampling.top_k})",
        flush=True,
    )
    return metrics
