"""The foreign dialects (issue 33): NeMo RL, SkyRL, RLinf and verl keys in errors and imports.

Expected values are derived by hand from each system's semantics (migrate/dialect_keys.py
cites where they were read): e.g. NeMo RL's dynamic_sampling_max_gen_batches = 10 allows
11 rounds, verl's gen_batch_size 1536 over train_batch_size 512 is a multiplier of 3.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dapo_megatron.config import ConfigError, load_config
from dapo_megatron.config.loader import all_keys
from dapo_megatron.migrate.dialect_keys import all_foreign_keys, foreign_key
from dapo_megatron.migrate.dialects import Untranslatable
from dapo_megatron.migrate.import_config import migration_rows

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
BASE = REPO / "configs" / "dapo_base.yaml"

U = "untranslatable"

# The issue's four lists, key by key: (dialect, key, value, our settings or U + a phrase of
# the reason). Values are the ones the systems' DAPO guides use.
LISTED: list[tuple[str, str, Any, Any]] = [
    ("nemo-rl", "grpo.num_prompts_per_step", 512, {"dapo.num_prompts_per_step": 512}),
    ("nemo-rl", "grpo.num_generations_per_prompt", 16, {"dapo.num_generations_per_prompt": 16}),
    # grpo.py keeps the first num_prompts_per_step x n samples and drops the rest.
    ("nemo-rl", "grpo.use_dynamic_sampling", True, {"dapo.dynamic_sampling.enabled": True, "dapo.dynamic_sampling.metric": "score", "dapo.dynamic_sampling.surplus": "discard"}),
    ("nemo-rl", "grpo.batch_multiplier", 3, {"dapo.dynamic_sampling.batch_multiplier": 3.0}),
    # `rounds <= 10` after counting the round: 11 rounds run.
    ("nemo-rl", "grpo.dynamic_sampling_max_gen_batches", 10, {"dapo.dynamic_sampling.max_gen_batches": 11}),
    ("nemo-rl", "grpo.dynamic_sampling_max_gen_batches", 0, (U, "refuses 0")),
    ("nemo-rl", "grpo.reward_scaling.enabled", True, {"dapo.reward_scaling.enabled": True}),
    ("nemo-rl", "grpo.reward_scaling.source_min", 0.0, {"dapo.reward_scaling.source_min": 0.0}),
    ("nemo-rl", "grpo.reward_scaling.source_max", 1.0, {"dapo.reward_scaling.source_max": 1.0}),
    ("nemo-rl", "grpo.reward_scaling.target_min", -1.0, {"dapo.reward_scaling.target_min": -1.0}),
    ("nemo-rl", "grpo.reward_scaling.target_max", 1.0, {"dapo.reward_scaling.target_max": 1.0}),
    ("nemo-rl", "grpo.reward_shaping.enabled", True, {"dapo.overlong_buffer.enabled": True}),
    ("nemo-rl", "grpo.reward_shaping.overlong_buffer_length", 4096, {"dapo.overlong_buffer.length": 4096}),
    ("nemo-rl", "grpo.reward_shaping.overlong_buffer_penalty", 1.0, {"dapo.overlong_buffer.penalty_factor": 1.0}),
    ("nemo-rl", "grpo.reward_shaping.max_response_length", 20480, {"generation.max_response_length": 20480}),
    ("nemo-rl", "loss_fn.ratio_clip_min", 0.2, {"dapo.loss.clip_ratio_low": 0.2}),
    ("nemo-rl", "loss_fn.ratio_clip_max", 0.28, {"dapo.loss.clip_ratio_high": 0.28}),
    ("nemo-rl", "loss_fn.ratio_clip_c", 3.0, {"dapo.loss.clip_ratio_c": 3.0}),
    ("nemo-rl", "loss_fn.token_level_loss", True, {"dapo.loss.loss_agg_mode": "token-mean"}),
    ("nemo-rl", "loss_fn.token_level_loss", False, {"dapo.loss.loss_agg_mode": "seq-mean-token-mean"}),
    ("nemo-rl", "grpo.ratio_clip_min", 0.2, {"dapo.loss.clip_ratio_low": 0.2}),
    ("nemo-rl", "grpo.ratio_clip_max", 0.28, {"dapo.loss.clip_ratio_high": 0.28}),
    ("nemo-rl", "cluster.num_nodes", 4, {"cluster.num_nodes": 4}),
    ("nemo-rl", "cluster.gpus_per_node", 8, {"cluster.gpus_per_node": 8}),
    ("nemo-rl", "policy.model_name", "Qwen/Qwen2.5-Math-7B",
     {"policy.model_name_or_path": "Qwen/Qwen2.5-Math-7B", "policy.model_arch": "qwen2.5-math-7b"}),
    ("nemo-rl", "checkpointing.checkpoint_dir", "results/dapo", {"checkpointing.checkpoint_dir": "results/dapo"}),
    ("skyrl", "trainer.algorithm.eps_clip_low", 0.2, {"dapo.loss.clip_ratio_low": 0.2}),
    ("skyrl", "trainer.algorithm.eps_clip_high", 0.28, {"dapo.loss.clip_ratio_high": 0.28}),
    ("skyrl", "trainer.algorithm.dynamic_sampling.type", "filter", {"dapo.dynamic_sampling.enabled": True}),
    ("skyrl", "trainer.algorithm.dynamic_sampling.type", None, {"dapo.dynamic_sampling.enabled": False}),
    ("skyrl", "trainer.algorithm.dynamic_sampling.type", "replace", (U, "POLARIS")),
    ("skyrl", "trainer.algorithm.dynamic_sampling.max_sample_batches", 30, {"dapo.dynamic_sampling.max_gen_batches": 30}),
    ("skyrl", "trainer.algorithm.dynamic_sampling.max_sample_batches", -1, {"dapo.dynamic_sampling.max_gen_batches": -1}),
    ("skyrl", "trainer.algorithm.loss_reduction", "token_mean", {"dapo.loss.loss_agg_mode": "token-mean"}),
    ("skyrl", "trainer.algorithm.loss_reduction", "sequence_mean", {"dapo.loss.loss_agg_mode": "seq-mean-token-mean"}),
    ("skyrl", "generator.apply_overlong_filtering", True, {"dapo.overlong_filtering": True}),
    ("skyrl", "trainer.algorithm.overlong_buffer.len", 512,
     {"dapo.overlong_buffer.enabled": True, "dapo.overlong_buffer.length": 512}),
    ("skyrl", "trainer.algorithm.overlong_buffer.penalty_factor", 1.0, {"dapo.overlong_buffer.penalty_factor": 1.0}),
    ("rlinf", "algorithm.group_size", 16, {"dapo.num_generations_per_prompt": 16}),
    ("rlinf", "algorithm.clip_ratio_low", 0.2, {"dapo.loss.clip_ratio_low": 0.2}),
    ("rlinf", "algorithm.clip_ratio_high", 0.28, {"dapo.loss.clip_ratio_high": 0.28}),
    ("rlinf", "algorithm.loss_agg_func", "token-mean", {"dapo.loss.loss_agg_mode": "token-mean"}),
    # 5 resampling attempts after the first generation: 6 rounds.
    ("rlinf", "algorithm.max_resample", 5, {"dapo.dynamic_sampling.max_gen_batches": 6}),
    ("rlinf", "algorithm.safe_length", 16384, (U, "max_length - safe_length")),
    ("rlinf", "algorithm.max_length", 20480, {"generation.max_response_length": 20480}),
    ("rlinf", "algorithm.len_reward_penalty", 0.1, (U, "penalty_factor")),
    ("rlinf", "algorithm.kl_beta", 0.0, {"dapo.loss.kl_coef": 0.0}),
    ("rlinf", "algorithm.kl_penalty_type", "low_var_kl", {"dapo.loss.kl_estimator": "k3"}),
    ("rlinf", "algorithm.kl_penalty_type", "kl", {"dapo.loss.kl_estimator": "k1"}),
    ("rlinf", "algorithm.kl_penalty_type", "mse", {"dapo.loss.kl_estimator": "k2"}),
    ("rlinf", "algorithm.kl_penalty_type", "abs", (U, "no counterpart")),
    ("rlinf", "algorithm.entropy_bonus", 0.001, {"dapo.loss.entropy_coef": 0.001}),
    ("verl", "actor_rollout_ref.actor.clip_ratio_low", 0.2, {"dapo.loss.clip_ratio_low": 0.2}),
    ("verl", "actor_rollout_ref.actor.clip_ratio_high", 0.28, {"dapo.loss.clip_ratio_high": 0.28}),
    ("verl", "actor_rollout_ref.actor.clip_ratio_c", 10.0, {"dapo.loss.clip_ratio_c": 10.0}),
    ("verl", "actor_rollout_ref.actor.loss_agg_mode", "token-mean", {"dapo.loss.loss_agg_mode": "token-mean"}),
    # dapo_ray_trainer.py fit() trains batch[:traj_bsz] and drops the rest.
    ("verl", "algorithm.filter_groups.enable", True, {"dapo.dynamic_sampling.enabled": True, "dapo.dynamic_sampling.surplus": "discard"}),
    ("verl", "algorithm.filter_groups.metric", "acc", {"dapo.dynamic_sampling.metric": "acc"}),
    ("verl", "algorithm.filter_groups.metric", "seq_final_reward", {"dapo.dynamic_sampling.metric": "score"}),
    ("verl", "algorithm.filter_groups.max_num_gen_batches", 10, {"dapo.dynamic_sampling.max_gen_batches": 10}),
    ("verl", "data.gen_batch_size", 1536, (U, "1536 / 512 = 3")),
    ("verl", "reward_model.overlong_buffer.enable", False, {"dapo.overlong_buffer.enabled": False}),
    ("verl", "reward_model.overlong_buffer.len", 4096, {"dapo.overlong_buffer.length": 4096}),
    ("verl", "reward_model.overlong_buffer.penalty_factor", 1.0, {"dapo.overlong_buffer.penalty_factor": 1.0}),
    ("verl", "actor_rollout_ref.rollout.n", 16, {"dapo.num_generations_per_prompt": 16}),
]  # fmt: skip


@pytest.mark.parametrize("dialect, key, value, expected", LISTED, ids=lambda x: str(x))
def test_every_listed_key_maps_or_says_why_not(dialect, key, value, expected):
    fk = foreign_key(key, dialect)
    assert fk is not None, f"{dialect} {key} is not in the table"
    if isinstance(expected, tuple):
        with pytest.raises(Untranslatable, match=None) as info:
            fk.convert(value, {})
        assert expected[1] in str(info.value)
        return
    settings = dict(fk.convert(value, {}).settings)
    assert settings == expected
    assert all(type(settings[k]) is type(v) for k, v in expected.items())


def test_converters_read_sibling_keys():
    # verl: 1536 prompts per round over 512 trained = 3; RLinf: 20480 - 16384 = 4096.
    gen = foreign_key("data.gen_batch_size", "verl")
    assert gen is not None
    # With filter_groups off verl trains all 1536 (num_prompts_per_step), not 3 x 512.
    ctx = {"data.train_batch_size": 512, "algorithm.filter_groups.enable": True}
    assert dict(gen.convert(1536, ctx).settings) == {"dapo.dynamic_sampling.batch_multiplier": 3.0}
    safe = foreign_key("algorithm.safe_length", "rlinf")
    assert safe is not None
    assert dict(safe.convert(16384, {"algorithm.max_length": 20480}).settings) == {
        "dapo.overlong_buffer.enabled": True,
        "dapo.overlong_buffer.length": 4096,
    }
    # verl's mini-batch counts prompts: 32 prompts x 16 samples = 512 samples.
    mini = foreign_key("actor_rollout_ref.actor.ppo_mini_batch_size", "verl")
    assert mini is not None
    ctx = {"actor_rollout_ref.rollout.n": 16}
    assert dict(mini.convert(32, ctx).settings) == {"policy.train_global_batch_size": 512}


def test_table_names_only_valid_keys_and_no_key_twice():
    valid = set(all_keys())
    for fk in all_foreign_keys():  # all_foreign_keys raises on a duplicate (dialect, key)
        ours = fk.ours.split(" ")[0]
        assert ours.startswith("(") or ours in valid, f"{fk.key} -> {fk.ours}"


def test_migration_doc_has_every_row_of_the_table():
    doc = (REPO / "docs" / "MIGRATING.md").read_text(encoding="utf-8")
    missing = [row for row in migration_rows() if row not in doc]
    assert missing == []


# ---------------------------------------------------------------------------------------
# Errors that translate


def _cli(main: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`dapo-train` (main="train_main") or `dapo-plan` (main="plan_main") in a subprocess."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    code = f"import sys; from dapo_megatron.cli import {main}; sys.exit({main}())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    "override, system",
    [
        ("grpo.ratio_clip_max=0.28", "NeMo RL"),
        ("trainer.algorithm.eps_clip_high=0.28", "SkyRL"),
        ("algorithm.clip_ratio_high=0.28", "RLinf"),
        ("actor_rollout_ref.actor.clip_ratio_high=0.28", "verl"),
    ],
)
def test_the_issues_four_commands_print_our_key(override, system):
    out = _cli("train_main", "--config", str(TINY), "--dry-run", override)
    key = override.split("=")[0]
    assert out.returncode == 2
    assert out.stderr == (
        f"error: {key} in command line is {system}'s name; here it is "
        f"dapo.loss.clip_ratio_high (same meaning: the ratio is clipped at 1 + 0.28)\n"
    )


def test_a_foreign_key_in_a_recipe_names_the_file_and_converts(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"defaults: {BASE}\ngrpo:\n  dynamic_sampling_max_gen_batches: 10\n  batch_multiplier: 3\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(recipe)
    msg = str(info.value)
    assert msg.startswith(
        f"grpo.dynamic_sampling_max_gen_batches in {recipe} is NeMo RL's name; here it is "
        "dapo.dynamic_sampling.max_gen_batches=11 (converted: NeMo RL counts a round before "
        "checking `rounds <= 10`, so it runs up to 10 + 1 rounds"
    )
    assert "1 more NeMo RL key(s) follow: `" in msg
    assert "bin/dapo-import-config --from nemo-rl" in msg  # spelt as it runs: shared/commands.py
    assert "\n" not in msg


def test_no_exact_equivalent_says_what_to_set():
    with pytest.raises(ConfigError) as info:
        load_config(TINY, ["data.gen_batch_size=1536"])
    assert str(info.value).startswith(
        "data.gen_batch_size in command line is verl's name; it has no exact equivalent here: "
        "verl generates gen_batch_size prompts every round"
    )
    assert "set dapo.dynamic_sampling.batch_multiplier" in str(info.value)


def test_hydra_prefixed_key_is_explained_too():
    with pytest.raises(ConfigError, match=r"^trainer\.algorithm\.eps_clip_low in command line"):
        load_config(TINY, ["+trainer.algorithm.eps_clip_low=0.2"])
