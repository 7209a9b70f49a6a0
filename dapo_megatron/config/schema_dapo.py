"""The training algorithm's sections: DAPO (loss, advantages, prompt skipping, dynamic
sampling, overlong shaping, reward scaling), overlapped rollouts and the supervised warm-up.

Part of the run's schema (config/schema.py joins the sections into DapoMegatronConfig);
as there, fields carry no defaults (configs/dapo_base.yaml holds them) and each field's
docstring is the reference documentation of its key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dapo_megatron.algorithms.loss_spec import LossParams


@dataclass(frozen=True)
class LossConfig(LossParams):
    """The clipped policy-gradient loss (clip-higher, token-level aggregation). Its keys are
    declared once, in algorithms/loss_spec.py ``LossParams`` (the run's ``LossSpec`` extends
    the same class); only loss_scale_length, resolved before the loss reads it, is its own."""

    loss_scale_length: int | None
    """seq-mean-token-sum-norm length; null: generation.max_response_length."""


@dataclass
class AdvantageConfig:
    """Group-relative advantage estimation."""

    norm_by_std: bool
    """Divide by the group's reward std; false gives r - mean (Dr. GRPO)."""
    leave_one_out: bool
    """Baseline each sample with the mean of its group's others (RLOO)."""
    eps: float
    """Added to the std before dividing."""
    std_over: Literal["group", "others"]
    """Whose std divides a sample: group | others (its N - 1 others', NeMo RL's).

    Whose reward std divides a sample's advantage (with norm_by_std): group, the whole
    group's; others, the unbiased std of the sample's N - 1 others, the advantage left
    unscaled where they all agree (NeMo RL's leave-one-out estimator, with leave_one_out)."""


@dataclass
class SkipPredictedConfig:
    """Pre-rollout skipping (algorithms/prompt_skipping.py): a prompt whose recent groups
    were all correct or all wrong is skipped before generation with a probability that
    grows with that streak, is never skipped with certainty (min_generate_prob), and the
    strength of the rule tunes itself towards target_zero_var_share. Skipped prompts are
    not trained on this visit; kept groups are exactly what dynamic sampling keeps."""

    enabled: bool
    """Skip prompts predicted to give a zero-variance group before generating.

    Skip prompts predicted to give a zero-variance group (needs dynamic sampling)."""
    target_zero_var_share: float
    """Zero-variance share of generated groups the rule aims for.

    Share of zero-variance groups among those generated that the rule aims for: above it the
    rule skips more, below it less. In [0, 1)."""
    min_generate_prob: float
    """Exploration floor: each prompt is generated with at least this probability.

    Exploration floor: every prompt is generated with at least this probability, so a prompt
    the policy forgets is found again. In (0, 1]."""
    audit_fraction: float
    """Share of would-be-skipped prompts generated anyway to check the prediction.

    Share of would-be-skipped prompts generated anyway: their outcomes measure the
    prediction (dynamic_sampling/predicted_zero_var_precision). In [0, 1]."""
    history_len: int
    """Outcomes remembered per prompt (the longest streak that counts)."""
    initial_strength: float
    """Initial strength s; skip prob. at streak r: (1 - floor)(1 - (1 - s)^r).

    The rule's strength s before any step tuned it (skip probability of a prompt with a
    streak r: (1 - min_generate_prob) * (1 - (1 - s)^r)). In [0, 1]."""
    adapt_rate: float
    """Per step, s moves by adapt_rate x (observed - target) zero-variance share."""


@dataclass
class DynamicSamplingConfig:
    """DAPO dynamic sampling: train only on prompt groups whose outcomes differ."""

    enabled: bool
    """Filter out groups whose raw metric has zero variance and refill the batch."""
    metric: Literal["acc", "score"]
    """Raw metric filtered on: acc (verifier accuracy) or the unshaped score.

    Raw per-sample metric to filter on: verifier accuracy or the unshaped score (never the
    shaped reward, which would give wrong short answers a positive advantage)."""
    batch_multiplier: float | Literal["auto"]
    """Prompts per round = ceil(multiplier * groups needed), or auto.

    Prompts generated per round = ceil(multiplier * groups still needed); "auto" sets it
    each step from the observed keep rate, bounded by max_batch_multiplier."""
    max_batch_multiplier: float
    """Upper bound of the automatic batch multiplier."""
    max_gen_batches: int
    """At most this many full rounds' worth of prompts per step; <= 0 = unlimited.

    A step generates at most max_gen_batches * ceil(batch_multiplier * num_prompts_per_step)
    prompts (that many full generation rounds), then stops with an error that reports the
    keep rate; <= 0 means unlimited. One meaning in both loops: a synchronous round that
    needs fewer groups draws fewer prompts, and an overlapped request is smaller than a
    round, so both count prompts."""
    surplus: Literal["carry", "discard"]
    """Valid groups beyond num_prompts_per_step: carry (to next step) | discard.

    What to do with valid groups beyond num_prompts_per_step: carry them to the next step
    (no wasted generation) or discard them (the peers' behaviour)."""
    max_carry_age: int | None
    """Carried groups older than this many versions are dropped; null: 1, or K.

    A carried group generated by policy version w is dropped once the step's version
    exceeds w + max_carry_age. With rollout.max_staleness = K >= 1 one bound, K, applies to
    carried and fresh groups: null takes it, and any other value is refused (naming both
    keys). Null with K = 0 is 1."""
    skip_predicted: SkipPredictedConfig
    """Skip prompts predicted to be uninformative before generating them."""


@dataclass
class OverlongBufferConfig:
    """Soft overlong punishment (DAPO Eq. 13)."""

    enabled: bool
    """Add the length penalty to the scaled reward."""
    length: int
    """Lcache: the penalty ramps over the last `length` tokens below the cap.

    Lcache: the penalty ramps from 0 at max_response_length - length to -penalty_factor at
    max_response_length (the response cap)."""
    penalty_factor: float
    """Largest penalty; the penalty always lies in [-penalty_factor, 0]."""


@dataclass
class RewardScalingConfig:
    """Linear reward scaling applied to the verifier score before shaping."""

    enabled: bool
    """Clamp the score to the source range, map it to [target_min, target_max].

    Clamp the score to [source_min, source_max] and map it to [target_min, target_max]."""
    source_min: float
    """Lower end of the verifier score range."""
    source_max: float
    """Upper end of the verifier score range."""
    target_min: float
    """Reward given for source_min."""
    target_max: float
    """Reward given for source_max."""


@dataclass
class DapoConfig:
    """The DAPO algorithm: batch sizes and every technique's knobs."""

    num_prompts_per_step: int
    """Prompt groups trained on per step (DAPO: 512)."""
    num_generations_per_prompt: int
    """Responses sampled per prompt, the group size (DAPO: 16)."""
    max_num_steps: int
    """Training steps (rollout + update) of the run."""
    max_num_epochs: int | None
    """Passes over the training prompts that end the run; null: steps only.

    The run stops before a step when fewer than num_prompts_per_step prompts are left in
    the first max_num_epochs passes (data/sampler.py epochs_exhausted), or at max_num_steps,
    whichever comes first (verl's trainer.total_epochs, NeMo RL's grpo.max_num_epochs). The
    passes follow one another within a step; the tail too short for a step is dropped, like
    the peers' drop_last. Dynamic sampling: a step's later rounds may draw from the next
    pass. Synchronous loop only (rollout.max_staleness 0)."""
    loss: LossConfig
    """Policy loss."""
    advantage: AdvantageConfig
    """Advantage estimation."""
    dynamic_sampling: DynamicSamplingConfig
    """Dynamic sampling."""
    overlong_filtering: bool
    """Zero the loss mask of responses that hit the length cap (no stop token)."""
    overlong_buffer: OverlongBufferConfig
    """Soft overlong punishment."""
    reward_scaling: RewardScalingConfig
    """Reward scaling."""


@dataclass
class RolloutConfig:
    """Overlap of rollout generation with training (engines on devices of their own)."""

    max_staleness: int
    """K: groups train at most K policy versions old; 0 = synchronous.

    K: a group is trained only if the policy version that generated it is at most K versions
    behind the version being trained. 0 = the synchronous loop (generate, then train, then
    refit); K >= 1 keeps the engines generating for the next steps while the policy trains
    (split mode only: cluster.colocated=false)."""
    stale_groups: Literal["drop", "regenerate"]
    """K >= 1: a group older than K versions: drop it, or regenerate its prompt.

    K >= 1: what happens to a group that arrives more than K versions behind: drop it
    (counted), or drop it and generate its prompt again with the current weights."""
    prompts_per_request: int | None
    """K >= 1: cap on prompts per engine request; null = no cap.

    K >= 1: the most prompts one generation request may hold (spread over the engines). A
    request asks for what the generate-ahead budget lacks (about a step's prompts at the
    running keep rate, plus a little headroom); the new weights are queued behind the
    requests in flight, so a cap lets the transfer start sooner and the controller score a
    step's groups as they come, while larger requests batch better. null = no cap."""
    abort_tail: bool
    """K = 0: abort a round's slowest prompts once it has the groups it needs.

    Synchronous loop: a generation round stops once it has the finished groups it needs (at
    the running keep rate, with headroom; abort_tail_oversample); the prompts whose samples
    are still running are aborted on the engines instead of waiting for the slowest samples.
    Aborted groups are not trained (their prompts count as drawn), so prompts with long
    answers are trained a little less often: see README, rollout efficiency."""
    abort_tail_oversample: float
    """With abort_tail: prompts drawn per round = this x finished groups awaited.

    With abort_tail: a round draws this many times the finished groups it waits for (those
    that give the groups it needs at the running keep rate, with 2 standard deviations of
    headroom); the slowest prompts beyond them are the tail that is cut. >= 1; 1 cuts
    nothing."""
    partial_rollouts: bool
    """With abort_tail: continue aborted samples next round, not dropping them.

    With abort_tail: keep the aborted samples and continue them in the next round (the
    prompt followed by their tokens so far), as slime does, instead of dropping them. A
    sample continued after a refit holds tokens of two policy versions, each with the
    logprob of the weights that generated it (dapo.loss.rollout_correction=tis corrects
    them, as overlapped samples); the group's version is its oldest token's."""


@dataclass
class SftWarmupConfig:
    """Supervised warm-up before DAPO (next-token NLL on reference answers)."""

    num_steps: int
    """Optimizer steps of warm-up on a fresh run; 0 disables it."""
    batch_size: int
    """Samples per warm-up step, over all data-parallel ranks."""
    lr: float
    """Constant learning rate of the warm-up (the DAPO schedule starts after it)."""
