"""The task's sections: the prompts (data, with its synthetic tasks), how responses are
scored (reward) and how the policy is validated (validation).

Part of the run's schema (config/schema.py joins the sections into DapoMegatronConfig);
as there, fields carry no defaults (configs/dapo_base.yaml holds them) and each field's
docstring is the reference documentation of its key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class ArithmeticTaskConfig:
    """The synthetic arithmetic task of the tiny CPU recipe."""

    num_train: int
    """Training problems generated."""
    num_val: int
    """Validation problems generated."""
    difficulty: int
    """Number of operands per problem (2 = "a+b")."""


@dataclass
class RemainderTaskConfig:
    """The long-response synthetic task (data/remainder.py): ``"n-d="`` answered by
    subtracting d repeatedly (every intermediate number written), then n mod d on its own
    line; n and d uniform in their ranges. A solution has n // d steps of ~3-4 tokens, so
    ones longer than generation.max_response_length are truncated: the long-response
    recipe's cap leaves the longest problems unsolvable on purpose."""

    num_train: int
    """Training problems generated (those outside validation, repeated).

    Training problems generated (the problems outside validation, repeated evenly)."""
    num_val: int
    """Validation problems (distinct, held out of training; at most half)."""
    min_dividend: int
    """Smallest dividend n (> max_divisor)."""
    max_dividend: int
    """Largest dividend n."""
    min_divisor: int
    """Smallest divisor d (>= 2)."""
    max_divisor: int
    """Largest divisor d (< min_dividend)."""


@dataclass
class DataConfig:
    """Training and validation prompts."""

    format: Literal["dapo_math", "aime", "gsm8k", "arithmetic", "remainder"]
    """Dataset layout: dapo_math | aime | gsm8k | arithmetic | remainder.

    Dataset layout: DAPO-Math-17k, AIME24, GSM8K (jsonl/parquet) or a synthetic task
    (arithmetic: short answers; remainder: worked solutions of 4-130 tokens)."""
    train_path: str | None
    """Training file (jsonl or parquet); null only for arithmetic."""
    val_path: str | None
    """Validation file; null: no file validation (arithmetic makes its own)."""
    val_fraction: float | None
    """Share of the training prompts held out for validation; null: none.

    Share of the training prompts held out as the validation set (with data.val_path null),
    the rest trains: NeMo RL's ``split_validation_size`` (HF datasets' ``train_test_split``,
    seeded by run.seed: data/val_split.py). Null: the training file is used whole."""
    prompt_key: str | None
    """Field holding the prompt; null uses the format's standard field."""
    answer_key: str | None
    """Field holding the ground truth; null uses the format's standard field."""
    max_prompt_length: int
    """Longer prompts are skipped and counted; a corrupt row is an error.

    Prompts longer than this many tokens are skipped (and counted, ``[setup] skipped N``). A
    row far longer than any such prompt (over 64 bytes per token + 64 KiB: a corrupt file or
    the wrong field) is an error naming the file and the line, found before tokenising."""
    apply_chat_template: bool
    """Wrap prompts with the tokenizer's chat template."""
    prompt_template: str | None
    """Format string making the user message from a problem ("{}"); null: as is.

    A Python format string with one ``{}`` field, filled with each prompt's problem text to
    make the user message (before the chat template): NeMo RL's ``prompt_file``, with its
    ``{{`` / ``}}`` escapes (data/prompt_template.py). Null: the prompt is used as it is."""
    shuffle: bool
    """Shuffle training prompts every epoch (seeded by run.seed)."""
    arithmetic: ArithmeticTaskConfig
    """Settings of the synthetic arithmetic task."""
    remainder: RemainderTaskConfig
    """Settings of the synthetic remainder (long-response) task."""


@dataclass
class RewardConfig:
    """Verification of responses."""

    verifier: Literal["math", "gsm8k", "gsm8k_verl", "gsm8k_skyrl", "arithmetic", "remainder"]
    """math, gsm8k, gsm8k_verl, gsm8k_skyrl, arithmetic or remainder.

    Verifier: math (math-verify, "Answer: X" or \boxed{X}), gsm8k (final number), gsm8k_verl
    and gsm8k_skyrl (verl's and SkyRL's strict GSM8K rewards: the `#### N` answer or 0,
    rewards/gsm8k_strict.py), arithmetic, remainder (the answer line of a worked solution)."""
    timeout_s: float
    """Per-sample verification time limit; a timeout scores 0 and is counted."""
    num_workers: int
    """Processes of the verification pool."""


@dataclass
class ValidationConfig:
    """Periodic validation (avg@k accuracy on the validation set)."""

    val_period: int
    """Validate every this many steps; 0 disables."""
    val_at_start: bool
    """Validate once before the first step."""
    num_samples_per_prompt: int
    """k of avg@k: samples per validation prompt (DAPO reports avg@32)."""
    temperature: float
    """Sampling temperature of validation."""
    top_p: float
    """Nucleus sampling threshold of validation (DAPO: 0.7)."""
    top_k: int
    """Top-k sampling of validation; -1: off."""
    max_prompts: int | None
    """Validate on at most this many prompts; null uses the whole validation set."""
    greedy: bool
    """Greedy accuracy (top_k=1, 1 sample per prompt) instead of avg@k.

    Greedy decoding (top_k=1, one sample per prompt) instead of avg@k sampling; the
    temperature, top_p and num_samples_per_prompt keys are then unused."""
