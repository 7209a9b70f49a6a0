"""Config system: inheritance, overrides, error messages, validation, shipped YAML files."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dapo_megatron.config import ConfigError, load_config, schema
from dapo_megatron.config.loader import all_keys, closest_key
from dapo_megatron.config.model_arch import (
    HF_ARCHITECTURES,
    PRESETS,
    arch_from_hf_config,
    hf_config,
)
from dapo_megatron.config.parallel import ParallelDims

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "configs" / "dapo_base.yaml"
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
SHIPPED = sorted((REPO / "configs").glob("*.yaml")) + sorted((REPO / "recipes").glob("*.yaml"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error_of(path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


# ---------------------------------------------------------------------------------------
# Shipped files


def test_shipped_files_exist():
    assert BASE in SHIPPED and TINY in SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_yaml_loads_and_validates(path):
    loaded = load_config(path)
    assert loaded.plan is not None
    assert loaded.plan.dims.world_size > 0


# Key comments and schema docstrings: tests/unit/test_config_docs.py.


def test_base_defines_every_schema_key_once():
    raw = yaml.safe_load(BASE.read_text())

    def leaves(tree, prefix=""):
        for k, v in tree.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    schema_leaves = {k for k in all_keys() if not any(o.startswith(k + ".") for o in all_keys())}
    assert set(leaves(raw)) == schema_leaves


# ---------------------------------------------------------------------------------------
# Inheritance and overrides


def test_multi_level_defaults_merge_and_track_sources(tmp_path):
    mid = write(
        tmp_path / "a" / "mid.yaml",
        f"""
defaults: {BASE}
dapo:
  loss:
    clip_ratio_high: 0.3
generation:
  stop_token_ids: [1, 2, 3]
""",
    )
    leaf = write(
        tmp_path / "b" / "leaf.yaml",
        """
defaults: ../a/mid.yaml
dapo:
  num_prompts_per_step: 64
generation:
  stop_token_ids: [7]
""",
    )
    loaded = load_config(leaf)
    cfg = loaded.config
    assert cfg.dapo.loss.clip_ratio_high == 0.3  # from mid
    assert cfg.dapo.loss.clip_ratio_low == 0.2  # from base, sibling of an overridden key
    assert cfg.dapo.num_prompts_per_step == 64  # from leaf
    assert cfg.generation.stop_token_ids == [7]  # lists are replaced, not concatenated
    assert loaded.sources["dapo.loss.clip_ratio_high"].endswith("mid.yaml")
    assert loaded.sources["dapo.loss.clip_ratio_low"].endswith("dapo_base.yaml")
    assert loaded.sources["dapo.num_prompts_per_step"].endswith("leaf.yaml")
    assert [Path(f).name for f in loaded.files] == ["dapo_base.yaml", "mid.yaml", "leaf.yaml"]
    assert mid.exists()


def test_overrides_are_yaml_typed():
    loaded = load_config(
        TINY,
        [
            "dapo.loss.clip_ratio_high=0.3",
            "policy.optimizer.lr=2e-3",  # YAML 1.1 would read this as a string
            "generation.stop_token_ids=[5, 6]",
            "policy.tokenizer_name_or_path=null",
            "dapo.dynamic_sampling.batch_multiplier=2",  # int widens to float
            "logger.plots=false",
        ],
    )
    cfg = loaded.config
    assert cfg.dapo.loss.clip_ratio_high == 0.3
    assert cfg.policy.optimizer.lr == 2e-3 and isinstance(cfg.policy.optimizer.lr, float)
    assert cfg.generation.stop_token_ids == [5, 6]
    assert cfg.policy.tokenizer_name_or_path is None
    assert cfg.dapo.dynamic_sampling.batch_multiplier == 2.0
    assert cfg.logger.plots is False
    assert loaded.sources["dapo.loss.clip_ratio_high"] == "command line"


def test_later_override_wins():
    cfg = load_config(TINY, ["dapo.max_num_steps=3", "dapo.max_num_steps=5"]).config
    assert cfg.dapo.max_num_steps == 5


# ---------------------------------------------------------------------------------------
# Errors name the key, the file and the fix


def test_unknown_key_in_file_names_file_and_closest_key(tmp_path):
    recipe = write(
        tmp_path / "r.yaml", f"defaults: {BASE}\ndapo:\n  loss:\n    clip_ratio_hihg: 0.3\n"
    )
    msg = error_of(recipe)
    assert "dapo.loss.clip_ratio_hihg" in msg
    assert str(recipe.name) in msg
    assert "dapo.loss.clip_ratio_high" in msg


def test_unknown_override_names_command_line():
    msg = error_of(TINY, "dapo.dynamic_sampling.max_gen_batchs=3")
    assert "command line" in msg and "dapo.dynamic_sampling.max_gen_batches" in msg


def test_peer_names_map_to_ours():
    assert closest_key("dapo.eps_high") == "dapo.loss.clip_ratio_high"
    assert closest_key("algorithm.filter_groups") == "dapo.dynamic_sampling.enabled"
    assert closest_key("grpo.overlong_buffer_length") == "dapo.overlong_buffer.length"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("dapo.loss.clip_ratio_low=abc", "expected float"),
        ("dapo.num_prompts_per_step=2.5", "expected int"),
        ("dapo.dynamic_sampling.enabled=1", "expected bool"),
        ("dapo.loss.loss_agg_mode=token-sum", "'token-mean'"),
        ("dapo.dynamic_sampling.batch_multiplier=sometimes", "float | 'auto'"),
        ("dapo.loss=3", "expected a section"),
    ],
)
def test_type_errors_name_key_and_type(override, expected):
    key = override.split("=")[0]
    msg = error_of(TINY, override)
    assert key in msg and expected in msg


@pytest.mark.parametrize(
    "override, key, constraint",
    [
        ("dapo.loss.clip_ratio_low=-0.1", "dapo.loss.clip_ratio_low", "must be in [0, 1)"),
        (
            "dapo.dynamic_sampling.batch_multiplier=0.5",
            "dapo.dynamic_sampling.batch_multiplier",
            "must be in [1, inf)",
        ),
        (
            "dapo.overlong_buffer.length=16",
            "dapo.overlong_buffer.length",
            "max_response_length = 16",
        ),
        ("policy.megatron.pipeline_model_parallel_size=4", "policy.megatron", "must divide"),
        ("dapo.loss.clip_ratio_c=0.9", "dapo.loss.clip_ratio_c", "must be in (1, inf)"),
        (
            # 256 is not a multiple of 3 x DP2 (the tiny recipe packs, but the check holds)
            "policy.train_micro_batch_size=3",
            "policy.train_global_batch_size",
            "train_micro_batch_size * data_parallel_size",
        ),
        (
            "policy.megatron.sequence_parallel=true",
            "sequence_parallel",
            "tensor_model_parallel_size > 1",
        ),
        ("policy.megatron.data_parallel_size=4", "data_parallel_size", "gives 2"),
        ("generation.top_p=0", "generation.top_p", "(0, 1]"),
        ("policy.max_total_sequence_length=40", "policy.max_total_sequence_length", "= 48"),
        ("dapo.num_generations_per_prompt=1", "dapo.num_generations_per_prompt", ">= 2 samples"),
    ],
)
def test_invalid_values_name_key_and_constraint(override, key, constraint):
    msg = error_of(TINY, override)
    assert key in msg and constraint in msg


def test_query_groups_not_divisible_by_tp():
    # tiny-qwen2: 4 heads, 2 query groups. TP=4 divides the heads but not the groups.
    msg = error_of(TINY, "cluster.gpus_per_node=4", "policy.megatron.tensor_model_parallel_size=4")
    assert "num_query_groups (key/value heads) = 2" in msg
    assert "num_attention_heads" not in msg


def test_all_violations_reported_together():
    msg = error_of(TINY, "dapo.loss.clip_ratio_low=-1", "generation.temperature=0")
    assert msg.startswith("2 invalid settings")


def test_defaults_cycle_and_missing_parent(tmp_path):
    write(tmp_path / "a.yaml", "defaults: b.yaml\n")
    write(tmp_path / "b.yaml", "defaults: a.yaml\n")
    assert "cycle" in error_of(tmp_path / "a.yaml")
    orphan = write(tmp_path / "c.yaml", "defaults: nowhere.yaml\n")
    msg = error_of(orphan)
    assert "nowhere.yaml not found" in msg and "c.yaml" in msg


def test_missing_key_without_defaults_points_to_base(tmp_path):
    msg = error_of(write(tmp_path / "bare.yaml", "run:\n  name: x\n"))
    assert "missing key" in msg and "dapo_base.yaml" in msg


def test_bad_override_syntax():
    assert "expected key=value" in error_of(TINY, "dapo.loss.clip_ratio_low")
    assert "is a value, not a section" in error_of(TINY, "run.name.first=x")


# ---------------------------------------------------------------------------------------
# Architecture and parallel layout


def test_checkpoint_config_json_wins_over_preset(tmp_path):
    hf = {
        "model_type": "llama",
        "num_hidden_layers": 6,
        "hidden_size": 96,
        "intermediate_size": 256,
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "vocab_size": 100,
        "max_position_embeddings": 128,
    }
    model = tmp_path / "model"
    model.mkdir()

    (model / "config.json").write_text(json.dumps(hf))
    loaded = load_config(TINY, [f"policy.model_name_or_path={model}"])
    assert loaded.plan.arch.num_layers == 6
    assert "config.json" in loaded.plan.arch_source
    # 3 query groups cannot be split over TP=2.
    msg = error_of(
        TINY,
        f"policy.model_name_or_path={model}",
        "cluster.gpus_per_node=2",
        "policy.megatron.tensor_model_parallel_size=2",
    )
    assert "num_query_groups (key/value heads) = 3" in msg


def test_unknown_model_type_is_an_error():
    with pytest.raises(
        ConfigError,
        match="model_type 'gpt2' is not supported; supported: qwen2, llama, qwen3, qwen3_moe",
    ):
        arch_from_hf_config({"model_type": "gpt2"}, "x/config.json")


@pytest.mark.parametrize(
    "preset, params",
    [
        # Published parameter counts of the Hugging Face checkpoints.
        ("qwen2.5-7b", 7_615_616_512),
        ("qwen2.5-0.5b", 494_032_768),
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.1-70b", 70_553_706_496),
        ("qwen3-0.6b", 596_049_920),
        ("qwen3-8b", 8_190_735_360),
        ("qwen3-14b", 14_768_307_200),
        ("qwen3-32b", 32_762_123_264),
        ("qwen3-30b-a3b", 30_532_122_624),
    ],
)
def test_preset_parameter_counts(preset, params):
    assert PRESETS[preset].num_parameters() == params


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe"])
def test_tiny_presets_match_the_hf_model_and_read_back(preset):
    # The HF model built from hf_config(arch) is the independent reference: its parameter
    # count, and its config.json read back to the same arch.
    transformers = pytest.importorskip("transformers")
    arch = PRESETS[preset]
    config = hf_config(arch)
    model = getattr(transformers, HF_ARCHITECTURES[arch.family])(config)
    assert sum(p.numel() for p in model.parameters()) == arch.num_parameters()
    assert arch_from_hf_config(json.loads(config.to_json_string()), preset) == arch


def test_qwen3_configs_as_released_read_correctly():
    # The fields of the released Qwen3-30B-A3B config.json (num_experts, not transformers
    # 5's num_local_experts) and a Qwen3 with head_dim != hidden / heads (Qwen3-0.6B).
    moe = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    }
    assert arch_from_hf_config(moe, "c.json") == PRESETS["qwen3-30b-a3b"]
    dense = {k: v for k, v in moe.items() if "expert" not in k and "moe" not in k}
    dense.update(
        model_type="qwen3",
        num_hidden_layers=28,
        hidden_size=1024,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    )
    arch = arch_from_hf_config(dense, "c.json")
    assert arch == PRESETS["qwen3-0.6b"]
    assert (arch.head_dim, arch.query_width, arch.hidden_size) == (128, 2048, 1024)
    with pytest.raises(ConfigError, match="mlp_only_layers"):
        arch_from_hf_config({**moe, "mlp_only_layers": [0]}, "c.json")
    with pytest.raises(ConfigError, match="use_sliding_window"):
        arch_from_hf_config({**dense, "use_sliding_window": True}, "c.json")


def test_tiny_parameter_count_by_hand():
    # tiny-qwen2: h=64, 4 heads of 16, 2 kv groups -> kv width 32, ffn 128, vocab 64, tied.
    # attention: q 64*64 + k,v 2*64*32 + o 64*64 = 4096 + 4096 + 4096 = 12288; biases 64+64 = 128
    # mlp: 3*64*128 = 24576; norms 2*64 = 128 -> layer 37120; 2 layers = 74240
    # embedding 64*64 = 4096 (tied), final norm 64 -> 78400
    assert PRESETS["tiny-qwen2"].num_parameters() == 78400


def test_expert_parallel_size_is_checked_against_the_layout_and_the_model():
    dims = ParallelDims.build(world_size=8, tp=2, pp=1, cp=1, dp=None, sequence_parallel=True, ep=4)
    assert (dims.dp, dims.ep) == (4, 4)
    with pytest.raises(ConfigError, match="expert_model_parallel_size = 3 must divide"):
        ParallelDims.build(world_size=8, tp=2, pp=1, cp=1, dp=None, sequence_parallel=False, ep=3)
    # A dense model refuses EP > 1; a MoE needs EP to divide its experts (tiny: 4).
    dense = error_of(
        TINY, "cluster.gpus_per_node=2", "policy.megatron.expert_model_parallel_size=2"
    )
    assert "needs a mixture-of-experts model" in dense
    moe = error_of(
        TINY,
        "policy.model_arch=tiny-qwen3-moe",
        "cluster.gpus_per_node=8",
        "policy.megatron.expert_model_parallel_size=8",
    )
    assert "must divide num_experts = 4" in moe


def test_parallel_dims_derive_dp_and_reject_bad_layouts():
    dims = ParallelDims.build(world_size=32, tp=4, pp=2, cp=2, dp=None, sequence_parallel=True)
    assert (dims.dp, dims.world_size, dims.model_parallel_size) == (2, 32, 16)
    with pytest.raises(ConfigError, match="must divide the policy world size 12"):
        ParallelDims.build(world_size=12, tp=8, pp=1, cp=1, dp=None, sequence_parallel=False)
    with pytest.raises(ConfigError, match="context_parallel_size = 0"):
        ParallelDims.build(world_size=8, tp=1, pp=1, cp=0, dp=None, sequence_parallel=False)


def test_split_mode_world_size():
    loaded = load_config(
        TINY,
        ["cluster.gpus_per_node=4", "cluster.colocated=false", "cluster.generation_num_devices=2"],
    )
    assert loaded.plan.dims.dp == 2
    msg = error_of(TINY, "cluster.colocated=false", "cluster.generation_num_devices=0")
    assert "cluster.generation_num_devices" in msg


# ---------------------------------------------------------------------------------------
# The command line


def run_cli(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_cli_dry_run_validates_tiny_recipe():
    out = run_cli("--config", str(TINY), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert (
        "TP1 PP1 CP1 DP2" in out.stdout
        and "dry run: configuration, data, model, tokenizer and devices are valid" in out.stdout
    )


def test_cli_print_config_is_the_resolved_config():
    out = run_cli("--config", str(TINY), "dapo.loss.clip_ratio_high=0.31", "--print-config")
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)
    expected = dataclasses.asdict(load_config(TINY, ["dapo.loss.clip_ratio_high=0.31"]).config)
    expected["policy"]["megatron"]["data_parallel_size"] = 2  # derived: world 2 / (1*1*1)
    assert printed == expected
    assert printed["dapo"]["loss"]["clip_ratio_high"] == 0.31


def test_cli_user_error_has_no_traceback():
    out = run_cli("--config", str(TINY), "dapo.loss.clip_ratio_low=-1")
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    out = run_cli("--config", "does/not/exist.yaml")
    assert out.returncode == 2 and "does/not/exist.yaml not found" in out.stderr


def test_loss_agg_modes_match_the_algorithm():
    import typing

    from dapo_megatron.algorithms.loss import LOSS_AGG_MODES

    assert typing.get_args(schema.LossAggMode) == LOSS_AGG_MODES


def test_seq_mean_token_mean_refused_under_context_parallelism():
    msg = error_of(
        TINY,
        "policy.megatron.context_parallel_size=2",
        "dapo.loss.loss_agg_mode=seq-mean-token-mean",
        "policy.train_micro_batch_size=32",
    )
    assert "dapo.loss.loss_agg_mode" in msg and "context_parallel_size > 1" in msg


def test_arithmetic_validation_split_must_fit_the_task():
    # Two single-digit operands with "+" give 10 * 10 = 100 distinct problems.
    msg = error_of(TINY, "data.arithmetic.difficulty=2", "data.arithmetic.num_val=100")
    assert "data.arithmetic.num_val" in msg and "only 100 distinct problems" in msg


def test_the_run_directory_keeps_a_resolved_config_that_loads_back(tmp_path):

    from dapo_megatron.cli import RUN_CONFIG_FILE, _write_resolved_config

    loaded = load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", ["dapo.loss.clip_ratio_high=0.3"])
    _write_resolved_config(loaded, tmp_path / "run")
    again = load_config(tmp_path / "run" / RUN_CONFIG_FILE).config
    # Identical, except that the derived data-parallel size is now written out.
    expected = dataclasses.replace(
        loaded.config,
        policy=dataclasses.replace(
            loaded.config.policy,
            megatron=dataclasses.replace(loaded.config.policy.megatron, data_parallel_size=2),
        ),
    )
    assert again == expected and again.dapo.loss.clip_ratio_high == 0.3
    assert not list((tmp_path / "run").glob("*.tmp"))


@pytest.mark.parametrize(
    "key", ["policy.megatron.pipeline_model_parallel_size", "policy.megatron.context_parallel_size"]
)
def test_colocated_megatron_generation_refuses_pipeline_and_context_parallelism(key):
    # The policy ranks would generate on a layout Megatron generation cannot run: refused
    # before any worker starts, naming the key and the ways out.
    msg = error_of(TINY, f"{key}=2")
    assert f"{key} = 2" in msg and "cluster.colocated=false" in msg
    # Split engines have a layout of their own: the same policy layout is accepted.
    plan = load_config(
        TINY,
        [
            f"{key}=2",
            "cluster.gpus_per_node=3",
            "cluster.colocated=false",
            "cluster.generation_num_devices=1",
            "policy.train_micro_batch_size=32",
        ],
    )
    assert plan.config.cluster.colocated is False


def test_broadcast_refit_to_colocated_gpu_engines_is_refused(tmp_path):
    # NCCL cannot hold two ranks of one communicator (policy rank 0 and the engine worker
    # beside it) on one GPU: refused before any worker starts, naming both keys, the file
    # and the ways out.
    recipe = tmp_path / "colocated-broadcast.yaml"
    recipe.write_text(
        f"defaults: {TINY}\n"
        "generation:\n  backend: vllm\n  refit_transport: broadcast\n"
        "cluster:\n  device: cuda\n"
    )
    msg = error_of(recipe, "policy.model_name_or_path=/nonexistent/model")
    assert f"generation.refit_transport = 'broadcast' (set in {recipe})" in msg
    assert "cluster.colocated = true" in msg and "NCCL" in msg
    assert "generation.refit_transport=ipc" in msg and "cluster.colocated=false" in msg
    # auto resolves to ipc on GPU; device auto is refused too (only GPUs run it).
    ok = load_config(recipe, ["policy.model_name_or_path=/x", "generation.refit_transport=auto"])
    assert ok.require_plan().refit_transport == "ipc"
    assert "NCCL" in error_of(recipe, "policy.model_name_or_path=/x", "cluster.device=auto")


def test_broadcast_refit_stays_allowed_where_gloo_carries_it():
    # Split engines on CPU (the tiny vLLM recipe) and colocated Megatron generation (no
    # engine workers: nothing is broadcast) keep the broadcast.
    cpu_vllm = load_config(REPO / "recipes" / "dapo-tiny-cpu-vllm.yaml")
    assert cpu_vllm.require_plan().refit_transport == "broadcast"
    megatron = load_config(TINY, ["cluster.device=cuda", "generation.refit_transport=broadcast"])
    assert megatron.config.cluster.colocated and megatron.config.generation.backend == "megatron"
