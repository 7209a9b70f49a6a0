"""The verl points of issue #48, each against what verl's code does (cited per test).

verl: volcengine/verl b178a3cd; verl-recipe: verl-project/verl-recipe 48ea0a79
(tests/data/foreign/verl/SOURCES.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dapo_megatron.migrate.dialect_keys import foreign_key
from dapo_megatron.migrate.dialects import Translation, Untranslatable
from dapo_megatron.migrate.foreign_source import apply_foreign_overrides, read_source
from dapo_megatron.migrate.import_config import OURS_THAT_MATTER, translate
from dapo_megatron.migrate.import_config import main as import_main

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign" / "verl"
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
M = f"{A}.megatron"
OTC = f"{M}.override_transformer_config"
DS = "dapo.dynamic_sampling"
# The least a verl run needs (the rest takes verl's defaults)
MINIMAL: dict[str, Any] = {
    "actor_rollout_ref.model.path": "Qwen/Qwen2.5-7B",
    "data.train_files": "/data/dapo-math-17k.parquet",
    "data.val_files": "/data/aime-2024.parquet",
    "trainer.total_training_steps": 5,
    "algorithm.adv_estimator": "grpo",
    f"{R}.name": "vllm",
}


def _convert(key: str, value: Any, ctx: dict[str, Any] | None = None) -> Translation:
    fk = foreign_key(key, "verl")
    assert fk is not None, key
    return fk.convert(value, ctx or {})


def _refusal(key: str, value: Any, ctx: dict[str, Any] | None = None) -> str:
    with pytest.raises(Untranslatable) as info:
        _convert(key, value, ctx)
    return str(info.value)


def _values(flat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    result = translate("verl", {**MINIMAL, **flat})
    return {s.key: s.value for s in result.settings}, {s.key: s.reason for s in result.skipped}


# ---------------------------------------------------------------------------------------
# Dynamic sampling and the batch verl trains (verl-recipe dapo/dapo_ray_trainer.py fit)


def test_filter_groups_discards_the_surplus():
    # fit(): kept groups accumulate until num_prompt_in_batch >= train_batch_size, then
    # `traj_bsz = train_batch_size * n; batch = batch[:traj_bsz]` and `batch = None` after
    # the step: the surplus is dropped, never carried to the next step
    v, _ = _values({"algorithm.filter_groups.enable": True, "data.train_batch_size": 16})
    assert v[f"{DS}.enabled"] is True and v[f"{DS}.surplus"] == "discard"
    assert v["dapo.num_prompts_per_step"] == 16
    v, _ = _values({"algorithm.filter_groups.enable": False})
    assert v[f"{DS}.enabled"] is False and f"{DS}.surplus" not in v


def test_without_filter_groups_the_whole_generated_batch_is_trained():
    # fit(): the dataloader yields gen_batch_size prompts (ray_trainer.py
    # _create_dataloader: data.get("gen_batch_size", train_batch_size)); with
    # filter_groups.enable false `batch = new_batch`: all 48 prompts are trained, not 16
    flat = {
        "algorithm.filter_groups.enable": False,
        "data.train_batch_size": 16,
        "data.gen_batch_size": 48,
        f"{A}.ppo_mini_batch_size": 16,
        f"{R}.n": 4,
        f"{A}.optim.lr_warmup_steps": 5,
    }
    v, _ = _values(flat)
    assert v["dapo.num_prompts_per_step"] == 48
    assert v["policy.train_global_batch_size"] == 16 * 4
    # warm-up: 5 trainer steps, each 48 / 16 = 3 optimizer steps, one lr over each step
    result = translate("verl", {**MINIMAL, **flat})
    note = next(s.note for s in result.settings if s.key == "policy.scheduler.lr_warmup_steps")
    assert v["policy.scheduler.lr_warmup_steps"] == 5 and "of 3 optimizer steps each" in note
    assert "gen_batch_size 48" in note
    # with filter_groups on, 48 are generated per round and 16 trained
    v, _ = _values({**flat, "algorithm.filter_groups.enable": True})
    assert v["dapo.num_prompts_per_step"] == 16 and v[f"{DS}.batch_multiplier"] == 3.0


def test_early_dapo_script_trains_its_gen_batch():
    # run_dapo_early_qwen2.5_32b.sh: filter off, gen_prompt_bsz=512 = train_prompt_bsz
    flat = read_source(DATA / "run_dapo_early_qwen2.5_32b.sh", {"HOME": "/h"})
    v = {s.key: s.value for s in translate("verl", flat).settings}
    assert v["dapo.num_prompts_per_step"] == 512 and v[f"{DS}.enabled"] is False


# ---------------------------------------------------------------------------------------
# Layout (verl/workers/config/engine.py McoreEngineConfig; workers/actor/megatron_actor.py)


@pytest.mark.parametrize(
    "flat, sp",
    [
        ({f"{M}.tensor_model_parallel_size": 4}, True),  # default true, TP > 1
        ({f"{M}.tensor_model_parallel_size": 1}, False),  # __post_init__: off at TP 1
        ({f"{M}.tensor_model_parallel_size": 4, f"{M}.sequence_parallel": False}, False),
        ({}, False),  # verl's default TP 1
    ],
)
def test_sequence_parallel_follows_verls_rule(flat, sp):
    v, _ = _values(flat)
    assert v["policy.megatron.sequence_parallel"] is sp


def test_ulysses_is_our_context_parallel():
    t = _convert(f"{A}.ulysses_sequence_parallel_size", 8)
    assert dict(t.settings) == {"policy.megatron.context_parallel_size": 8}
    assert "same math" in t.note and "all-to-all" in t.note and "ring" in t.note


def test_micro_batches_and_token_budgets():
    # fixed micro-batches: samples per GPU, as ours
    v, _ = _values(
        {f"{A}.ppo_micro_batch_size_per_gpu": 2, f"{R}.log_prob_micro_batch_size_per_gpu": 4}
    )
    assert (v["policy.train_micro_batch_size"], v["policy.logprob_micro_batch_size"]) == (2, 4)
    # use_dynamic_bsz: megatron_actor.py passes ppo_max_token_len_per_gpu x CP to
    # seqlen_balancing.py rearrange_micro_batches, which needs max_token_len >= the longest
    # sequence; the per-GPU sample counts are not read
    flat = {
        f"{A}.use_dynamic_bsz": True,
        f"{A}.ppo_max_token_len_per_gpu": 12000,
        f"{M}.context_parallel_size": 2,
        f"{A}.ppo_micro_batch_size_per_gpu": 2,
    }
    v, _ = _values(flat)
    assert v["policy.max_tokens_per_microbatch"] == 24000
    assert "policy.train_micro_batch_size" not in v


def test_fsdp_workers_gradient_checkpointing_and_ulysses_budget():
    # FSDP (fsdp_config keys): enable_gradient_checkpointing is HF's per-layer checkpointing,
    # our full recompute; dp_actor.py multiplies the token budget by the Ulysses size
    fsdp = {f"{A}.fsdp_config.param_offload": False}
    t = _convert("actor_rollout_ref.model.enable_gradient_checkpointing", True, fsdp)
    assert dict(t.settings) == {"policy.megatron.recompute_granularity": "full"}
    # Megatron workers do not read it (megatron_workers.py builds from override_transformer_config)
    assert (
        _convert("actor_rollout_ref.model.enable_gradient_checkpointing", True, {}).settings == ()
    )
    ctx = {
        **fsdp,
        f"{A}.ulysses_sequence_parallel_size": 8,
        f"{A}.ppo_max_token_len_per_gpu": 22528,
    }
    t = _convert(f"{A}.use_dynamic_bsz", True, ctx)
    assert dict(t.settings) == {"policy.max_tokens_per_microbatch": 22528 * 8}


@pytest.mark.parametrize(
    "value, ctx, ours",
    [
        ("full", {f"{OTC}.recompute_method": "uniform", f"{OTC}.recompute_num_layers": 1}, "full"),
        ("selective", {}, "selective"),  # Megatron's default module: core_attn
        (None, {}, "none"),
    ],
)
def test_recompute_carried_where_exact(value, ctx, ours):
    t = _convert(f"{OTC}.recompute_granularity", value, ctx)
    assert dict(t.settings) == {"policy.megatron.recompute_granularity": ours}


def test_recompute_of_other_shapes_is_refused():
    mods = {f"{OTC}.recompute_modules": ["core_attn", "moe_act", "mlp"]}
    assert "lacks" in _refusal(f"{OTC}.recompute_granularity", "selective", mods)
    blocks = {f"{OTC}.recompute_method": "block", f"{OTC}.recompute_num_layers": 4}
    assert "lacks" in _refusal(f"{OTC}.recompute_granularity", "full", blocks)


@pytest.mark.parametrize(
    "key",
    [
        f"{M}.param_offload",
        f"{M}.grad_offload",
        f"{M}.optimizer_offload",
        f"{A}.fsdp_config.param_offload",
        f"{A}.optim.override_optimizer_config.optimizer_cpu_offload",
    ],
)
def test_cpu_offload_is_refused_by_name(key):
    assert "needs CPU offload" in _refusal(key, True)
    assert _convert(key, False).settings == ()


def test_expert_layout():
    v, _ = _values({f"{M}.tensor_model_parallel_size": 2, f"{M}.expert_model_parallel_size": 8})
    assert v["policy.megatron.expert_model_parallel_size"] == 8
    tp2 = {f"{M}.tensor_model_parallel_size": 2}
    assert _convert(f"{M}.expert_tensor_parallel_size", 2, tp2).settings == ()
    assert _convert(f"{M}.expert_tensor_parallel_size", None, tp2).settings == ()  # ETP = TP
    assert "expert tensor-parallel" in _refusal(f"{M}.expert_tensor_parallel_size", 1, tp2)


def test_engine():
    assert dict(_convert(f"{R}.name", "vllm").settings) == {"generation.backend": "vllm"}
    assert "the sglang inference engine" in _refusal(f"{R}.name", "sglang")
    v, _ = _values({f"{R}.tensor_model_parallel_size": 4, f"{R}.gpu_memory_utilization": 0.7})
    assert v["generation.engine.tensor_parallel_size"] == 4
    assert v["generation.engine.gpu_memory_utilization"] == 0.7
    v, _ = _values({})  # verl's rollout defaults: TP 2, 0.5
    assert v["generation.engine.tensor_parallel_size"] == 2
    assert v["generation.engine.gpu_memory_utilization"] == 0.5


# ---------------------------------------------------------------------------------------
# Paths: the model, the data files


def test_unresolved_model_path_is_refused_never_replaced():
    reason = _refusal("actor_rollout_ref.model.path", "${HOME}/verl/models/Qwen2.5-Math-7B")
    assert "cannot resolve" in reason and "never put in its place" in reason


def test_unresolved_home_model_is_not_written_as_our_default(tmp_path, capsys):
    out = tmp_path / "r.yaml"
    src = str(DATA / "test_dapo_7b_math_megatron.sh")
    assert import_main(["--from", "verl", src, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "actor_rollout_ref.model.path" in err and not out.exists()


@pytest.mark.parametrize(
    "path, hub, fmt",
    [
        # verl-recipe dapo/prepare_dapo_data.sh: ${VERL_HOME:-${HOME}/verl}/data/<name>
        (
            "/home/u/verl/data/dapo-math-17k.parquet",
            "hf://BytedTsinghua-SIA/DAPO-Math-17k",
            "dapo_math",
        ),
        (
            "${HOME}/verl/data/dapo-math-17k.parquet",
            "hf://BytedTsinghua-SIA/DAPO-Math-17k",
            "dapo_math",
        ),
        (
            "${RAY_DATA_HOME}/data/dapo-math-17k.parquet",
            "hf://BytedTsinghua-SIA/DAPO-Math-17k",
            "dapo_math",
        ),
        # verl's examples/data_preprocess/gsm8k.py: openai/gsm8k (main) -> train/test.parquet
        ("/root/data/gsm8k/train.parquet", "hf://openai/gsm8k:train", "gsm8k"),
    ],
)
def test_the_peers_data_files_are_our_hub_datasets(path, hub, fmt):
    t = _convert("data.train_files", path)
    assert dict(t.settings)["data.train_path"] == hub and dict(t.settings)["data.format"] == fmt
    assert "recognised by its file name" in t.note


def test_val_file_names():
    ctx = {"data.train_files": "/d/dapo-math-17k.parquet"}
    t = _convert("data.val_files", "${HOME}/verl/data/aime-2024.parquet", ctx)
    assert dict(t.settings) == {"data.val_path": "hf://BytedTsinghua-SIA/AIME-2024"}
    t = _convert("data.val_files", "/root/data/gsm8k/test.parquet", {})
    assert dict(t.settings)["data.val_path"] == "hf://openai/gsm8k:test"


def test_files_we_cannot_identify():
    # examples/data_preprocess/math_dataset.py downloads DigitalLearningGmbH/MATH-lighteval
    # (the whole MATH test set), not MATH-500: refused
    assert "MATH-lighteval" in _refusal("data.val_files", "/home/u/data/math/test.parquet")
    assert "a dataset file we cannot identify" in _refusal("data.train_files", "${DATA}/x.parquet")
    t = _convert("data.train_files", "/data/mine.parquet")
    assert dict(t.settings) == {"data.train_path": "/data/mine.parquet"}


# ---------------------------------------------------------------------------------------
# Notes say the value written


def test_test_freq_notes_describe_the_value():
    t = _convert("trainer.test_freq", 10)
    assert dict(t.settings) == {"validation.val_period": 10} and "every 10 steps" in t.note
    t = _convert("trainer.test_freq", -1)
    assert dict(t.settings) == {"validation.val_period": 0} and "never" in t.note


# ---------------------------------------------------------------------------------------
# Keys with a knob here, keys that do what we always do


def test_keys_with_a_knob_here():
    v, _ = _values(
        {
            "data.prompt_key": "question",
            f"{A}.grad_clip": 0.5,
            "actor_rollout_ref.model.tokenizer_path": "Qwen/Qwen2.5-7B-Instruct",
        }
    )
    assert v["data.prompt_key"] == "question" and v["policy.optimizer.clip_grad"] == 0.5
    assert v["policy.tokenizer_name_or_path"] == "Qwen/Qwen2.5-7B-Instruct"
    v, _ = _values({})  # verl's default clip_grad 1.0 (optim.clip_grad)
    assert v["policy.optimizer.clip_grad"] == 1.0


def test_run_length():
    # ray_trainer.py fit: the run ends at global_steps >= total_training_steps or when the
    # `for epoch in range(..., total_epochs)` loop over the drop_last dataloader runs out,
    # whichever first: both bounds are carried (over a dataset read alike: gsm8k)
    gsm = {"data.train_files": "/data/gsm8k/train.parquet"}
    v, skipped = _values({**gsm, "trainer.total_epochs": 10})
    assert v["dapo.max_num_steps"] == 5 and v["dapo.max_num_epochs"] == 10
    assert "trainer.total_epochs" not in skipped
    # Without total_training_steps verl's cap is len(dataloader) x total_epochs, never
    # reached before the data runs out: the epochs alone (our max_num_steps stays untraced)
    flat = {k: x for k, x in MINIMAL.items() if k != "trainer.total_training_steps"}
    result = translate("verl", {**flat, **gsm, "trainer.total_epochs": 10})
    v = {s.key: s.value for s in result.settings}
    assert v["dapo.max_num_epochs"] == 10 and "dapo.max_num_steps" not in v
    assert "trainer.total_epochs" not in {s.key for s in result.skipped}
    note = {s.key: s.note for s in result.settings}["dapo.max_num_epochs"]
    assert "10 pass(es) over the data" in note and "drop_last" in note
    # Omitted: verl's default total_epochs 30 (ppo_trainer.yaml trainer.total_epochs)
    v, _ = _values(gsm)
    assert v["dapo.max_num_epochs"] == 30
    assert "would train no step" in _refusal("trainer.total_epochs", 0)


def test_run_length_over_dapo_math_17k():
    # RLHFDataset reads dapo-math-17k.parquet whole: 1,791,700 rows, each problem ~100
    # times; ours reads each problem once, so verl's epochs are not ours. 5 steps x 512
    # prompts <= 10 x 1,791,700: the steps end the run first, no epoch bound is written
    v, skipped = _values({"trainer.total_epochs": 10, "data.train_batch_size": 512})
    assert v["dapo.max_num_steps"] == 5 and "dapo.max_num_epochs" not in v
    assert "trainer.total_epochs" not in skipped
    # no step cap, filter_groups off: 10 passes of 1791700 // 512 = 3499 batches (drop_last)
    flat = {k: x for k, x in MINIMAL.items() if k != "trainer.total_training_steps"}
    result = translate("verl", {**flat, "trainer.total_epochs": 10, "data.train_batch_size": 512})
    v = {s.key: s.value for s in result.settings}
    assert v["dapo.max_num_steps"] == 34_990 and "dapo.max_num_epochs" not in v
    # filter_groups on (up to 10 rounds a step) and no step cap: refused
    result = translate(
        "verl",
        {
            **flat,
            "trainer.total_epochs": 1,
            "data.train_batch_size": 512,
            "algorithm.filter_groups.enable": True,
            "algorithm.filter_groups.max_num_gen_batches": 10,
        },
    )
    refused = {s.key: s.reason for s in result.blocking}
    assert "needs an epoch over" in refused["trainer.total_epochs"]
    # No round limit (max_num_gen_batches <= 0, dapo_trainer.yaml's default when omitted): a
    # step may draw any number of prompts, so even a step cap bounds nothing: refused, and
    # the omitted limit is carried as 0, never our 10.
    for limit in ({"algorithm.filter_groups.max_num_gen_batches": 0}, {}):
        result = translate(
            "verl",
            {
                **flat,
                "trainer.total_training_steps": 1_000_000,
                "trainer.total_epochs": 1,
                "data.train_batch_size": 512,
                "algorithm.filter_groups.enable": True,
                **limit,
            },
        )
        v = {s.key: s.value for s in result.settings}
        assert v["dapo.dynamic_sampling.max_gen_batches"] == 0
        assert (
            "needs an epoch over"
            in {s.key: s.reason for s in result.blocking}["trainer.total_epochs"]
        )


@pytest.mark.parametrize(
    "key, good, bad, feature",
    [
        ("algorithm.adv_estimator", "grpo", "gae", "the gae advantage estimator"),
        ("algorithm.use_kl_in_reward", False, True, "a KL penalty in the reward"),
        (f"{R}.val_kwargs.top_k", -1, 20, "top-k sampling in validation"),
        ("reward_model.reward_manager", "dapo", "prime", "the prime reward manager"),
        ("trainer.device", "cuda", "npu", "NPU devices"),
        ("actor_rollout_ref.model.lora.rank", 0, 32, "LoRA"),
        (f"{M}.virtual_pipeline_model_parallel_size", None, 2, "virtual pipeline stages"),
    ],
)
def test_same_as_here_or_refused_by_feature(key, good, bad, feature):
    _convert(key, good, {})
    assert feature in _refusal(key, bad, {})


def test_overlong_penalty_length_and_unused_kl_coef():
    # DAPORewardManager: the penalty ramps over [max_resp_len - len, max_resp_len]; ours
    # over [max_response_length - len, max_response_length]: the same at the same length
    ctx = {"data.max_response_length": 8192}
    assert _convert("reward_model.reward_kwargs.max_resp_len", 8192, ctx).settings == ()
    assert "overlong-penalty length" in _refusal(
        "reward_model.reward_kwargs.max_resp_len", 4096, ctx
    )
    assert _convert("algorithm.kl_ctrl.kl_coef", 0.001, {}).settings == ()  # unused
    assert "KL penalty in the reward" in _refusal(
        "algorithm.kl_ctrl.kl_coef", 0.001, {"algorithm.use_kl_in_reward": True}
    )


def test_kl_loss():
    v, _ = _values({f"{A}.use_kl_loss": True, f"{A}.kl_loss_coef": 0.001})
    assert v["dapo.loss.kl_coef"] == 0.001
    v, skipped = _values({f"{A}.use_kl_loss": False, f"{A}.kl_loss_coef": 0.001})
    assert v["dapo.loss.kl_coef"] == 0.0 and f"{A}.kl_loss_coef" not in skipped


def test_truncation_and_the_reference_model_are_not_live():
    _, skipped = _values(
        {"data.truncation": "left", "actor_rollout_ref.ref.megatron.tensor_model_parallel_size": 8}
    )
    assert "not live" in skipped["data.truncation"]
    assert (
        "no reference model" in skipped["actor_rollout_ref.ref.megatron.tensor_model_parallel_size"]
    )


def test_defaults_leave_nothing_that_matters_at_ours():
    """verl's defaults (_generated_ppo_megatron_trainer.yaml, verl-recipe
    dapo_megatron_trainer.yaml) trace every key of OURS_THAT_MATTER but validation.temperature
    (greedy validation: verl's val_kwargs.do_sample false, temperature 0)."""
    result = translate("verl", dict(MINIMAL))
    assert result.kept_ours == []  # a greedy validation needs no temperature traced
    v = {s.key: s.value for s in result.settings}
    assert v["validation.greedy"] is True
    assert set(OURS_THAT_MATTER) - set(v) == {"validation.temperature"}
    # values of verl's defaults, read from the generated config
    assert v["dapo.loss.clip_ratio_high"] == 0.2 and v["dapo.loss.clip_ratio_c"] == 3.0
    assert v["policy.optimizer.weight_decay"] == 0.01 and v["dapo.num_prompts_per_step"] == 1024
    assert v["policy.train_global_batch_size"] == 256 * 1
    assert v["data.max_prompt_length"] == 512 and v["generation.max_response_length"] == 512
    assert (v["cluster.num_nodes"], v["cluster.gpus_per_node"]) == (1, 8)


def test_hydra_override_turns_a_refusal_into_a_plan(tmp_path, capsys):
    """With the refused CPU offload and the epoch run length replaced on the command line
    (the source's syntax), verl-recipe's 7B Megatron DAPO script plans at its layout:
    TP 4, PP 2, 4 nodes x 16 GPUs, sequence parallel on."""
    out = tmp_path / "r.yaml"
    argv = [
        "--from", "verl", str(DATA / "test_dapo_7b_math_megatron.sh"), "-o", str(out),
        "--shell-var", "HOME=/home/u",
        f"{M}.param_offload=false", f"{M}.grad_offload=false", f"{M}.optimizer_offload=false",
        "trainer.total_training_steps=100",
    ]  # fmt: skip
    code = import_main(argv)
    text = capsys.readouterr().out
    assert "dapo-plan: TP4 PP2 CP1 DP8 +SP on 4 node(s)" in text, text
    assert code == 0 and "fits" in text
    flat = read_source(DATA / "test_dapo_7b_math_megatron.sh", {"HOME": "/h"})
    apply_foreign_overrides(flat, argv[7:])
    v = {s.key: s.value for s in translate("verl", flat).settings}
    assert v["policy.megatron.sequence_parallel"] is True


def test_gsm8k_file_carries_verls_prompt_and_strict_reward():
    """examples/data_preprocess/gsm8k.py: question = question_raw + " " + 'Let's think step
    by step and output the final answer after "####".'; verl/utils/reward_score/gsm8k.py
    scores the last `#### N` of the last 300 characters as text: our gsm8k_verl."""
    s = dict(_convert("data.train_files", "/root/data/gsm8k/train.parquet").settings)
    assert s["reward.verifier"] == "gsm8k_verl"
    assert s["data.prompt_template"].format("What is 2+3?") == (
        'What is 2+3? Let\'s think step by step and output the final answer after "####".'
    )
