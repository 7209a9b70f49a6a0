"""The names every system's key table uses: the dialect ids, our keys that several tables
write to, and the notes they share (the tables are nemo_keys.py, skyrl_keys.py,
rlinf_keys.py and verl_keys.py; dialect_keys.py joins them)."""

from __future__ import annotations

NEMO, SKYRL, RLINF, VERL = "nemo-rl", "skyrl", "rlinf", "verl"

CLIP_LOW = "dapo.loss.clip_ratio_low"
CLIP_HIGH = "dapo.loss.clip_ratio_high"
CLIP_C = "dapo.loss.clip_ratio_c"
AGG = "dapo.loss.loss_agg_mode"
DS = "dapo.dynamic_sampling"
OB = "dapo.overlong_buffer"
RS = "dapo.reward_scaling"
MAX_RESPONSE = "generation.max_response_length"

LOW_WHY = "same meaning: the ratio is clipped below at 1 - {v}"
HIGH_WHY = "same meaning: the ratio is clipped at 1 + {v}"
DUAL_WHY = "same meaning: the dual-clip bound for negative advantages, here {v} (null: off)"
UNLIMITED_WHY = (
    "same meaning: at most {v} full generation rounds' worth of prompts per step, <= 0 unlimited"
)
GSM8K_TEMPLATE = '{} Let\'s think step by step and output the final answer after "####".'
"""verl's examples/data_preprocess/gsm8k.py and SkyRL's examples/train/gsm8k/gsm8k_dataset.py
both build each question as question_raw + " " + instruction_following: the same text as a
str.format template of the question (no braces to escape)."""
