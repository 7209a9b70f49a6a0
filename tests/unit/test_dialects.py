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
from dapo_megatron.migrate.import_config import main as import_main
from dapo_megatron.migrate.import_config import migration_rows

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
BASE = REPO / "configs" / "dapo_base.yaml"

U = "untranslatable"

# The issue's four lists, key by key: (dialect, key, value, our settings or U + a phrase of
# the reason). Values are the ones the systems' DAPO guides use.
LISTED: list[tuple[str, str, Any, Any]] = [
    ("nemo-rl", "grpo.num_prompts_per_step", 512, {"dapo.num_prompts_per_step": 512}),
    ("nemo-rl", "grpo.num_generations_per_prompt", 16, {"dapo.num_generations_per_prompt": 16}),
    ("nemo-rl", "grpo.use_dynamic_sampling", True, {"dapo.dynamic_sampling.enabled": True}),
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
     {"policy.model_name_or_path": "models/Qwen2.5-Math-7B", "policy.model_arch": "qwen2.5-math-7b"}),
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
    ("verl", "algorithm.filter_groups.enable", True, {"dapo.dynamic_sampling.enabled": True}),
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
    ctx = {"data.train_batch_size": 512}
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
    assert "1 more NeMo RL key(s) follow: `dapo-import-config --from nemo-rl" in msg
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


# ---------------------------------------------------------------------------------------
# Importing whole configs

# NeMo RL's DAPO example as its guide lists it (docs/guides/dapo.md, recipes/llm/h100/
# dapo-qwen2.5-7b.yaml), plus the layout keys that make its 21504-token sequences fit.
NEMO_DAPO = """\
grpo:
  num_prompts_per_step: 512
  num_generations_per_prompt: 16
  use_dynamic_sampling: true
  batch_multiplier: 3
  dynamic_sampling_max_gen_batches: 10
  reward_scaling: {enabled: true, source_min: 0.0, source_max: 1.0, target_min: -1.0, target_max: 1.0}
  reward_shaping:
    enabled: true
    overlong_buffer_length: 4096
    overlong_buffer_penalty: 1.0
    max_response_length: 20480
loss_fn:
  ratio_clip_min: 0.2
  ratio_clip_max: 0.28
  ratio_clip_c: null
  token_level_loss: true
  use_on_policy_kl_approximation: false
policy:
  model_name: Qwen/Qwen2.5-7B
  max_total_sequence_length: 21504
  megatron_cfg: {enabled: true, tensor_model_parallel_size: 4, sequence_parallel: true, activation_checkpointing: true}
cluster:
  num_nodes: 2
  gpus_per_node: 8
checkpointing:
  checkpoint_dir: results/dapo-qwen2.5-7b
"""

# Where a CPU machine differs from the recipe's cluster: the checks of a real run, on CPU.
CPU_MACHINE = [
    "cluster.device=cpu", "cluster.num_nodes=1", "cluster.gpus_per_node=4",
    "generation.backend=megatron", "policy.init_model_if_missing=true",
    "data.format=arithmetic", "data.train_path=null", "data.val_path=null",
    "data.arithmetic.difficulty=3", "reward.verifier=arithmetic",
]  # fmt: skip


def _import(tmp_path: Path, dialect: str, name: str, text: str, *overrides: str) -> Path:
    source = tmp_path / name
    source.write_text(text)
    out = tmp_path / "recipes" / "mine.yaml"
    argv = ["--from", dialect, str(source), "-o", str(out), "--allow-untranslated"]
    assert import_main([*argv, *overrides]) == 0
    return out


def test_nemo_rl_dapo_example_imports_to_a_runnable_recipe(tmp_path, capsys):
    out = _import(tmp_path, "nemo-rl", "dapo-qwen2.5-7b.yaml", NEMO_DAPO, "grpo.seed=7")
    printed = capsys.readouterr().out
    assert "UNTRANSLATED, 1 key(s) that changes the algorithm" in printed
    assert "  loss_fn.use_on_policy_kl_approximation = false: no counterpart here\n" in printed
    text = out.read_text()
    assert f"defaults: {os.path.relpath(BASE, out.parent)}\n" in text
    assert "#   loss_fn.use_on_policy_kl_approximation = false: no counterpart here" in text
    assert "# UNTRANSLATED, 1 key(s)" in text
    assert "max_gen_batches: 11  # grpo.dynamic_sampling_max_gen_batches: converted" in text

    cfg = load_config(out).config
    d = cfg.dapo
    assert (d.num_prompts_per_step, d.num_generations_per_prompt) == (512, 16)
    ds = d.dynamic_sampling
    assert (ds.enabled, ds.batch_multiplier, ds.max_gen_batches) == (True, 3.0, 11)
    rs = d.reward_scaling
    assert (rs.enabled, rs.source_min, rs.source_max, rs.target_min, rs.target_max) == (
        True, 0.0, 1.0, -1.0, 1.0,
    )  # fmt: skip
    ob = d.overlong_buffer
    assert (ob.enabled, ob.length, ob.penalty_factor) == (True, 4096, 1.0)
    assert cfg.generation.max_response_length == 20480
    assert (d.loss.clip_ratio_low, d.loss.clip_ratio_high, d.loss.clip_ratio_c) == (0.2, 0.28, None)
    assert d.loss.loss_agg_mode == "token-mean"
    assert (cfg.run.seed, cfg.policy.model_arch, cfg.policy.megatron.recompute_granularity) == (
        7, "qwen2.5-7b", "full",
    )  # fmt: skip

    run_dir = f"run.output_dir={tmp_path / 'run'}"
    model = f"policy.model_name_or_path={tmp_path / 'model'}"
    dry = _cli("train_main", "--config", str(out), "--dry-run", *CPU_MACHINE, run_dir, model)
    assert dry.returncode == 0, dry.stderr
    assert "dry run: configuration, data, model, tokenizer and devices are valid" in dry.stdout
    assert "1536 prompts in round 1, at most 11 full rounds' worth of prompts" in dry.stdout
    # The recipe's own cluster (2 nodes x 8 GPUs) planned as on GPUs: it fits 80 GiB.
    plan = _cli("plan_main", "--config", str(out), "cluster.device=cuda")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "memory: fits" in plan.stdout


SKYRL_SCRIPT = r"""#!/bin/bash
set -x
EPS_CLIP_LOW=0.2
EPS_CLIP_HIGH=0.28
DYNAMIC_SAMPLING_TYPE=filter
DYNAMIC_SAMPLING_MAX_SAMPLE_BATCHES=30
LOSS_REDUCTION="token_mean"
OVERLONG_BUFFER_LEN=$((1024 * 4))
TRAIN_BATCH_SIZE=512
uv run --isolated --extra vllm -m examples.algorithms.dapo.main_dapo \
  trainer.algorithm.advantage_estimator="grpo" \
  trainer.policy.model.path="Qwen/Qwen2.5-Math-7B" \
  +trainer.algorithm.overlong_buffer.len=$OVERLONG_BUFFER_LEN \
  +trainer.algorithm.overlong_buffer.penalty_factor=1.0 \
  trainer.algorithm.eps_clip_low=$EPS_CLIP_LOW \
  trainer.algorithm.eps_clip_high=$EPS_CLIP_HIGH \
  trainer.algorithm.dynamic_sampling.type=$DYNAMIC_SAMPLING_TYPE \
  trainer.algorithm.dynamic_sampling.max_sample_batches=$DYNAMIC_SAMPLING_MAX_SAMPLE_BATCHES \
  trainer.algorithm.loss_reduction=$LOSS_REDUCTION \
  generator.apply_overlong_filtering=true \
  trainer.train_batch_size=$TRAIN_BATCH_SIZE \
  trainer.policy_mini_batch_size=32 \
  generator.n_samples_per_prompt=16 \
  generator.sampling_params.max_generate_length=8192 \
  trainer.placement.policy_num_nodes=4 \
  $@
"""


def test_skyrl_dapo_script_imports(tmp_path, capsys):
    out = _import(tmp_path, "skyrl", "run_dapo.sh", SKYRL_SCRIPT)
    assert (
        "trainer.algorithm.advantage_estimator = grpo: no counterpart here"
        in capsys.readouterr().out
    )
    cfg = load_config(out).config
    d = cfg.dapo
    assert (d.loss.clip_ratio_low, d.loss.clip_ratio_high, d.loss.loss_agg_mode) == (
        0.2,
        0.28,
        "token-mean",
    )
    assert (d.dynamic_sampling.enabled, d.dynamic_sampling.max_gen_batches) == (True, 30)
    assert (d.overlong_buffer.enabled, d.overlong_buffer.length, d.overlong_filtering) == (
        True,
        4096,
        True,
    )
    assert (d.num_prompts_per_step, d.num_generations_per_prompt) == (512, 16)
    assert cfg.policy.train_global_batch_size == 32 * 16  # prompts there, samples here
    assert (cfg.generation.max_response_length, cfg.cluster.num_nodes) == (8192, 4)


RLINF_DAPO = """\
cluster:
  num_nodes: 4
data:
  rollout_batch_size: 512
algorithm:
  adv_type: grpo
  loss_agg_func: "token-mean"
  group_size: 16
  clip_ratio_high: 0.28
  clip_ratio_low: 0.20
  len_reward_penalty: 0.1
  safe_length: 16384
  max_length: 20480
  max_resample: 5
  kl_beta: 0.0
  kl_penalty_type: low_var_kl
  entropy_bonus: 0.0
"""


def test_rlinf_dapo_config_imports(tmp_path, capsys):
    out = _import(tmp_path, "rlinf", "qwen2.5-7b-dapo.yaml", RLINF_DAPO)
    printed = capsys.readouterr().out
    assert "algorithm.len_reward_penalty = 0.1: RLinf's guide calls it" in printed
    assert "#   algorithm.len_reward_penalty = 0.1:" in out.read_text()
    d = load_config(out).config.dapo
    assert (d.num_generations_per_prompt, d.num_prompts_per_step) == (16, 512)
    assert (d.overlong_buffer.length, d.dynamic_sampling.max_gen_batches) == (20480 - 16384, 6)
    assert (d.loss.kl_coef, d.loss.kl_estimator, d.loss.entropy_coef) == (0.0, "k3", 0.0)


VERL_SCRIPT = r"""#!/usr/bin/env bash
adv_estimator=grpo
clip_ratio_low=0.2
clip_ratio_high=0.28
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
enable_overlong_buffer=True
overlong_buffer_len=$((1024 * 4))
enable_filter_groups=True
filter_groups_metric=acc
max_num_gen_batches=10
train_prompt_bsz=512
gen_prompt_bsz=$((train_prompt_bsz * 3))
n_resp_per_prompt=16
NNODES=${NNODES:-16}
python3 -m recipe.dapo.main_dapo \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.gen_batch_size=${gen_prompt_bsz} \
    data.train_batch_size=${train_prompt_bsz} \
    actor_rollout_ref.rollout.n=${n_resp_per_prompt} \
    algorithm.adv_estimator=${adv_estimator} \
    actor_rollout_ref.actor.clip_ratio_low=${clip_ratio_low} \
    actor_rollout_ref.actor.clip_ratio_high=${clip_ratio_high} \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    algorithm.filter_groups.enable=${enable_filter_groups} \
    algorithm.filter_groups.max_num_gen_batches=${max_num_gen_batches} \
    algorithm.filter_groups.metric=${filter_groups_metric} \
    actor_rollout_ref.actor.loss_agg_mode="token-mean" \
    +reward_model.overlong_buffer.enable=${enable_overlong_buffer} \
    +reward_model.overlong_buffer.len=${overlong_buffer_len} \
    +reward_model.overlong_buffer.penalty_factor=1.0 \
    trainer.nnodes="${NNODES}"
"""


def test_verl_dapo_script_imports_with_hydra_overrides(tmp_path):
    out = _import(
        tmp_path, "verl", "run_dapo_qwen2.5_32b.sh", VERL_SCRIPT,
        "actor_rollout_ref.actor.clip_ratio_high=0.3", "++trainer.nnodes=4",
        "+reward_model.overlong_buffer.enable=false",
    )  # fmt: skip
    cfg = load_config(out).config
    d = cfg.dapo
    assert (d.loss.clip_ratio_low, d.loss.clip_ratio_high, d.loss.clip_ratio_c) == (0.2, 0.3, 10.0)
    ds = d.dynamic_sampling
    assert (ds.enabled, ds.metric, ds.max_gen_batches, ds.batch_multiplier) == (
        True,
        "acc",
        10,
        3.0,
    )
    assert (d.overlong_buffer.enabled, d.overlong_buffer.length) == (False, 4096)
    assert (cfg.data.max_prompt_length, cfg.generation.max_response_length) == (2048, 8192)
    assert (d.num_prompts_per_step, d.num_generations_per_prompt, cfg.cluster.num_nodes) == (
        512,
        16,
        4,
    )


def test_import_refuses_to_overwrite_and_names_the_fix(tmp_path, capsys):
    out = _import(tmp_path, "rlinf", "a.yaml", RLINF_DAPO)
    assert import_main(["--from", "rlinf", str(tmp_path / "a.yaml"), "-o", str(out)]) == 2
    assert capsys.readouterr().err.endswith("exists; choose another -o or pass --force\n")


def test_console_script_is_declared():
    setup = (REPO / "setup.py").read_text()
    assert '"dapo-import-config=dapo_megatron.migrate.import_config:main"' in setup
    # Installed with the package (scripts/setup.sh reinstalls when setup.py changes).
    assert (Path(sys.executable).parent / "dapo-import-config").is_file()
