"""Tests of dapo_megatron.planning.preflight: each builds a real broken input (file, model directory,
tokenizer, device request) and checks the one-line message naming key, path and line; the
real loaders (data/datasets.py, data/tokenizer.py) raise the same messages."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dapo_megatron.cli import train_main
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.data.datasets import MAX_CHECK_ERRORS, build_datasets, check_prompt_file
from dapo_megatron.data.file_rows import max_row_bytes
from dapo_megatron.data.tiny_model import create_tiny_model
from dapo_megatron.data.tokenizer import VOCABULARY_FILES, load_policy_tokenizer
from dapo_megatron.planning import preflight as preflight_module
from dapo_megatron.planning.preflight import preflight

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"
GOOD_ROW = b'{"question": "1+1", "answer": "#### 2"}\n'
LIMIT = max_row_bytes(32)  # the tiny recipe's data.max_prompt_length
TOKENIZER_FIX = (
    "copy the model's tokenizer files there or set policy.tokenizer_name_or_path to a "
    "directory that has them"
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete tiny checkpoint (config, weights, char tokenizer), created once."""
    return create_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def config(*overrides: str) -> DapoMegatronConfig:
    """The tiny recipe with `key=value` overrides."""
    return load_config(RECIPE, list(overrides)).config


def file_config(model: Path, train: Path, *overrides: str) -> DapoMegatronConfig:
    """The tiny recipe reading gsm8k-layout prompts from `train`, with an existing model."""
    return config(
        f"policy.model_name_or_path={model}",
        "data.format=gsm8k",
        f"data.train_path={train}",
        "reward.verifier=gsm8k",
        *overrides,
    )


def copy_model(tiny_model: Path, out: Path, *, without: tuple[str, ...] = ()) -> Path:
    shutil.copytree(tiny_model, out)
    for name in without:
        (out / name).unlink()
    return out


def one_line(problems: list[str]) -> str:
    assert len(problems) == 1, problems
    assert "\n" not in problems[0]
    return problems[0]


# ----------------------------------------------------------------------------- data files


def test_non_utf8_byte_names_file_line_and_column(tiny_model: Path, tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_bytes(GOOD_ROW * 2 + b'{"question": "\xff", "answer": "#### 2"}\n' + GOOD_ROW)
    message = one_line(preflight(file_config(tiny_model, train), "cpu"))
    assert message == (
        f"data.train_path: {train} line 3: invalid UTF-8 (byte 0xff at column 15); a .jsonl "
        "file must be UTF-8: re-encode it (e.g. iconv -t UTF-8) or fix the line"
    )


def test_invalid_json_line(tiny_model: Path, tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_bytes(GOOD_ROW + b'{"question": "2+2", "answer": \n')
    message = one_line(preflight(file_config(tiny_model, train), "cpu"))
    assert message == (
        f"data.train_path: {train} line 2: invalid JSON (Expecting value at column 31); a "
        ".jsonl file holds one JSON object per line"
    )


def test_huge_single_line_prompt_is_rejected_by_length_quickly(
    tiny_model: Path, tmp_path: Path
) -> None:
    train = tmp_path / "train.jsonl"
    huge = b'{"question": "' + b"1+" * (25 * 1024 * 1024) + b'1", "answer": "#### 1"}\n'
    train.write_bytes(GOOD_ROW + huge + GOOD_ROW)
    cfg = file_config(tiny_model, train)
    expected = (
        f"data.train_path: {train} line 2: longer than {LIMIT} bytes, far more than a prompt "
        "of data.max_prompt_length = 32 tokens can take (64 bytes per token + 64 KiB for the "
        "other fields), rejected before tokenising; remove the row (or raise "
        "data.max_prompt_length)"
    )
    start = time.perf_counter()
    problems = preflight(cfg, "cpu")
    assert time.perf_counter() - start < 2.0
    assert one_line(problems) == expected
    # The run's own loader stops at the same line, as quickly, before any tokenising.
    start = time.perf_counter()
    with pytest.raises(ConfigError) as raised:
        build_datasets(cfg.data, seed=0)
    assert time.perf_counter() - start < 2.0
    assert str(raised.value) == expected


def test_line_at_the_limit_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "edge.jsonl"
    head, tail = b'{"question": "', b'", "answer": "#### 1"}'
    fits = head + b"1" * (LIMIT - len(head) - len(tail)) + tail
    assert len(fits) == LIMIT
    path.write_bytes(fits + b"\n" + GOOD_ROW)
    assert check_prompt_file(path, "gsm8k", max_prompt_length=32) == []
    path.write_bytes(GOOD_ROW + fits + b" \n" + GOOD_ROW)  # one byte over (still valid JSON)
    errors = check_prompt_file(path, "gsm8k", what="data.val_path", max_prompt_length=32)
    assert len(errors) == 1
    assert errors[0].startswith(f"data.val_path: {path} line 2: longer than {LIMIT} bytes")


def test_every_bad_line_is_reported_up_to_a_cap(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    too_long = b"x" * (3 * LIMIT) + b"\n"  # skipped unread; the numbering goes on after it
    path.write_bytes(GOOD_ROW + b"[1]\n" + b"\xfe\n" + too_long + GOOD_ROW + b"{\n")
    errors = check_prompt_file(path, "gsm8k", what="data.train_path", max_prompt_length=32)
    assert [e.split(": ")[1] for e in errors] == [
        f"{path} line 2",
        f"{path} line 3",
        f"{path} line 4",
        f"{path} line 6",
    ]
    path.write_bytes(b"{\n" * (MAX_CHECK_ERRORS + 5))
    errors = check_prompt_file(path, "gsm8k", max_prompt_length=32)
    assert len(errors) == MAX_CHECK_ERRORS + 1
    assert errors[-1] == f"dataset file: {path}: stopped checking after {MAX_CHECK_ERRORS} bad rows"


def test_missing_data_files(tiny_model: Path, tmp_path: Path) -> None:
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    problems = preflight(file_config(tiny_model, train, f"data.val_path={val}"), "cpu")
    assert problems == [
        f"data.train_path: {train} does not exist; point it at a local .jsonl or .parquet file "
        "or name a hub dataset as hf://Org/Name (docs/guides/data.md)",
        f"data.val_path: {val} does not exist; point it at a local .jsonl or .parquet file "
        "or name a hub dataset as hf://Org/Name (docs/guides/data.md)",
    ]


def test_parquet_rows_are_bounded_and_corrupt_parquet_is_named(
    tiny_model: Path, tmp_path: Path
) -> None:
    train = tmp_path / "train.parquet"
    rows = [
        {"question": "1+1", "answer": "#### 2"},
        {"question": "1" * 100_000, "answer": "#### 1"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), train)
    message = one_line(preflight(file_config(tiny_model, train), "cpu"))
    assert message.startswith(
        f"data.train_path: {train} row 2: prompt of 100000 bytes, longer than {LIMIT} bytes"
    )
    train.write_bytes(random.Random(0).randbytes(1000))
    message = one_line(preflight(file_config(tiny_model, train), "cpu"))
    assert message.startswith(f"data.train_path: {train} is not a readable parquet file (")


def test_the_real_loader_raises_the_file_and_line(tiny_model: Path, tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_bytes(GOOD_ROW + b'{"question": "a\xc3", "answer": "#### 2"}\n')
    cfg = file_config(tiny_model, train)
    with pytest.raises(ConfigError) as raised:
        build_datasets(cfg.data, seed=0)
    assert str(raised.value) == one_line(preflight(cfg, "cpu"))
    assert str(raised.value).startswith(
        f"data.train_path: {train} line 2: invalid UTF-8 (byte 0xc3 at column 16);"
    )


# ----------------------------------------------------------------------------- model


def test_model_dir_without_config_json(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model, tmp_path / "m", without=("config.json",))
    # The recipe's preset is for the recipe's model: named again, it describes this one
    # (validation reads the architecture before preflight looks at the directory).
    cfg = config(
        f"policy.model_name_or_path={model}",
        "policy.model_arch=tiny-qwen2",
        "policy.init_model_if_missing=false",
    )
    assert one_line(preflight(cfg, "cpu")) == (
        f"policy.model_name_or_path: {model} has no config.json (a local Hugging Face "
        "checkpoint directory is expected; the hub is not used)"
    )
    # With init_model_if_missing the model would be created, but not into a non-empty dir.
    cfg = config(f"policy.model_name_or_path={model}")
    assert one_line(preflight(cfg, "cpu")) == (
        f"policy.model_name_or_path: {model} exists but has no config.json, so "
        "policy.init_model_if_missing cannot create the model there; delete it or point the "
        "key elsewhere"
    )


def test_truncated_safetensors_is_named(tiny_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = copy_model(tiny_model, tmp_path / "m")
    weights = model / "model.safetensors"
    save_file({"w": torch.zeros(4, 4), "b": torch.ones(4)}, str(weights))
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size - 10)
    cfg = config(f"policy.model_name_or_path={model}")
    assert one_line(preflight(cfg, "cpu")) == (
        f"policy.model_name_or_path: {weights}: truncated or padded: its header describes 80 "
        f"bytes of tensor data, so the file should be {size} bytes, but it is {size - 10}; the "
        "file is damaged (an interrupted download or copy?): copy it again"
    )


def test_random_bytes_safetensors_is_named(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model, tmp_path / "m")
    weights = model / "model.safetensors"
    data = random.Random(0).randbytes(4096)
    weights.write_bytes(data)
    declared = int.from_bytes(data[:8], "little")
    cfg = config(f"policy.model_name_or_path={model}")
    assert one_line(preflight(cfg, "cpu")) == (
        f"policy.model_name_or_path: {weights}: not a safetensors file: its first 8 bytes "
        f"declare a {declared}-byte header, but the file has 4096 bytes; the file is damaged "
        "(an interrupted download or copy?): copy it again"
    )


def test_shard_index_naming_a_missing_file(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model, tmp_path / "m")
    index = model / "model.safetensors.index.json"
    weight_map = {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}
    index.write_text(json.dumps({"weight_map": weight_map}), encoding="utf-8")
    cfg = config(f"policy.model_name_or_path={model}")
    assert one_line(preflight(cfg, "cpu")) == (
        f"policy.model_name_or_path: {index} names 1 missing shard(s) "
        f"(model-00002-of-00002.safetensors) in {model}; download the missing files"
    )


def test_model_dir_without_weights_and_bad_config_json(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model, tmp_path / "m", without=("model.safetensors",))
    cfg = config(f"policy.model_name_or_path={model}")
    (model / "config.json").write_text("{", encoding="utf-8")  # after validation read it
    problems = preflight(cfg, "cpu")
    assert problems[:2] == [
        f"policy.model_name_or_path: {model / 'config.json'} is not valid JSON (Expecting "
        "property name enclosed in double quotes at line 1 column 2); copy the file again",
        f"policy.model_name_or_path: {model} has no *.safetensors weights (only safetensors "
        "checkpoints are read); download or convert the model's weights",
    ]
    # The char tokenizer names its class (PreTrainedTokenizerFast) and is loaded from its
    # own files, without the model's config.json: the broken file is reported once.
    assert len(problems) == 2


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_path_that_does_not_exist(tiny_model: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-tokenizer"
    cfg = config(
        f"policy.model_name_or_path={tiny_model}", f"policy.tokenizer_name_or_path={missing}"
    )
    assert one_line(preflight(cfg, "cpu")) == (
        f"policy.tokenizer_name_or_path: {missing} does not exist; point it at a local "
        "tokenizer directory (the hub is not used)"
    )


def test_model_dir_without_tokenizer_files(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(
        tiny_model, tmp_path / "m", without=("tokenizer.json", "tokenizer_config.json")
    )
    cfg = config(f"policy.model_name_or_path={model}")
    expected = (
        f"policy.model_name_or_path: {model} holds no tokenizer files (none of "
        f"{', '.join(VOCABULARY_FILES)}); {TOKENIZER_FIX}"
    )
    assert one_line(preflight(cfg, "cpu")) == expected
    # The run's own tokenizer loading raises the same message.
    with pytest.raises(ConfigError) as raised:
        load_policy_tokenizer(cfg.policy)
    assert str(raised.value) == expected


def test_tokenizer_with_an_empty_vocabulary_fails_the_round_trip(
    tiny_model: Path, tmp_path: Path
) -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    empty = tmp_path / "empty-tok"
    core = Tokenizer(models.WordLevel(vocab={"<unk>": 0}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>").save_pretrained(empty)
    cfg = config(
        f"policy.model_name_or_path={tiny_model}", f"policy.tokenizer_name_or_path={empty}"
    )
    message = one_line(preflight(cfg, "cpu"))
    assert message.startswith(
        f"policy.tokenizer_name_or_path: the tokenizer at {empty} does not round-trip the test "
        "string '12+3=15' (encoded to 1 tokens, decoded as "
    )
    assert message.endswith(
        "its vocabulary is empty or its files are inconsistent: copy them again"
    )


# ----------------------------------------------------------------------------- devices


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_on_a_cpu_only_machine(tiny_model: Path) -> None:
    cfg = config(f"policy.model_name_or_path={tiny_model}", "cluster.device=cuda")
    message = one_line(preflight(cfg, "cuda"))
    assert message.startswith(
        "cluster.device = 'cuda': CUDA was asked for but torch.cuda.is_available() is False on "
        "this node (torch "
    )
    assert message.endswith("set cluster.device=cpu, or auto to use what the node has")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_more_gpus_per_node_than_visible(tiny_model: Path) -> None:
    visible = torch.cuda.device_count()
    cfg = config(
        f"policy.model_name_or_path={tiny_model}",
        "cluster.device=cuda",
        f"cluster.gpus_per_node={visible + 1}",
    )
    assert one_line(preflight(cfg, "cuda")).startswith(
        f"cluster.gpus_per_node = {visible + 1}: only {visible} CUDA device(s) are visible"
    )


# ----------------------------------------------------------------------------- whole recipe


def test_shipped_tiny_recipe_passes_before_its_model_exists(tmp_path: Path) -> None:
    model = tmp_path / "model"  # created by the run (policy.init_model_if_missing)
    start = time.perf_counter()
    assert preflight(config(f"policy.model_name_or_path={model}"), "cpu") == []
    assert time.perf_counter() - start < 10
    assert not model.exists()  # pre-flight only looks


def test_shipped_tiny_recipe_passes_with_its_model(tiny_model: Path) -> None:
    start = time.perf_counter()
    assert preflight(config(f"policy.model_name_or_path={tiny_model}"), "cpu") == []
    assert time.perf_counter() - start < 10


def test_shipped_tiny_recipe_passes_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its model path is relative to the repository: there or not yet created, it passes.
    monkeypatch.chdir(REPO)
    assert preflight(config(), "cpu") == []


def test_preflight_lists_every_problem(tiny_model: Path, tmp_path: Path) -> None:
    train, tok = tmp_path / "t.jsonl", tmp_path / "tok"
    cfg = file_config(tiny_model, train, f"policy.tokenizer_name_or_path={tok}")
    problems = preflight(cfg, "cpu")
    assert len(problems) == 2
    assert problems[0].startswith(f"data.train_path: {train} does not exist")
    assert problems[1].startswith(f"policy.tokenizer_name_or_path: {tok} does not exist")


def test_importing_preflight_imports_no_heavy_package() -> None:
    code = (
        "import sys, dapo_megatron.planning.preflight; "
        "print(sorted(m for m in ('torch', 'transformers', 'megatron', 'ray') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------
# A vLLM recipe's dry run fails where vllm is not installed, naming the key and the fix.
#
# Before, ``dapo-train --dry-run`` passed such a recipe and the run failed ~40 s later, once
# Ray and the policy ranks had started and the first engine actor imported vllm. Whether
# vllm is installed is patched (``preflight.package_installed``), so the tests say the same
# in the main .venv (no vllm) and in .venv-vllm.

VLLM_RECIPE = REPO / "recipes" / "dapo-tiny-cpu-vllm.yaml"
MEGATRON_RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"


@pytest.fixture
def without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = preflight_module.package_installed
    monkeypatch.setattr(
        preflight_module, "package_installed", lambda name: name != "vllm" and real(name)
    )


def test_vllm_backend_without_vllm_on_cpu_names_the_cpu_setup(without_vllm: None) -> None:
    config = load_config(VLLM_RECIPE).config
    (problem,) = preflight_module.check_generation_backend(config, "cpu")
    assert problem.startswith("generation.backend = vllm, but the vllm package is not installed")
    assert "bash scripts/setup_vllm_cpu.sh" in problem and ".venv-vllm/bin/dapo-train" in problem
    assert "generation.backend=megatron" in problem and "\n" not in problem


def test_on_cuda_the_fix_is_the_gpu_setup(without_vllm: None) -> None:
    config = load_config(VLLM_RECIPE).config
    (problem,) = preflight_module.check_generation_backend(config, "cuda")
    assert "bash scripts/setup_gpu.sh" in problem and "setup_vllm_cpu" not in problem


def test_megatron_backend_and_installed_vllm_pass(
    without_vllm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        preflight_module.check_generation_backend(load_config(MEGATRON_RECIPE).config, "cpu") == []
    )
    monkeypatch.setattr(preflight_module, "package_installed", lambda name: True)
    assert preflight_module.check_generation_backend(load_config(VLLM_RECIPE).config, "cpu") == []


def test_package_installed_finds_without_importing() -> None:
    assert preflight_module.package_installed("json")
    assert not preflight_module.package_installed("no_such_package_dapo")


def test_dry_run_refuses_the_vllm_recipe(
    without_vllm: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "--config",
        str(VLLM_RECIPE),
        "--dry-run",
        f"run.output_dir={tmp_path / 'run'}",
        f"policy.model_name_or_path={tmp_path / 'model'}",
        "policy.init_model_if_missing=true",
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "generation.backend = vllm, but the vllm package is not installed" in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "model").exists()
