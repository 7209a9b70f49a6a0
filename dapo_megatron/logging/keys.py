"""Metric names shared by the controller (which logs them) and the plots/progress (which read them).

These strings are a contract: the JSONL files of old runs, TensorBoard tags, W&B/MLflow
charts and ``write_plots`` all key on them, so renaming one breaks every consumer at once.
Log with the named constants rather than string literals so a typo is an ``AttributeError``
instead of a silently missing curve. Keys not listed here may still be logged; they are
written to every sink, but plots and the progress line do not know them.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_HEADLINE",
    "DS_KEEP_RATE",
    "DS_NUM_GEN_BATCHES",
    "GRAD_NORM",
    "HEADLINE_DUPLICATES",
    "HEADLINE_LABELS",
    "LOSS",
    "LR",
    "METRIC_KEYS",
    "PLOT_LABELS",
    "POLICY_ENTROPY",
    "RESPONSE_LENGTH_CLIP_RATIO",
    "RESPONSE_LENGTH_MAX",
    "RESPONSE_LENGTH_MEAN",
    "REWARD_ACC",
    "REWARD_RAW_MEAN",
    "REWARD_SHAPED_MEAN",
    "SFT_NLL",
    "STEP_TIME_S",
    "VAL_ACC",
    "VAL_ACC_STDERR",
]

REWARD_RAW_MEAN = "reward/raw_mean"
"""Mean verifier score of the step's kept samples, before scaling and overlong shaping."""
REWARD_SHAPED_MEAN = "reward/shaped_mean"
"""Mean reward after scaling and the soft overlong penalty (what the advantages see)."""
REWARD_ACC = "reward/acc"
"""Training accuracy: fraction of generated samples the verifier marks correct."""
VAL_ACC = "val/acc"
"""Validation accuracy; logged only on validation steps (every val_period)."""
VAL_ACC_STDERR = "val/acc_stderr"
"""Standard error of the validation accuracy over prompts (NaN below two prompts)."""
DS_KEEP_RATE = "dynamic_sampling/keep_rate"
"""Fraction of generated prompt groups kept by dynamic sampling (raw metric std > 0)."""
DS_NUM_GEN_BATCHES = "dynamic_sampling/num_gen_batches"
"""Generation rounds needed to fill the step's batch."""
RESPONSE_LENGTH_MEAN = "response_length/mean"
"""Mean response length in tokens."""
RESPONSE_LENGTH_MAX = "response_length/max"
"""Longest response in tokens."""
RESPONSE_LENGTH_CLIP_RATIO = "response_length/clip_ratio"
"""Fraction of responses truncated at the generation cap (finish reason ``length``)."""
LOSS = "loss"
"""Policy-gradient loss of the step (token-mean over the mini-batches)."""
POLICY_ENTROPY = "policy/entropy"
"""Mean token entropy of the policy on the training batch."""
GRAD_NORM = "grad_norm"
"""Global gradient norm before clipping."""
LR = "lr"
"""Learning rate used by the step's optimizer updates."""
STEP_TIME_S = "timing/step_s"
"""Wall-clock seconds of the whole step (generation + training + weight refit)."""
SFT_NLL = "sft/nll"
"""SFT warm-up: mean negative log-likelihood per answer token (``sft_metrics.jsonl``)."""

METRIC_KEYS: tuple[str, ...] = (
    REWARD_RAW_MEAN,
    REWARD_SHAPED_MEAN,
    REWARD_ACC,
    VAL_ACC,
    VAL_ACC_STDERR,
    DS_KEEP_RATE,
    DS_NUM_GEN_BATCHES,
    RESPONSE_LENGTH_MEAN,
    RESPONSE_LENGTH_MAX,
    RESPONSE_LENGTH_CLIP_RATIO,
    LOSS,
    POLICY_ENTROPY,
    GRAD_NORM,
    LR,
    STEP_TIME_S,
)
"""Every metric name the controller logs and the plots know about."""

DEFAULT_HEADLINE: tuple[str, ...] = (
    REWARD_RAW_MEAN,
    REWARD_ACC,
    VAL_ACC,
    DS_KEEP_RATE,
    RESPONSE_LENGTH_MEAN,
    STEP_TIME_S,
)
"""Metrics shown on the progress bar / per-step line unless the caller picks others."""

HEADLINE_LABELS: dict[str, str] = {
    REWARD_RAW_MEAN: "reward",
    REWARD_SHAPED_MEAN: "shaped",
    REWARD_ACC: "acc",
    VAL_ACC: "val_acc",
    DS_KEEP_RATE: "keep",
    DS_NUM_GEN_BATCHES: "gen_batches",
    RESPONSE_LENGTH_MEAN: "len",
    RESPONSE_LENGTH_MAX: "len_max",
    RESPONSE_LENGTH_CLIP_RATIO: "clip",
    LOSS: "loss",
    POLICY_ENTROPY: "entropy",
    GRAD_NORM: "gnorm",
    LR: "lr",
    STEP_TIME_S: "step_s",
    SFT_NLL: "nll",
}
"""Short labels for the progress line; the full key is a third of a terminal wide."""

HEADLINE_DUPLICATES: dict[str, str] = {REWARD_RAW_MEAN: REWARD_ACC}
"""Headline columns left out of a step's display when their value equals the named one's:
the mean score of a 0/1 verifier is the training accuracy, a second column saying the
same number is noise (a partial-credit verifier's reward differs, and shows)."""

PLOT_LABELS: dict[str, str] = {
    REWARD_RAW_MEAN: "verifier score (mean over sampled rollouts)",
    REWARD_SHAPED_MEAN: "shaped reward (scaled, with overlong penalty)",
    REWARD_ACC: "training accuracy (sampled rollouts)",
    VAL_ACC: "validation accuracy (held-out prompts)",
    DS_KEEP_RATE: "prompt groups kept",
    DS_NUM_GEN_BATCHES: "generation rounds",
    RESPONSE_LENGTH_MEAN: "mean",
    RESPONSE_LENGTH_MAX: "longest",
    RESPONSE_LENGTH_CLIP_RATIO: "responses cut at the length cap",
    LOSS: "policy-gradient loss",
    POLICY_ENTROPY: "token entropy",
    GRAD_NORM: "gradient norm (before clipping)",
    LR: "learning rate",
    STEP_TIME_S: "seconds per step",
    SFT_NLL: "answer NLL per token",
}
"""Legend labels of the plots: words a reader of the figure needs no key list for."""
