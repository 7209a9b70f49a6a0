"""The config loader (config/loader.py): inheritance, overrides, error messages that name
the key, the file and the fix, and the shipped YAML files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from shipped_recipes import shipped_recipes

from dapo_megatron.config import ConfigError, load_config
from dapo_megatron.config.loader import all_keys, closest_key

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "configs" / "dapo_base.yaml"
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
SHIPPED = sorted((REPO / "configs").glob("*.yaml")) + shipped_recipes()


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


# Key comments and schema docstrings: tests/unit/config/test_yaml_comments.py.


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
