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
            assert any(k == key or (key.endswith(".") and k.startswith(key)) for k in seen[dialect]), key
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
