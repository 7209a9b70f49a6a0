"""dapo-import-config (migrate/import_config.py): whole foreign configs imported.

On real peer configs (tests/data/foreign, README there): each value carried is checked
against the value read by hand from the peer's script and code. The issue's examples
(issue 33) are imported to runnable recipes."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dapo_megatron.config import load_config
from dapo_megatron.migrate.foreign_source import read_source
from dapo_megatron.migrate.import_config import main as import_main
from dapo_megatron.migrate.import_config import translate

DATA = Path(__file__).resolve().parents[2] / "data" / "foreign"


def _values(dialect: str, name: str, **env: str) -> dict:
    result = translate(dialect, read_source(DATA / name, env))
    return {s.key: s.value for s in result.settings}


def test_verl_dapo_32b_script():
    v = _values("verl", "verl/run_dapo_qwen2.5_32b.sh", HOME="/home/u")
    # ${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-32B"}, RAY_DATA_HOME=${HOME}/verl
    assert v["policy.model_name_or_path"] == "/home/u/verl/models/Qwen2.5-32B"
    assert v["policy.train_global_batch_size"] == 32 * 16  # mini-batch 32 prompts x n 16
    # lr_warmup_steps=10 trainer steps, stepped per trainer step here too (test_verl_keys.py)
    assert v["policy.optimizer.lr"] == 1e-6 and v["policy.scheduler.lr_warmup_steps"] == 10
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.loss.clip_ratio_c"] == 10.0
    # filter_groups on: 512 trained, the surplus discarded (dapo_ray_trainer.py batch[:traj_bsz])
    assert v["dapo.dynamic_sampling.enabled"] is True
    assert v["dapo.dynamic_sampling.surplus"] == "discard"
    assert (v["dapo.num_prompts_per_step"], v["dapo.dynamic_sampling.batch_multiplier"]) == (
        512,
        3.0,
    )
    assert v["generation.max_response_length"] == 20480
    assert v["policy.max_total_sequence_length"] == 2048 + 20480  # derived
    assert v["validation.num_samples_per_prompt"] == 1
    assert v["dapo.overlong_buffer.enabled"] is True and v["dapo.overlong_buffer.length"] == 4096


def test_verl_without_dynamic_sampling_keeps_it_off():
    v = _values("verl", "verl/run_dapo_wo_ds_qwen2.5_32b.sh", HOME="/home/u")
    assert v["dapo.dynamic_sampling.enabled"] is False


def test_unresolved_home_is_refused_naming_the_variable(tmp_path, capsys):
    out = tmp_path / "r.yaml"
    src = str(DATA / "verl/run_dapo_qwen2.5_32b.sh")
    assert import_main(["--from", "verl", src, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "actor_rollout_ref.model.path" in err and not out.exists()


def test_skyrl_dapo_script():
    v = _values("skyrl", "skyrl/run_dapo_qwen2.5_math_7b_aime.sh", HOME="/home/u")
    # policy_loss_type=dual_clip with clip_ratio_c=10.0; num_warmup_steps counts optimizer steps
    assert v["dapo.loss.clip_ratio_c"] == 10.0
    assert v["policy.scheduler.lr_warmup_steps"] == 160
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["generation.max_response_length"] == 8192
    assert v["policy.max_total_sequence_length"] == 2048 + 8192
    assert v["validation.num_samples_per_prompt"] == 32


def test_rlinf_single_gpu_clip_null_and_placement():
    v = _values("rlinf", "rlinf/qwen2.5-1.5b-single-gpu.yaml")
    # clip_ratio_low/high: null -> ratio_clip_eps 0.2 (megatron_actor_worker.py)
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.2)
    # component_placement actor,rollout,reward: 0 -> one GPU
    assert (v["cluster.num_nodes"], v["cluster.gpus_per_node"]) == (1, 1)
    # `lr: 2e-05` is a number to RLinf's OmegaConf (PyYAML alone reads the string '2e-05').
    assert v["policy.optimizer.lr"] == 2e-05


def test_nemo_rl_missing_parent_is_refused(tmp_path, capsys):
    child = tmp_path / "child.yaml"
    child.write_text("defaults: ../../grpo_math_1B.yaml\ngrpo: {seed: 1}\n")
    assert import_main(["--from", "nemo-rl", str(child), "-o", str(tmp_path / "r.yaml")]) == 2
    assert "grpo_math_1B.yaml" in capsys.readouterr().err


def test_nemo_rl_null_optimizer_replaces_the_parent(tmp_path):
    parent = tmp_path / "p.yaml"
    parent.write_text("policy: {optimizer: {kwargs: {lr: 5.0e-6}}}\n")
    child = tmp_path / "c.yaml"
    child.write_text(
        "defaults: p.yaml\npolicy:\n  optimizer: null\n  megatron_cfg:\n    enabled: true\n"
        "    optimizer: {lr: 1.0e-6}\n"
    )
    flat = read_source(child)
    assert "policy.optimizer.kwargs.lr" not in flat
    v = {s.key: s.value for s in translate("nemo-rl", flat).settings}
    assert v["policy.optimizer.lr"] == 1e-6


@pytest.mark.parametrize("kind", ["dir_input", "dir_output", "nothing"])
def test_bad_inputs_give_one_line_and_exit_2(tmp_path, capsys, kind):
    src = tmp_path / "s.sh"
    src.write_text("python3 -m verl.trainer.main_ppo $'--x'\n")
    out = tmp_path / "r.yaml"
    if kind == "dir_input":
        src = tmp_path
    if kind == "dir_output":
        out = tmp_path / "d"
        out.mkdir()
    argv = ["--from", "verl", str(src), "-o", str(out), "--force"]
    assert import_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_each_key_tier_entry_is_a_key_of_a_peer_file():
    """KEY_TIERS classifies keys read in tests/data/foreign, not guesses; an unknown key
    stays "algorithm" (the safe default)."""
    from dapo_megatron.migrate.dialect_keys import KEY_TIERS, impact
    from dapo_megatron.migrate.dialects import IMPACT_ALGORITHM

    seen: dict[str, set[str]] = {d: set() for d in KEY_TIERS}
    for path in DATA.rglob("*"):
        if path.suffix in (".yaml", ".sh"):
            dialect = path.relative_to(DATA).parts[0]
            seen[dialect] |= set(read_source(path, {"HOME": "/home/u"}))
    for dialect, tiers in KEY_TIERS.items():
        for key in tiers:
            assert any(
                k == key or (key.endswith(".") and k.startswith(key)) for k in seen[dialect]
            ), key
    assert impact("grpo.some_new_knob", "nemo-rl") == IMPACT_ALGORITHM


def test_nemo_rl_megatron_recipe_values():
    """grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml over grpo_math_1B.yaml (its defaults:),
    values read by hand: megatron_cfg.enabled is true, so Megatron's optimizer and layout
    are live and the dtensor optimizer's lr (3e-7) is not."""
    from dapo_megatron.migrate.foreign_source import resolve_interpolations

    name = "nemo-rl/recipes/llm/grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml"
    flat = read_source(DATA / name, {})
    resolve_interpolations(flat)  # as the command does: ${grpo.use_leave_one_out_baseline}
    result = translate("nemo-rl", flat)
    v = {s.key: s.value for s in result.settings}
    assert v["policy.megatron.tensor_model_parallel_size"] == 2  # the recipe
    assert v["policy.megatron.pipeline_model_parallel_size"] == 1  # the base
    assert v["policy.megatron.context_parallel_size"] == 1
    assert v["policy.optimizer.lr"] == 5e-6  # base megatron_cfg.optimizer.lr
    assert v["policy.precision"] == "bf16"  # base policy.precision "bfloat16"
    assert v["generation.engine.tensor_parallel_size"] == 4
    assert (v["dapo.num_prompts_per_step"], v["dapo.num_generations_per_prompt"]) == (64, 32)
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.2)
    assert v["dapo.dynamic_sampling.enabled"] is False
    assert v["dapo.overlong_filtering"] is False
    # 4095 + 4096 > 4096: NeMo RL's per-prompt cap, response_cap context (test_nemo_keys.py)
    assert (v["policy.max_total_sequence_length"], v["generation.response_cap"]) == (
        4096,
        "context",
    )
    assert v["generation.max_response_length"] == 4096  # max_new_tokens as is
    skipped = {s.key: s for s in result.skipped}
    assert skipped["policy.optimizer.kwargs.lr"].impact == "harmless"  # not live
    # Megatron's warm-up: 50 GRPO steps (the recipe), counted in GRPO steps as NeMo RL steps
    # it (64 x 32 samples / 512 = 4 optimizer steps each, test_nemo_keys.py)
    assert (v["policy.scheduler.lr_warmup_steps"], v["policy.scheduler.unit"]) == (50, "train_step")
    # the leave-one-out estimator of the base (grpo.adv_estimator), each sample divided by
    # the std of its 31 others (advantage_estimator.py GRPOAdvantageEstimator)
    assert (v["dapo.advantage.leave_one_out"], v["dapo.advantage.std_over"]) == (True, "others")


def test_nemo_rl_dapo_recipe_values():
    v = _values("nemo-rl", "nemo-rl/recipes/llm/dapo-qwen2.5-7b.v2.yaml")
    assert v["policy.optimizer.lr"] == 1e-6
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.dynamic_sampling.enabled"] is True
    assert v["dapo.overlong_buffer.enabled"] is True and v["dapo.overlong_buffer.length"] == 2048
    # 2047 + 16384 > 16384: the per-prompt cap (response_cap context), max_new_tokens as is
    assert (v["generation.max_response_length"], v["generation.response_cap"]) == (16384, "context")


def test_verl_dapo_7b_megatron_layout_and_lr():
    v = _values("verl", "verl/test_dapo_7b_math_megatron.sh", HOME="/home/u")
    # train_tp=4, train_pp=2, gen_tp=4 in the script
    assert v["policy.megatron.tensor_model_parallel_size"] == 4
    assert v["policy.megatron.pipeline_model_parallel_size"] == 2
    assert v["generation.engine.tensor_parallel_size"] == 4
    # TP 4: sequence parallel on, verl's McoreEngineConfig default (workers/config/engine.py)
    assert v["policy.megatron.sequence_parallel"] is True
    # NNODES=4, 16 GPUs each; ppo_micro_batch_size_per_gpu=2, log_prob...=4 (no dynamic bsz)
    assert (v["cluster.num_nodes"], v["cluster.gpus_per_node"]) == (4, 16)
    assert (v["policy.train_micro_batch_size"], v["policy.logprob_micro_batch_size"]) == (2, 4)
    # lr_warmup_steps=10 trainer steps, stepped per trainer step here too (test_verl_keys.py)
    assert v["policy.optimizer.lr"] == 1e-6 and v["policy.scheduler.lr_warmup_steps"] == 10
    assert v["generation.max_response_length"] == 8192
    # dapo-math-17k.parquet / aime-2024.parquet of prepare_dapo_data.sh: our hub datasets
    assert v["data.train_path"] == "hf://BytedTsinghua-SIA/DAPO-Math-17k"
    assert v["data.val_path"] == "hf://BytedTsinghua-SIA/AIME-2024"
    assert v["data.format"] == "dapo_math"


def _foreign_files() -> list[str]:
    return sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.suffix in (".yaml", ".sh"))


@pytest.mark.parametrize("name", _foreign_files())
def test_every_peer_file_validates_or_is_refused_by_name(tmp_path, capsys, name):
    """The done-when rule on each real file: exit 0 and the recipe loads and was planned;
    exit 1, written and the plan's line says it does not fit; or exit 2 with nothing
    written, naming on stderr each key that blocks and what it needs."""
    from dapo_megatron.config.loader import load_config

    dialect = name.split("/", 1)[0]
    out = tmp_path / "r.yaml"
    argv = ["--from", dialect, str(DATA / name), "-o", str(out), "--shell-var", "HOME=/home/u"]
    rc = import_main(argv)
    captured = capsys.readouterr()
    if rc in (0, 1):
        load_config(out)
        assert "\ndapo-plan: " in "\n" + captured.out
        assert rc == 0 or "was written but does not fit" in captured.err
        return
    err = captured.err
    if out.exists():  # written, then refused by the loader: the reason names what to change
        assert rc == 2 and "was written but does not validate yet" in err, err
        return
    assert rc == 2, err
    assert "need what dapo-megatron lacks" in err or "was not carried" in err
    flat = read_source(DATA / name, {"HOME": "/home/u"})
    named = [k for k in flat if k in err]
    assert named, err


def test_nemo_rl_placeholder_model_name_is_refused():
    """grpo-dapomath17k-dsv3-megatron.yaml's model_name is prose ("Follow instructions in
    https://..."), not a hub id: it was written as models/deepseek.md."""
    name = "nemo-rl/recipes/llm/grpo-dapomath17k-dsv3-megatron.yaml"
    result = translate("nemo-rl", read_source(DATA / name, {}))
    v = {s.key: s.value for s in result.settings}
    assert "policy.model_name_or_path" not in v
    skipped = {s.key: s for s in result.skipped}
    # the model is what is learned: a "name" in the key made it "harmless" before; the
    # estimator's name, grpo, is ours, and DAPOMath17K is our hub dataset
    assert skipped["policy.model_name"].impact == "algorithm"
    assert "grpo.adv_estimator.name" not in skipped
    assert v["data.train_path"] == "hf://BytedTsinghua-SIA/DAPO-Math-17k"
    # the rest, read by hand from the recipe over grpo_math_1B.yaml
    assert (
        v["policy.megatron.tensor_model_parallel_size"],
        v["policy.megatron.pipeline_model_parallel_size"],
    ) == (8, 8)
    assert v["policy.megatron.context_parallel_size"] == 4
    assert v["policy.optimizer.lr"] == 5e-7
    assert v["generation.engine.tensor_parallel_size"] == 32
    assert (v["dapo.num_prompts_per_step"], v["dapo.num_generations_per_prompt"]) == (32, 16)
    assert v["policy.max_total_sequence_length"] == 16384
    assert (v["cluster.num_nodes"], v["cluster.gpus_per_node"]) == (32, 8)


def test_nemo_rl_dapo_cp2_recipe_inherits_the_dapo_recipe():
    # dapo-qwen2.5-7b-16n4g-fsdp2cp2.v2.yaml -> dapo-qwen2.5-7b.v2.yaml -> grpo_math_1B.yaml
    v = _values("nemo-rl", "nemo-rl/recipes/llm/dapo-qwen2.5-7b-16n4g-fsdp2cp2.v2.yaml")
    assert v["policy.model_name_or_path"] == "Qwen/Qwen2.5-Math-7B"
    assert v["policy.optimizer.lr"] == 1e-6
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.loss.clip_ratio_c"] == 10
    assert v["dapo.dynamic_sampling.enabled"] is True
    assert v["dapo.dynamic_sampling.max_gen_batches"] == 11  # 10: NeMo RL runs 10 + 1 rounds
    assert v["dapo.overlong_buffer.enabled"] is True and v["dapo.overlong_buffer.length"] == 2048
    # reward_shaping.max_response_length 14336 is the penalty's Lmax, refused: it differs
    # from the engine's cap, max_new_tokens 16384; 2047 + 16384 > 16384: response_cap context
    assert (v["generation.max_response_length"], v["generation.response_cap"]) == (16384, "context")
    assert v["policy.max_total_sequence_length"] == 16384  # a cap of the whole length: legal
    assert v["dapo.dynamic_sampling.surplus"] == "discard"  # NeMo RL slices the surplus off
    assert (v["cluster.num_nodes"], v["cluster.gpus_per_node"]) == (16, 4)
    assert v["generation.engine.tensor_parallel_size"] == 2


def test_nemo_rl_grpo_recipes():
    v = _values("nemo-rl", "nemo-rl/recipes/llm/grpo-deepscaler-1.5b-8K.yaml")
    assert v["policy.optimizer.lr"] == 2e-6
    assert (v["dapo.num_prompts_per_step"], v["dapo.num_generations_per_prompt"]) == (128, 8)
    assert v["policy.train_global_batch_size"] == 64
    assert v["dapo.loss.clip_ratio_c"] is None and v["dapo.dynamic_sampling.enabled"] is False
    assert v["policy.max_total_sequence_length"] == 8192
    v = _values("nemo-rl", "nemo-rl/recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron.yaml")
    assert v["policy.optimizer.lr"] == 5e-6  # megatron_cfg.optimizer (megatron_cfg.enabled)
    assert v["policy.megatron.tensor_model_parallel_size"] == 1
    assert v["dapo.loss.kl_coef"] == 0.01
    assert (v["dapo.num_prompts_per_step"], v["dapo.num_generations_per_prompt"]) == (32, 16)
    # 511 + 512 > 512: the per-prompt cap (total 512), response cap max_new_tokens 512
    assert (v["generation.max_response_length"], v["generation.response_cap"]) == (512, "context")


@pytest.mark.parametrize(
    "name, steps, dyn, agg",
    [
        ("verl/run_dapo_early_qwen2.5_32b.sh", 3499, False, "seq-mean-token-mean"),
        ("verl/test_dapo_7b_math.sh", 200, False, "token-mean"),  # 200 x 512 <= 10 epochs
        ("verl/test_dapo_qwen3_30b_math.sh", 300, False, "token-mean"),
        ("verl/run_dapo_qwen2.5_32b_rollout_corr.sh", None, True, "token-mean"),  # refused
    ],
)
def test_verl_recipe_dapo_scripts(name, steps, dyn, agg):
    v = _values("verl", name, HOME="/home/u")
    # lr_warmup_steps=10 trainer steps, stepped per trainer step here too (test_verl_keys.py)
    assert v["policy.optimizer.lr"] == 1e-6 and v["policy.scheduler.lr_warmup_steps"] == 10
    assert v["dapo.num_prompts_per_step"] == 512  # gen_batch_size 512 or filtering on
    assert v["policy.train_global_batch_size"] == 32 * 16
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.loss.clip_ratio_c"] == 10.0
    assert v["dapo.loss.loss_agg_mode"] == agg
    assert v["dapo.dynamic_sampling.enabled"] is dyn
    assert v["dapo.overlong_buffer.enabled"] is True and v["dapo.overlong_buffer.length"] == 4096
    assert v["generation.engine.tensor_parallel_size"] == 4
    assert (v["validation.num_samples_per_prompt"], v["validation.top_p"]) == (1, 0.7)
    assert v["validation.greedy"] is False  # val_kwargs.do_sample=True
    assert v.get("dapo.max_num_steps") == steps  # early: 1 epoch, no steps: 1791700 // 512
    response = 8192 if "7b" in name or "30b" in name else 20480
    assert v["generation.max_response_length"] == response
    assert v["policy.max_total_sequence_length"] == 2048 + response


def test_verl_grpo_megatron_example_defaults():
    """verl's examples/grpo_trainer/run_qwen2-7b_math_megatron.sh: what it omits takes verl's
    defaults (clip 0.2/0.2, dual clip 3.0, no warm-up, greedy validation)."""
    v = _values("verl", "verl/run_qwen2-7b_math_megatron.sh", HOME="/home/u")
    assert v["policy.model_name_or_path"] == "Qwen/Qwen2-7B-Instruct"  # a hub id stays one
    assert (
        v["policy.megatron.tensor_model_parallel_size"],
        v["policy.megatron.pipeline_model_parallel_size"],
    ) == (2, 2)
    assert v["policy.train_global_batch_size"] == 256 * 5
    assert (v["dapo.num_prompts_per_step"], v["dapo.num_generations_per_prompt"]) == (1024, 5)
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.2)
    assert v["dapo.loss.clip_ratio_c"] == 3.0
    assert (v["dapo.loss.kl_coef"], v["dapo.loss.kl_estimator"]) == (0.001, "k3")
    assert v["policy.scheduler.lr_warmup_steps"] == 0
    assert v["validation.greedy"] is True
    assert v["policy.max_total_sequence_length"] == 1024 + 1024


@pytest.mark.parametrize(
    "name, tp, pp, gen_tp, dyn, agg",
    [
        # FSDP scripts: SkyRL's MegatronConfig defaults TP = PP = 1 (the FSDP strategy and
        # token_mean_legacy over micro-batches of 2 / 4 samples are refused)
        ("skyrl/run_dapo_qwen2.5_32b_aime.sh", 1, 1, 4, False, None),
        ("skyrl/run_dapo_qwen3_1.7b_aime.sh", 1, 1, 1, False, None),
        ("skyrl/run_megatron_dapo_qwen3_4b.sh", 4, 2, 2, False, "token-mean"),
        ("skyrl/run_megatron_dapo_qwen3_30b_a3b.sh", 4, 1, 8, False, "token-mean"),
    ],
)
def test_skyrl_dapo_scripts(name, tp, pp, gen_tp, dyn, agg):
    v = _values("skyrl", name, HOME="/home/u")
    # megatron_worker.py: sequence_parallel = TP > 1 under trainer.strategy=megatron
    assert v["policy.megatron.sequence_parallel"] is ("megatron" in name)
    assert (v["policy.optimizer.lr"], v["policy.scheduler.lr_warmup_steps"]) == (1e-6, 160)
    assert v["policy.train_global_batch_size"] == 32 * 16
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.loss.clip_ratio_c"] == 10.0  # policy_loss_type=dual_clip
    assert v["dapo.dynamic_sampling.enabled"] is dyn
    assert v["dapo.overlong_filtering"] is True
    assert v["dapo.overlong_buffer.length"] == 4096
    assert v.get("policy.megatron.tensor_model_parallel_size") == tp
    assert v.get("policy.megatron.pipeline_model_parallel_size") == pp
    assert v["generation.engine.tensor_parallel_size"] == gen_tp
    # token_mean_legacy over micro-batches of more than one sample has no counterpart
    assert v.get("dapo.loss.loss_agg_mode") == agg
    assert (v["validation.num_samples_per_prompt"], v["validation.top_p"]) == (32, 0.7)
    response = 20480 if "32b" in name else 8192
    assert v["policy.max_total_sequence_length"] == 2048 + response


def test_skyrl_gsm8k_dynamic_sampling():
    v = _values("skyrl", "skyrl/run_dapo_gsm8k.sh", HOME="/home/u")
    assert v["dapo.dynamic_sampling.enabled"] is True  # dynamic_sampling.type=filter
    assert v["dapo.dynamic_sampling.max_gen_batches"] == 30
    # trainer_utils.py handle_filter_sampling keeps train_batch_size groups, drops the rest
    assert v["dapo.dynamic_sampling.surplus"] == "discard"
    assert v["policy.train_global_batch_size"] == 256 * 5
    assert v["policy.scheduler.lr_warmup_steps"] == 0  # SkyRL's default num_warmup_steps
    assert v["dapo.overlong_buffer.length"] == 512
    assert v["policy.max_total_sequence_length"] == 512 + 1024


@pytest.mark.parametrize(
    "name, tp, gen_tp, group, clip_grad, nodes",
    [
        ("rlinf/qwen2.5-1.5b-grpo-megatron.yaml", 2, 1, 16, 0.8, 16),
        ("rlinf/qwen2.5-1.5b-grpo-megatron-dynamic.yaml", 2, 1, 16, 0.8, 1),
        ("rlinf/qwen2.5-32b-grpo-megatron.yaml", 8, 4, 32, 1.0, 32),
    ],
)
def test_rlinf_grpo_megatron_configs(name, tp, gen_tp, group, clip_grad, nodes):
    v = _values("rlinf", name)
    # runner.seq_length 28672 is prompt + response; max_new_tokens = 28672 - 1024
    assert (v["policy.max_total_sequence_length"], v["generation.max_response_length"]) == (
        28672,
        28672 - 1024,
    )
    # n_minibatches 4: 512 prompts x group / 4 samples per optimizer step
    assert v["policy.train_global_batch_size"] == 512 * group // 4
    assert v["policy.megatron.tensor_model_parallel_size"] == tp
    assert v["generation.engine.tensor_parallel_size"] == gen_tp
    assert (v["dapo.num_prompts_per_step"], v["dapo.num_generations_per_prompt"]) == (512, group)
    assert (v["policy.optimizer.lr"], v["policy.optimizer.clip_grad"]) == (2e-05, clip_grad)
    # clip_ratio_low/high null -> ratio_clip_eps 0.2; clip_ratio_c null: no dual clip
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.2)
    assert v["dapo.loss.clip_ratio_c"] is None
    assert v["cluster.num_nodes"] == nodes
    # rollout.model_path is a placeholder and max_new_tokens an interpolation: not carried
    assert "policy.model_name_or_path" not in v


# ---------------------------------------------------------------------------------------
# Importing whole configs: the examples (issue 33), to runnable recipes.

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "configs" / "dapo_base.yaml"


def _cli(main: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`dapo-train` (main="train_main") or `dapo-plan` (main="plan_main") in a subprocess."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    code = f"import sys; from dapo_megatron.cli import {main}; sys.exit({main}())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


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
    # false: the KL estimate on the sampled tokens, as here (needs nothing set)
    assert "use_on_policy_kl_approximation" not in printed
    text = out.read_text()
    assert f"defaults: {os.path.relpath(BASE, out.parent)}\n" in text
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
  trainer.max_prompt_length=2048 \
  trainer.placement.policy_num_nodes=4 \
  trainer.placement.policy_num_gpus_per_node=8 \
  trainer.strategy=megatron \
  trainer.policy.megatron_config.tensor_model_parallel_size=4 \
  trainer.micro_train_batch_size_per_gpu=1 \
  trainer.micro_forward_batch_size_per_gpu=1 \
  generator.inference_engine.num_engines=8 \
  generator.inference_engine.tensor_parallel_size=4 \
  generator.inference_engine.gpu_memory_utilization=0.7 \
  trainer.algorithm.use_kl_loss=false \
  environment.env_class=aime \
  data.train_data="['$HOME/data/dapo/dapo-math-17k-cleaned.parquet']" \
  data.val_data="['$HOME/data/dapo/aime-2024-cleaned.parquet']" \
  $@
"""


def test_skyrl_dapo_script_imports(tmp_path, capsys):
    out = _import(tmp_path, "skyrl", "run_dapo.sh", SKYRL_SCRIPT)
    printed = capsys.readouterr().out
    assert "no counterpart here" not in printed
    assert "dapo-plan: TP4 PP1 CP1 DP8 +SP on 4 node(s)" in printed and "memory: fits" in printed
    cfg = load_config(out).config
    assert cfg.policy.model_name_or_path == "Qwen/Qwen2.5-Math-7B"  # a hub id stays one
    assert cfg.data.train_path == "hf://BytedTsinghua-SIA/DAPO-Math-17k"  # by its file name
    assert cfg.dapo.dynamic_sampling.surplus == "discard"
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
    meg = cfg.policy.megatron
    assert (meg.tensor_model_parallel_size, meg.sequence_parallel) == (4, True)


RLINF_DAPO = """\
cluster:
  num_nodes: 4
  component_placement:
    actor,rollout,reward: all
data:
  rollout_batch_size: 512
  max_prompt_length: 1024
runner:
  seq_length: 21504
actor:
  model:
    tensor_model_parallel_size: 4
    sequence_parallel: true
    recompute_granularity: full
    recompute_method: uniform
    recompute_num_layers: 1
rollout:
  rollout_backend: vllm
  tensor_parallel_size: 4
  gpu_memory_utilization: 0.6
  model:
    model_path: Qwen/Qwen2.5-7B
algorithm:
  use_valid_token_scale: true
  n_minibatches: 16
  sampling_params:
    max_new_tokens: 20480
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
    """RLinf's DAPO guide keys (safe_length, max_resample, len_reward_penalty, max_length)
    are read by no RLinf code at a3816b59: listed as not live, and the run has what RLinf's
    reasoning runner does: no dynamic sampling, no length penalty."""
    out = _import(tmp_path, "rlinf", "qwen2.5-7b-dapo.yaml", RLINF_DAPO)
    printed = capsys.readouterr().out
    assert "algorithm.len_reward_penalty = 0.1: not live" in printed
    assert "#   algorithm.len_reward_penalty = 0.1: not live" in out.read_text()
    assert "dapo-plan: TP4 PP1 CP1 DP8 +SP on 4 node(s)" in printed and "memory: fits" in printed
    cfg = load_config(out).config
    d = cfg.dapo
    assert cfg.policy.model_name_or_path == "Qwen/Qwen2.5-7B"  # a hub id stays one
    assert (d.num_generations_per_prompt, d.num_prompts_per_step) == (16, 512)
    assert (d.dynamic_sampling.enabled, d.overlong_buffer.enabled) == (False, False)
    assert (d.loss.kl_coef, d.loss.entropy_coef) == (0.0, 0.0)
    # token-mean with use_valid_token_scale: the mini-batch's token mean, as ours
    assert d.loss.loss_agg_mode == "token-mean"
    assert cfg.policy.train_global_batch_size == 512 * 16 // 16
    assert (cfg.generation.max_response_length, cfg.policy.max_total_sequence_length) == (
        20480,
        21504,
    )


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
        # verl's default layout (TP 1) does not fit our 7B default at 2048 + 8192 tokens
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
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
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dapo-import-config"] == "dapo_megatron.migrate.import_config:main"
    # Installed with the package (scripts/setup.sh reinstalls when pyproject.toml changes).
    assert (Path(sys.executable).parent / "dapo-import-config").is_file()
