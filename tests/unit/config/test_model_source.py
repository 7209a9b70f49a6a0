"""Which model dapo-plan and dapo-train plan: the one policy.model_name_or_path names.

config.json of the model wins (local directory, Hugging Face cache, hub); else
policy.model_arch when it was chosen for this model; else the preset the name names; else an
error naming policy.model_arch (config/model_source.py, model_arch.resolve_arch). No test
touches the network: the hub download is replaced, the HF cache is a directory of tmp_path
laid out as huggingface_hub lays it out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dapo_megatron.cli import plan_main
from dapo_megatron.config import ConfigError, load_config, model_source
from dapo_megatron.config.model_arch import PRESETS, ModelArch, hf_config_fields
from dapo_megatron.config.model_source import (
    cached_config_json,
    hf_hub_cache_dir,
    preset_applies,
    preset_for_name,
)
from dapo_megatron.migrate import dialects

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "configs" / "dapo_base.yaml"
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"
QWEN3_8B_RECIPE = REPO / "recipes" / "dapo-qwen3-8b-1n8g-tp4pp1cp1.yaml"
SHA = "0123456789abcdef0123456789abcdef01234567"

QWEN3_SIZES = {
    "Qwen3-0.6B": "qwen3-0.6b",
    "Qwen3-1.7B": "qwen3-1.7b",
    "Qwen3-4B": "qwen3-4b",
    "Qwen3-8B": "qwen3-8b",
    "Qwen3-14B": "qwen3-14b",
    "Qwen3-32B": "qwen3-32b",
    "Qwen3-30B-A3B": "qwen3-30b-a3b",
}
SUFFIXES = ("", "-Base", "-Instruct")

# A Qwen3 shape no preset has (20 layers of width 1536): only a config.json can give it.
ODD_QWEN3 = {
    "model_type": "qwen3",
    "num_hidden_layers": 20,
    "hidden_size": 1536,
    "intermediate_size": 4608,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}


class HubRecorder:
    """Stands in for model_source.fetch_hub_config: records the repos asked for and
    answers from ``files`` (repo id -> a config.json path)."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.files: dict[str, Path] = {}

    def __call__(self, repo_id: str) -> Path | None:
        self.asked.append(repo_id)
        return self.files.get(repo_id)


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubRecorder]:
    """An empty HF cache in tmp_path, the hub online but replaced by a recorder."""
    recorder = HubRecorder()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(model_source, "fetch_hub_config", recorder)
    yield recorder


def plan_output(capsys: pytest.CaptureFixture[str], config: Path, *overrides: str) -> str:
    """dapo-plan's stdout; its exit status (the memory verdict) does not matter here."""
    code = plan_main(["--config", str(config), *overrides])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    return out


def model_line(out: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("model ")]
    return line


def assert_plans(line: str, arch: ModelArch) -> None:
    """The model line describes ``arch``: family, layers, width, heads, parameters."""
    params = arch.num_parameters()
    assert f"{arch.family}, {arch.num_layers} layers, hidden {arch.hidden_size}," in line
    assert f"heads {arch.num_attention_heads}/{arch.num_query_groups} kv" in line
    # As summary._human_count prints it: two decimals of billions or millions.
    scale, unit = (1e9, "B") if params >= 1e9 else (1e6, "M")
    assert f"{params / scale:.2f}{unit} params" in line


def write_cache(cache: Path, repo_id: str, hf: dict[str, object]) -> Path:
    """config.json of ``repo_id`` in a huggingface_hub cache layout."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SHA)
    snapshot = repo / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(hf))
    return snapshot / "config.json"


def model_dir(path: Path, hf: dict[str, object]) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(hf))
    return path


def error_of(config: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(config, list(overrides))
    return str(e.value)


# ----------------------------------------------------------------------------- by name


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("size", list(QWEN3_SIZES))
def test_dapo_plan_plans_each_qwen3_by_its_name(
    size: str, suffix: str, hub: HubRecorder, capsys: pytest.CaptureFixture[str]
) -> None:
    # The 8B recipe names qwen3-8b for its own model; another model on the command line
    # gets the architecture its name says, as a local path and as a hub id.
    preset = QWEN3_SIZES[size]
    for name in (f"models/{size}{suffix}", f"Qwen/{size}{suffix}"):
        out = plan_output(capsys, QWEN3_8B_RECIPE, f"policy.model_name_or_path={name}")
        line = model_line(out)
        assert_plans(line, PRESETS[preset])
        assert f"(preset {preset}, from the name {size}{suffix})" in line
    # Not in the cache, so the hub was asked (and answered nothing) about the hub id; never
    # about models/..., a local folder still to be filled (README: models/<HF name>).
    assert hub.asked == [f"Qwen/{size}{suffix}"]


def test_names_that_keep_the_architecture() -> None:
    cases = {
        "Qwen/Qwen3-8B-Base": "qwen3-8b",
        "qwen3-8b-instruct": "qwen3-8b",
        "models/Qwen3-30B-A3B-Base/": "qwen3-30b-a3b",
        "/data/ckpts/Qwen2.5-Math-7B": "qwen2.5-math-7b",
        "Qwen/Qwen2.5-7B-Chat": "qwen2.5-7b",
        "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
        "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
        # Release suffixes are not stripped: Qwen3-*-2507 has 262144 positions and RoPE
        # base 5e6, where qwen3-4b has 40960 and 1e6.
        "Qwen/Qwen3-4B-Instruct-2507": None,
        "qwen3-8b-instruct-2507": None,
        "Qwen3-8B-FP8": None,
        "runs/dapo-tiny-cpu/model": None,
    }
    got = {name: preset_for_name(name, PRESETS) for name in cases}
    assert got == cases


def test_the_importer_uses_the_same_matcher() -> None:
    for base in ("Qwen3-8B-Base", "Qwen3-30B-A3B-Base", "Qwen3-4B", "Qwen3-1.7B-Instruct"):
        assert dialects._preset(base) == preset_for_name(base, PRESETS) is not None


# ----------------------------------------------------------------------------- config.json


def test_the_hf_cache_wins_over_the_name(
    hub: HubRecorder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_json = write_cache(tmp_path / "hf-cache", "Qwen/Qwen3-8B-Base", ODD_QWEN3)
    out = plan_output(capsys, QWEN3_8B_RECIPE, "policy.model_name_or_path=Qwen/Qwen3-8B-Base")
    line = model_line(out)
    odd = load_config(
        QWEN3_8B_RECIPE, ["policy.model_name_or_path=Qwen/Qwen3-8B-Base"]
    ).require_plan()
    assert odd.arch is not None and (odd.arch.num_layers, odd.arch.hidden_size) == (20, 1536)
    assert_plans(line, odd.arch)
    assert f"({config_json})" in line
    assert hub.asked == []  # found in the cache: the hub is not asked


def test_hf_home_and_the_default_cache(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert hf_hub_cache_dir({}, home) == home / ".cache" / "huggingface" / "hub"
    assert hf_hub_cache_dir({"HF_HOME": "/hf"}, home) == Path("/hf/hub")
    assert hf_hub_cache_dir({"HF_HOME": "/hf", "HF_HUB_CACHE": "/c"}, home) == Path("/c")
    assert hf_hub_cache_dir({"XDG_CACHE_HOME": "/x"}, home) == Path("/x/huggingface/hub")
    cache = tmp_path / "cache"
    config_json = write_cache(cache, "Qwen/Qwen3-4B", ODD_QWEN3)
    assert cached_config_json("Qwen/Qwen3-4B", cache) == config_json
    assert cached_config_json("Qwen/Qwen3-8B", cache) is None
    # A snapshot that lacks config.json is not a hit.
    config_json.unlink()
    assert cached_config_json("Qwen/Qwen3-4B", cache) is None


def test_a_downloaded_config_json_wins(hub: HubRecorder, tmp_path: Path) -> None:
    hub.files["Qwen/Qwen3-8B"] = model_dir(tmp_path / "dl", ODD_QWEN3) / "config.json"
    plan = load_config(BASE, ["policy.model_name_or_path=Qwen/Qwen3-8B"]).require_plan()
    assert plan.arch is not None and plan.arch.num_layers == 20
    assert "downloaded from the hub" in plan.arch_source
    assert hub.asked == ["Qwen/Qwen3-8B"]


def test_the_hub_is_only_asked_when_online(
    hub: HubRecorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(offline, "1")
        plan = load_config(BASE, ["policy.model_name_or_path=Qwen/Qwen3-14B"]).require_plan()
        assert plan.arch == PRESETS["qwen3-14b"]  # quietly by name
        monkeypatch.delenv(offline)
    assert hub.asked == []
    # A relative dir/Name whose dir is here is a local path still to be filled.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    load_config(BASE, ["policy.model_name_or_path=models/Qwen3-14B"])
    # Absolute and deeper paths are never hub ids.
    load_config(BASE, [f"policy.model_name_or_path={tmp_path}/a/Qwen3-14B"])
    assert hub.asked == []
    load_config(BASE, ["policy.model_name_or_path=Qwen/Qwen3-14B"])
    assert hub.asked == ["Qwen/Qwen3-14B"]


def test_a_config_json_that_disagrees_with_an_explicit_preset_is_an_error(
    hub: HubRecorder, tmp_path: Path
) -> None:
    model = model_dir(tmp_path / "Qwen3-8B", ODD_QWEN3)
    msg = error_of(BASE, f"policy.model_name_or_path={model}", "policy.model_arch=qwen3-8b")
    assert msg.startswith("policy.model_arch = 'qwen3-8b' disagrees with ")
    assert str(model / "config.json") in msg
    assert "qwen3, 36 layers, hidden 4096" in msg  # the preset
    assert "qwen3, 20 layers, hidden 1536" in msg  # the checkpoint
    # The same in a recipe that sets both together.
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"defaults: {BASE}\npolicy:\n  model_name_or_path: {model}\n  model_arch: qwen3-8b\n"
    )
    assert "disagrees with" in error_of(recipe)


def test_a_context_length_of_its_own_is_the_same_architecture(
    hub: HubRecorder, tmp_path: Path
) -> None:
    # Qwen3-8B-Base ships 32768 positions, the qwen3-8b preset (Qwen3-8B) 40960: the weights
    # are the same shapes, the checkpoint's own value is planned.
    hf = dict(hf_config_fields(PRESETS["qwen3-8b"]), model_type="qwen3")
    hf["max_position_embeddings"] = 32768
    model = model_dir(tmp_path / "Qwen3-8B-Base", hf)
    plan = load_config(
        BASE, [f"policy.model_name_or_path={model}", "policy.model_arch=qwen3-8b"]
    ).require_plan()
    assert plan.arch is not None and plan.arch.max_position_embeddings == 32768
    assert plan.arch.num_parameters() == PRESETS["qwen3-8b"].num_parameters()


# ----------------------------------------------------------------------------- model_arch


def test_an_inherited_model_arch_never_describes_another_model(
    hub: HubRecorder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = tmp_path / "parent.yaml"
    parent.write_text(
        f"defaults: {BASE}\npolicy:\n  model_name_or_path: models/Qwen2.5-Math-7B\n"
        "  model_arch: qwen2.5-math-7b\n"
    )
    child = tmp_path / "child.yaml"
    child.write_text(
        "defaults: parent.yaml\npolicy:\n  model_name_or_path: models/Qwen3-30B-A3B-Base\n"
    )
    line = model_line(plan_output(capsys, child))
    assert_plans(line, PRESETS["qwen3-30b-a3b"])
    assert "qwen2" not in line
    # The parent's own model keeps the parent's preset.
    assert_plans(model_line(plan_output(capsys, parent)), PRESETS["qwen2.5-math-7b"])
    # A name that names no preset: an error, not the parent's preset.
    msg = error_of(child, "policy.model_name_or_path=/data/step-100")
    assert msg.startswith("policy.model_arch: the architecture of policy.model_name_or_path")
    assert "'/data/step-100'" in msg and "policy.model_arch = 'qwen2.5-math-7b' was set in" in msg
    assert str(parent) in msg
    # Named again beside the model (here: the command line after it), the preset applies.
    plan = load_config(
        child, ["policy.model_name_or_path=/data/step-100", "policy.model_arch=qwen3-8b"]
    ).require_plan()
    assert plan.arch == PRESETS["qwen3-8b"] and plan.arch_source == "preset qwen3-8b"
    # A child that sets the preset for the parent's model: it applies (and must agree).
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text("defaults: parent.yaml\npolicy:\n  model_arch: qwen2.5-7b\n")
    assert "disagrees with the name" in error_of(fixed)


def test_the_base_config_plans_the_model_its_name_says(
    hub: HubRecorder, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_plans(model_line(plan_output(capsys, BASE)), PRESETS["qwen2.5-math-7b"])
    line = model_line(
        plan_output(capsys, BASE, "policy.model_name_or_path=models/Qwen3-30B-A3B-Base")
    )
    assert_plans(line, PRESETS["qwen3-30b-a3b"])


def test_an_explicit_preset_that_disagrees_with_the_name_is_an_error(hub: HubRecorder) -> None:
    msg = error_of(
        BASE, "policy.model_name_or_path=models/Qwen3-8B-Base", "policy.model_arch=qwen3-4b"
    )
    assert msg.startswith("policy.model_arch = 'qwen3-4b' disagrees with the name of ")
    assert "preset 'qwen3-8b'" in msg and "36 layers, hidden 4096" in msg
    assert "36 layers, hidden 2560" in msg


def test_an_unknown_name_is_an_error_naming_model_arch(hub: HubRecorder) -> None:
    msg = error_of(BASE, "policy.model_name_or_path=models/Mistral-7B-v0.3")
    assert msg.startswith("policy.model_arch: the architecture of policy.model_name_or_path")
    assert "'Mistral-7B-v0.3' names no preset" in msg
    assert "qwen3-30b-a3b" in msg and "tiny-qwen2" in msg  # the presets
    # -2507: not guessed; the hint says why. Named explicitly, the preset is used.
    msg = error_of(BASE, "policy.model_name_or_path=models/Qwen3-4B-Instruct-2507")
    assert "release suffix" in msg
    plan = load_config(
        BASE,
        ["policy.model_name_or_path=models/Qwen3-4B-Instruct-2507", "policy.model_arch=qwen3-4b"],
    ).require_plan()
    assert plan.arch == PRESETS["qwen3-4b"]
    assert "unknown preset 'qwen3-9b'" in error_of(BASE, "policy.model_arch=qwen3-9b")


def test_a_created_model_is_its_preset(hub: HubRecorder, tmp_path: Path) -> None:
    # The tiny recipe creates its model from its preset: another path on the command line
    # still gets it (nothing there yet, init_model_if_missing).
    plan = load_config(TINY, [f"policy.model_name_or_path={tmp_path / 'model'}"]).require_plan()
    assert plan.arch == PRESETS["tiny-qwen2"] and plan.arch_source == "preset tiny-qwen2"
    msg = error_of(
        TINY,
        f"policy.model_name_or_path={tmp_path / 'model'}",
        "policy.init_model_if_missing=false",
    )
    assert "policy.model_arch = 'tiny-qwen2' was set in" in msg


def test_preset_applies_by_layer() -> None:
    order = ["base.yaml", "recipe.yaml", "command line"]

    def applies(arch_src: str, model_src: str, created: bool = False) -> bool:
        sources = {"policy.model_arch": arch_src, "policy.model_name_or_path": model_src}
        return preset_applies(sources, order, created_from_preset=created)

    assert applies("recipe.yaml", "recipe.yaml")
    assert applies("command line", "recipe.yaml")
    assert not applies("base.yaml", "recipe.yaml")
    assert not applies("recipe.yaml", "command line")
    assert applies("recipe.yaml", "command line", created=True)
    assert applies("elsewhere", "recipe.yaml")  # unknown layers: as written
