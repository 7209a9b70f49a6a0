"""dapo-import-config on real peer configs (tests/data/foreign, README there): each value
carried is checked against the value read by hand from the peer's script and code."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.migrate.foreign_source import read_source
from dapo_megatron.migrate.import_config import main as import_main
from dapo_megatron.migrate.import_config import translate

DATA = Path(__file__).resolve().parents[1] / "data" / "foreign"


def _values(dialect: str, name: str, **env: str) -> dict:
    result = translate(dialect, read_source(DATA / name, env))
    return {s.key: s.value for s in result.settings}


def test_verl_dapo_32b_script():
    v = _values("verl", "verl/run_dapo_qwen2.5_32b.sh", HOME="/home/u")
    # ${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-32B"}, RAY_DATA_HOME=${HOME}/verl
    assert v["policy.model_name_or_path"] == "/home/u/verl/models/Qwen2.5-32B"
    assert v["policy.train_global_batch_size"] == 32 * 16  # mini-batch 32 prompts x n 16
    # lr_warmup_steps=10 trainer steps x 512 // 32 = 16 optimizer steps each
    assert (v["policy.optimizer.lr"], v["policy.scheduler.lr_warmup_steps"]) == (1e-6, 160)
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.loss.clip_ratio_c"] == 10.0
    assert v["dapo.dynamic_sampling.enabled"] is True
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
    from dapo_megatron.migrate.dialects import IMPACT_ALGORITHM, KEY_TIERS, impact

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
    name = "nemo-rl/recipes/llm/grpo-qwen2.5-7b-instruct-4n8g-megatron.yaml"
    result = translate("nemo-rl", read_source(DATA / name, {}))
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
    assert v["generation.max_response_length"] == 4096
    assert v["policy.max_total_sequence_length"] == 4096
    skipped = {s.key: s for s in result.skipped}
    assert skipped["policy.optimizer.kwargs.lr"].impact == "harmless"  # not live
    # Megatron's warm-up changes what is learned: never filed under "layout"
    assert skipped["policy.megatron_cfg.scheduler.lr_warmup_iters"].impact == "algorithm"


def test_nemo_rl_dapo_recipe_values():
    v = _values("nemo-rl", "nemo-rl/recipes/llm/dapo-qwen2.5-7b.v2.yaml")
    assert v["policy.optimizer.lr"] == 1e-6
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.dynamic_sampling.enabled"] is True
    assert v["dapo.overlong_buffer.enabled"] is True and v["dapo.overlong_buffer.length"] == 2048
    assert v["policy.max_total_sequence_length"] == 16384


def test_verl_dapo_7b_megatron_layout_and_lr():
    v = _values("verl", "verl/test_dapo_7b_math_megatron.sh", HOME="/home/u")
    # train_tp=4, train_pp=2, gen_tp=4 in the script
    assert v["policy.megatron.tensor_model_parallel_size"] == 4
    assert v["policy.megatron.pipeline_model_parallel_size"] == 2
    assert v["generation.engine.tensor_parallel_size"] == 4
    # lr_warmup_steps=10 trainer steps x (32 x 16 = 512) // 32 = 16 optimizer steps each
    assert (v["policy.optimizer.lr"], v["policy.scheduler.lr_warmup_steps"]) == (1e-6, 160)
    assert v["generation.max_response_length"] == 8192


def _foreign_files() -> list[str]:
    return sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.suffix in (".yaml", ".sh"))


@pytest.mark.parametrize("name", _foreign_files())
def test_every_peer_file_validates_or_is_refused_by_name(tmp_path, capsys, name):
    """The done-when rule on each real file: exit 0 and the recipe loads, or exit 2 naming
    source keys on stderr with nothing written."""
    from dapo_megatron.config.loader import load_config

    dialect = name.split("/", 1)[0]
    out = tmp_path / "r.yaml"
    argv = ["--from", dialect, str(DATA / name), "-o", str(out), "--shell-var", "HOME=/home/u"]
    rc = import_main(argv)
    err = capsys.readouterr().err
    if rc == 0:
        load_config(out)
        return
    assert rc == 2 and not out.exists(), err
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
    # the model, the advantage estimator and the data sets are what is learned: a "name"
    # in the key made them "harmless" before
    for key in ("policy.model_name", "grpo.adv_estimator.name", "data.train.dataset_name"):
        assert skipped[key].impact == "algorithm", key
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
    assert v["policy.model_name_or_path"] == "models/Qwen2.5-Math-7B"
    assert v["policy.optimizer.lr"] == 1e-6
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.loss.clip_ratio_c"] == 10
    assert v["dapo.dynamic_sampling.enabled"] is True
    assert v["dapo.dynamic_sampling.max_gen_batches"] == 11  # 10: NeMo RL runs 10 + 1 rounds
    assert v["dapo.overlong_buffer.enabled"] is True and v["dapo.overlong_buffer.length"] == 2048
    assert v["generation.max_response_length"] == 14336
    assert v["policy.max_total_sequence_length"] == 16384
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
    assert v["policy.max_total_sequence_length"] == 512


@pytest.mark.parametrize(
    "name, steps, dyn, agg",
    [
        ("verl/run_dapo_early_qwen2.5_32b.sh", None, False, "seq-mean-token-mean"),
        ("verl/test_dapo_7b_math.sh", 200, False, "token-mean"),
        ("verl/test_dapo_qwen3_30b_math.sh", 300, False, "token-mean"),
        ("verl/run_dapo_qwen2.5_32b_rollout_corr.sh", None, True, "token-mean"),
    ],
)
def test_verl_recipe_dapo_scripts(name, steps, dyn, agg):
    v = _values("verl", name, HOME="/home/u")
    # lr_warmup_steps=10 trainer steps x (512 x 16) // (32 x 16) = 16 optimizer steps each
    assert (v["policy.optimizer.lr"], v["policy.scheduler.lr_warmup_steps"]) == (1e-6, 160)
    assert v["policy.train_global_batch_size"] == 32 * 16
    assert (v["dapo.loss.clip_ratio_low"], v["dapo.loss.clip_ratio_high"]) == (0.2, 0.28)
    assert v["dapo.loss.clip_ratio_c"] == 10.0
    assert v["dapo.loss.loss_agg_mode"] == agg
    assert v["dapo.dynamic_sampling.enabled"] is dyn
    assert v["dapo.overlong_buffer.enabled"] is True and v["dapo.overlong_buffer.length"] == 4096
    assert v["generation.engine.tensor_parallel_size"] == 4
    assert (v["validation.num_samples_per_prompt"], v["validation.top_p"]) == (1, 0.7)
    assert v["validation.greedy"] is False  # val_kwargs.do_sample=True
    assert v.get("dapo.max_num_steps") == steps
    response = 8192 if "7b" in name or "30b" in name else 20480
    assert v["generation.max_response_length"] == response
    assert v["policy.max_total_sequence_length"] == 2048 + response


def test_verl_grpo_megatron_example_defaults():
    """verl's examples/grpo_trainer/run_qwen2-7b_math_megatron.sh: what it omits takes verl's
    defaults (clip 0.2/0.2, dual clip 3.0, no warm-up, greedy validation)."""
    v = _values("verl", "verl/run_qwen2-7b_math_megatron.sh", HOME="/home/u")
    assert v["policy.model_name_or_path"] == "models/Qwen2-7B-Instruct"
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
        ("skyrl/run_dapo_qwen2.5_32b_aime.sh", None, None, 4, False, None),
        ("skyrl/run_dapo_qwen3_1.7b_aime.sh", None, None, 1, False, None),
        ("skyrl/run_megatron_dapo_qwen3_4b.sh", 4, 2, 2, False, "token-mean"),
        ("skyrl/run_megatron_dapo_qwen3_30b_a3b.sh", 4, 1, 8, False, "token-mean"),
    ],
)
def test_skyrl_dapo_scripts(name, tp, pp, gen_tp, dyn, agg):
    v = _values("skyrl", name, HOME="/home/u")
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
    # token_mean_legacy (per-micro-batch mean) has no counterpart: not written
    assert v.get("dapo.loss.loss_agg_mode") == agg
    assert (v["validation.num_samples_per_prompt"], v["validation.top_p"]) == (32, 0.7)
    response = 20480 if "32b" in name else 8192
    assert v["policy.max_total_sequence_length"] == 2048 + response


def test_skyrl_gsm8k_dynamic_sampling():
    v = _values("skyrl", "skyrl/run_dapo_gsm8k.sh", HOME="/home/u")
    assert v["dapo.dynamic_sampling.enabled"] is True  # dynamic_sampling.type=filter
    assert v["dapo.dynamic_sampling.max_gen_batches"] == 30
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
