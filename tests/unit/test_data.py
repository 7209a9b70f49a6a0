"""Tests of dapo_megatron.data: file datasets, prompt encoding, the arithmetic task, the char
tokenizer, the tiny model and the resumable prompt sampler."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.config.arithmetic_task import num_distinct_problems
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.model_arch import PRESETS, arch_from_hf_config
from dapo_megatron.config.schema_data import ArithmeticTaskConfig, DataConfig, RemainderTaskConfig
from dapo_megatron.data import tiny_model as tiny_model_module
from dapo_megatron.data.arithmetic import make_problems, make_train_val_split
from dapo_megatron.data.datasets import (
    PromptRecord,
    build_datasets,
    encode_prompts,
    gsm8k_final_answer,
    load_prompt_file,
)
from dapo_megatron.data.sampler import PromptSampler
from dapo_megatron.data.tiny_model import create_tiny_model, main
from dapo_megatron.data.tokenizer import CHARACTERS, build_char_tokenizer, save_char_tokenizer

EXTENSIONS = ["jsonl", "parquet"]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows as jsonl or parquet, by the path's extension."""
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def dapo_row(question: str | None, answer: str | None, index: int) -> dict[str, Any]:
    """A row in the DAPO-Math-17k (verl) layout."""
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": question}],
        "ability": "MATH",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": f"id-{index}"},
    }


# ----------------------------------------------------------------------------- file layouts


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_dapo_math_layout(tmp_path: Path, ext: str) -> None:
    rows = [
        dapo_row("What is 1+1?", "2", 0),
        dapo_row("   ", "3", 1),  # blank prompt: skipped
        dapo_row("What is 2+2?", None, 2),  # no ground truth: skipped
        dapo_row("Compute 6*7.", "42", 3),
        dapo_row(None, "5", 4),  # null content (parquet's missing text): skipped
    ]
    data = load_prompt_file(write_rows(tmp_path / f"d.{ext}", rows), "dapo_math")

    assert len(data) == 2 and data.num_rows == 5
    assert data.skipped == {"empty prompt": 2, "missing answer": 1}
    assert data.num_skipped == 3
    first, second = data.records
    assert first.prompt == [{"role": "user", "content": "What is 1+1?"}]
    assert first.messages == first.prompt and first.text == "What is 1+1?"
    assert first.ground_truth == "2" and second.ground_truth == "42"
    # Everything but the prompt and reward_model fields is metadata, with the 1-based row.
    assert first.metadata == {
        "data_source": "math_dapo",
        "ability": "MATH",
        "extra_info": {"index": "id-0"},
        "row": 1,
    }
    assert second.metadata["row"] == 4
    assert "2 of 5 rows" in data.describe() and "2 empty prompt" in data.describe()


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_aime_in_dapo_layout_and_flat_layout(tmp_path: Path, ext: str) -> None:
    nested = load_prompt_file(
        write_rows(tmp_path / f"nested.{ext}", [dapo_row("AIME 1", "204", 0)]), "aime"
    )
    assert nested.records[0].ground_truth == "204"
    assert nested.records[0].messages[0]["content"] == "AIME 1"

    # Flat rows; integer answers (and parquet's integral doubles) become plain digits.
    flat_rows = [
        {"id": 1, "problem": "Find x.", "answer": 33.0},
        {"id": 2, "problem": "Find y.", "answer": 7.0},
    ]
    flat = load_prompt_file(write_rows(tmp_path / f"flat.{ext}", flat_rows), "aime")
    assert [r.text for r in flat.records] == ["Find x.", "Find y."]
    assert [r.ground_truth for r in flat.records] == ["33", "7"]
    assert flat.records[0].prompt == "Find x."
    assert flat.records[0].messages == [{"role": "user", "content": "Find x."}]
    assert flat.records[0].metadata == {"id": 1, "row": 1}


def test_aime_accepts_question_field_and_int_answers(tmp_path: Path) -> None:
    rows = [{"question": "Q1", "answer": 5}, {"problem": "Q2", "answer": "12"}]
    data = load_prompt_file(write_rows(tmp_path / "a.jsonl", rows), "aime")
    assert [(r.text, r.ground_truth) for r in data.records] == [("Q1", "5"), ("Q2", "12")]


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_gsm8k_layout(tmp_path: Path, ext: str) -> None:
    rows = [
        {"question": "Tom has 3 apples...", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A big sum?", "answer": "Lots of work\n#### 1,200"},
        {"question": "No final answer", "answer": "just reasoning"},
        {"question": "", "answer": "#### 1"},
    ]
    data = load_prompt_file(write_rows(tmp_path / f"g.{ext}", rows), "gsm8k")
    assert [r.ground_truth for r in data.records] == ["7", "1200"]
    assert data.records[0].prompt == "Tom has 3 apples..."
    assert data.records[1].metadata["solution"] == "Lots of work\n#### 1,200"
    assert data.skipped == {"answer without a final answer after ####": 1, "empty prompt": 1}


def test_gsm8k_final_answer() -> None:
    assert gsm8k_final_answer("a #### b #### -3") == "-3"
    assert gsm8k_final_answer("#### 12,345,678") == "12345678"
    assert gsm8k_final_answer("no marker 5") is None
    assert gsm8k_final_answer("####   ") is None


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_prompt_and_answer_key_overrides_with_dotted_paths(tmp_path: Path, ext: str) -> None:
    rows = [
        {"q": {"text": "Solve 1+2", "lang": "en"}, "sol": {"final": 3}, "tag": "x"},
        {"q": {"text": "Solve 4+4", "lang": "en"}, "sol": {"final": 8}, "tag": "y"},
    ]
    data = load_prompt_file(
        write_rows(tmp_path / f"o.{ext}", rows),
        "dapo_math",
        prompt_key="q.text",
        answer_key="sol.final",
    )
    assert [(r.text, r.ground_truth) for r in data.records] == [
        ("Solve 1+2", "3"),
        ("Solve 4+4", "8"),
    ]
    assert data.records[1].metadata == {"tag": "y", "row": 2}


def test_flattened_column_name_with_a_dot(tmp_path: Path) -> None:
    rows = [{"prompt": "p", "reward_model.ground_truth": "9"}]
    data = load_prompt_file(write_rows(tmp_path / "f.jsonl", rows), "dapo_math")
    assert data.records[0].ground_truth == "9"


def test_rows_missing_a_field_sometimes_are_skipped_and_counted(tmp_path: Path) -> None:
    rows = [{"question": "Q", "answer": "#### 1"}, {"question": "Q2"}, {"answer": "#### 2"}]
    data = load_prompt_file(write_rows(tmp_path / "g.jsonl", rows), "gsm8k")
    assert len(data) == 1
    assert data.skipped == {"missing answer": 1, "empty prompt": 1}


def test_blank_lines_are_not_rows(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text('\n{"question": "Q", "answer": "#### 1"}\n\n', encoding="utf-8")
    data = load_prompt_file(path, "gsm8k")
    assert data.num_rows == 1 and data.records[0].metadata["row"] == 1


# ----------------------------------------------------------------------------- file errors


def test_missing_file_names_the_path_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "nope.parquet"
    with pytest.raises(ConfigError, match=r"data\.train_path: .*nope\.parquet does not exist"):
        load_prompt_file(path, "dapo_math", what="data.train_path")


def test_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("question,answer\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"d\.csv has the unknown extension '\.csv'.*\.jsonl, \.parquet"
    ):
        load_prompt_file(path, "gsm8k")


def test_unknown_format(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "d.jsonl", [{"question": "q", "answer": "#### 1"}])
    with pytest.raises(ValueError, match="'arithmetic' is not read from a file"):
        load_prompt_file(path, "arithmetic")


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_field_absent_from_every_row_is_an_error(tmp_path: Path, ext: str) -> None:
    path = write_rows(tmp_path / f"d.{ext}", [{"problem": "p", "answer": "1"}] * 2)
    where = "line 1" if ext == "jsonl" else "row 1"
    with pytest.raises(
        ConfigError, match=rf"d\.{ext} {where}: no field 'question'.*data\.prompt_key"
    ):
        load_prompt_file(path, "gsm8k")
    with pytest.raises(
        ValueError, match=r"no field 'sol\.x'.*\['answer', 'problem'\].*data\.answer_key"
    ):
        load_prompt_file(path, "aime", answer_key="sol.x")


def test_wrong_types_name_file_row_and_field(tmp_path: Path) -> None:
    rows = [{"question": "ok", "answer": "#### 1"}, {"question": 12, "answer": "#### 2"}]
    path = write_rows(tmp_path / "t.jsonl", rows)
    with pytest.raises(
        ConfigError, match=r"t\.jsonl line 2: field 'question' is a int.*prompt_key"
    ):
        load_prompt_file(path, "gsm8k")

    rows = [{"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}]
    with pytest.raises(ValueError, match=r"line 1: field 'prompt' message 0"):
        load_prompt_file(write_rows(tmp_path / "m.jsonl", rows), "dapo_math")

    rows = [{"prompt": "p", "reward_model": "1"}]
    with pytest.raises(ValueError, match=r"line 1: field 'reward_model' is a str, not a mapping"):
        load_prompt_file(write_rows(tmp_path / "r.jsonl", rows), "dapo_math")

    rows = [{"prompt": "p", "reward_model": {"ground_truth": ["1", "2"]}}]
    with pytest.raises(ValueError, match=r"'reward_model\.ground_truth' is a list.*answer_key"):
        load_prompt_file(write_rows(tmp_path / "l.jsonl", rows), "dapo_math")


def test_invalid_json_and_non_object_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.jsonl line 2: invalid JSON"):
        load_prompt_file(path, "gsm8k")
    path.write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 1: a list, not a JSON object"):
        load_prompt_file(path, "gsm8k")


def test_empty_file_and_all_rows_skipped_are_errors(tmp_path: Path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="has no rows"):
        load_prompt_file(empty, "gsm8k")
    path = write_rows(tmp_path / "s.jsonl", [{"question": "", "answer": "#### 1"}])
    with pytest.raises(
        ConfigError, match=r"s\.jsonl: every one of its 1 rows was skipped.*'empty prompt': 1"
    ):
        load_prompt_file(path, "gsm8k")


# ----------------------------------------------------------------------------- config entry


def data_config(**overrides: Any) -> DataConfig:
    fields: dict[str, Any] = {
        "format": "arithmetic",
        "train_path": None,
        "val_path": None,
        "prompt_key": None,
        "answer_key": None,
        "max_prompt_length": 32,
        "apply_chat_template": False,
        "shuffle": True,
        "arithmetic": ArithmeticTaskConfig(num_train=64, num_val=10, difficulty=2),
        "remainder": RemainderTaskConfig(
            num_train=64,
            num_val=10,
            min_dividend=10,
            max_dividend=129,
            min_divisor=3,
            max_divisor=9,
        ),
    }
    return DataConfig(**{**fields, **overrides})


def test_build_datasets_arithmetic_and_files(tmp_path: Path) -> None:
    splits = build_datasets(data_config(), seed=3)
    assert len(splits.train) == 64 and splits.val is not None and len(splits.val) == 10
    assert splits.train.records == make_train_val_split(64, 10, seed=3, num_operands=2)[0]
    no_val = build_datasets(
        data_config(arithmetic=ArithmeticTaskConfig(num_train=5, num_val=0, difficulty=3)), seed=0
    )
    assert no_val.val is None and len(no_val.train) == 5

    train = write_rows(tmp_path / "t.jsonl", [{"q": "a", "answer": "#### 1"}])
    val = write_rows(tmp_path / "v.parquet", [{"q": "b", "answer": "#### 2"}])
    cfg = data_config(format="gsm8k", train_path=str(train), val_path=str(val), prompt_key="q")
    splits = build_datasets(cfg, seed=0)
    assert splits.train.records[0].text == "a" and splits.val.records[0].ground_truth == "2"

    missing = data_config(format="gsm8k", train_path=str(tmp_path / "x.jsonl"))
    with pytest.raises(ConfigError, match=r"data\.train_path: .*x\.jsonl does not exist"):
        build_datasets(missing, seed=0)


# ----------------------------------------------------------------------------- encode_prompts


def test_encode_prompts_filters_long_prompts_and_keeps_alignment() -> None:
    tokenizer = build_char_tokenizer()
    records = [PromptRecord("1+2=", "3"), PromptRecord("12+34+56=", "102"), PromptRecord("7=", "7")]
    # <bos> + characters: 5, 10 and 3 tokens.
    out = encode_prompts(records, tokenizer, apply_chat_template=False, max_prompt_length=5)
    assert out.num_too_long == 1
    assert [r.ground_truth for r in out.records] == ["3", "7"]
    assert out.input_ids[0] == [
        tokenizer.bos_token_id,
        *tokenizer.convert_tokens_to_ids(list("1+2=")),
    ]
    assert [len(ids) for ids in out.input_ids] == [5, 3]
    # The limit is inclusive.
    assert (
        encode_prompts(
            records, tokenizer, apply_chat_template=False, max_prompt_length=10
        ).num_too_long
        == 0
    )
    empty = encode_prompts([], tokenizer, apply_chat_template=False, max_prompt_length=5)
    assert empty.input_ids == [] and empty.num_too_long == 0
    with pytest.raises(ValueError, match="max_prompt_length must be >= 1"):
        encode_prompts(records, tokenizer, apply_chat_template=False, max_prompt_length=0)


def test_encode_prompts_with_a_chat_template() -> None:
    tokenizer = build_char_tokenizer()
    records = [
        PromptRecord([{"role": "user", "content": "1+2"}], "3"),
        PromptRecord("4*5", "20"),  # plain text becomes one user message
        PromptRecord([{"role": "user", "content": "1+1+1+1+1"}], "5"),
    ]
    with pytest.raises(ValueError, match="has no chat template.*apply_chat_template: false"):
        encode_prompts(records, tokenizer, apply_chat_template=True, max_prompt_length=8)

    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}={% endif %}"
    )
    out = encode_prompts(records, tokenizer, apply_chat_template=True, max_prompt_length=8)
    # The template places <bos> itself; no second one is added.
    expected = [tokenizer.bos_token_id, *tokenizer.convert_tokens_to_ids(list("1+2\n="))]
    assert out.input_ids[0] == expected
    assert tokenizer.decode(out.input_ids[1], skip_special_tokens=True) == "4*5\n="
    assert out.num_too_long == 1 and [r.ground_truth for r in out.records] == ["3", "20"]


# ----------------------------------------------------------------------------- arithmetic


def test_problems_are_deterministic_and_correct() -> None:
    a = make_problems(200, seed=7, num_operands=4, ops="+-*")
    assert a == make_problems(200, seed=7, num_operands=4, ops="+-*")
    assert a != make_problems(200, seed=8, num_operands=4, ops="+-*")
    for record in a:
        assert isinstance(record.prompt, str) and record.prompt.endswith("=")
        expression = record.prompt[:-1]
        # Python's own precedence is the reference for the generator's evaluator.
        assert int(record.ground_truth) == eval(expression)  # noqa: S307 (our own digits/ops)
        operands = expression.replace("-", "+").replace("*", "+").split("+")
        assert len(operands) == 4 and all(0 <= int(x) <= 9 for x in operands)
        assert set(record.prompt) <= set(CHARACTERS)


def test_default_problems_are_single_digit_sums() -> None:
    for record in make_problems(50, seed=0, num_operands=2):
        left, right = record.prompt[:-1].split("+")
        assert len(left) == len(right) == 1
        assert record.ground_truth == str(int(left) + int(right))
    assert num_distinct_problems(num_operands=2) == 100
    assert num_distinct_problems(num_operands=3, max_operand=4, ops="+-") == 5**3 * 2**2


def test_split_is_disjoint_and_balanced() -> None:
    train, val = make_train_val_split(1000, 20, seed=1, num_operands=2)
    val_prompts = [r.prompt for r in val]
    assert len(train) == 1000 and len(val) == 20 and len(set(val_prompts)) == 20
    assert not set(val_prompts) & {r.prompt for r in train}
    # 80 remaining problems, 1000 draws: each appears 12 or 13 times.
    counts = Counter(r.prompt for r in train)
    assert len(counts) == 80 and set(counts.values()) <= {12, 13}
    assert (train, val) == make_train_val_split(1000, 20, seed=1, num_operands=2)
    assert make_train_val_split(1000, 20, seed=2, num_operands=2)[1] != val


def test_split_of_a_huge_task_space_is_disjoint() -> None:
    # 10^7 problems: sampled by rejection rather than enumerated.
    train, val = make_train_val_split(3000, 500, seed=0, num_operands=7)
    assert len({r.prompt for r in val}) == 500
    assert not {r.prompt for r in val} & {r.prompt for r in train}


def test_arithmetic_errors() -> None:
    with pytest.raises(ValueError, match=r"difficulty\) must be >= 2"):
        make_problems(1, seed=0, num_operands=1)
    with pytest.raises(ValueError, match="ops must be distinct characters"):
        make_problems(1, seed=0, num_operands=2, ops="+/")
    with pytest.raises(
        ValueError, match=r"num_val = 100 leaves no training problem.*below 100 \(e\.g\. 20"
    ):
        make_train_val_split(10, 100, seed=0, num_operands=2)
    train, val = make_train_val_split(10, 99, seed=0, num_operands=2)
    assert {r.prompt for r in train} == {train[0].prompt}  # the one problem left


# ----------------------------------------------------------------------------- tokenizer


def test_char_tokenizer_round_trip() -> None:
    tokenizer = build_char_tokenizer()
    assert len(tokenizer) <= PRESETS["tiny-qwen2"].vocab_size
    assert tokenizer.eos_token == "<eos>" and tokenizer.pad_token == "<pad>"
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3
    text = "12+3*4-5=7\n 0 9"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == len(text) + 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(tokenizer.encode(CHARACTERS, add_special_tokens=False)) == CHARACTERS
    # Special tokens in text are single tokens; unknown characters map to <unk>.
    assert tokenizer.encode("1<eos>", add_special_tokens=False) == [
        tokenizer.convert_tokens_to_ids("1"),
        tokenizer.eos_token_id,
    ]
    assert tokenizer.encode("x", add_special_tokens=False) == [tokenizer.unk_token_id]


def test_char_tokenizer_saves_and_reloads_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = build_char_tokenizer()
    save_char_tokenizer(tokenizer, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "9*9=81\n"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"], skip_special_tokens=True) == text
    assert (reloaded.eos_token_id, reloaded.pad_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )


# ----------------------------------------------------------------------------- tiny model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def test_tiny_model_loads_and_matches_the_preset(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    arch = PRESETS["tiny-qwen2"]
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert arch_from_hf_config(config, "config.json") == arch
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert isinstance(model, Qwen2ForCausalLM)
    assert sum(p.numel() for p in model.parameters()) == arch.num_parameters()
    assert model.config.vocab_size >= len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id
    input_ids = torch.tensor([tokenizer("3+5=")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids).logits
    assert logits.shape == (1, 5, arch.vocab_size) and torch.isfinite(logits).all()
    # The seed fixes the weights.
    other = create_tiny_model(tiny_model_dir.parent / "again", seed=0)
    again = AutoModelForCausalLM.from_pretrained(other)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    ("preset", "model_class"),
    [("tiny-qwen3", "Qwen3ForCausalLM"), ("tiny-qwen3-moe", "Qwen3MoeForCausalLM")],
)
def test_tiny_model_of_other_families(preset: str, model_class: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    arch = PRESETS[preset]
    out = create_tiny_model(tmp_path / preset, arch=arch, seed=0)
    config = json.loads((out / "config.json").read_text())
    assert arch_from_hf_config(config, "config.json") == arch
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == model_class
    # Exact parameter counts: q/k norms, head_dim != hidden / heads, the experts.
    assert sum(p.numel() for p in model.parameters()) == arch.num_parameters()


def test_tiny_model_is_idempotent(tiny_model_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()}
    assert create_tiny_model(tiny_model_dir, seed=123) == tiny_model_dir
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()} == before
    smaller = dataclasses.replace(PRESETS["tiny-qwen2"], num_layers=1)
    with pytest.raises(ValueError, match="another architecture"):
        create_tiny_model(tiny_model_dir, arch=smaller, seed=0)


def test_tiny_model_failure_leaves_no_partial_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny_model_module, "save_char_tokenizer", fail)  # after the weights
    with pytest.raises(RuntimeError, match="disk full"):
        create_tiny_model(tmp_path / "m", seed=0)
    assert list(tmp_path.iterdir()) == []


def test_tiny_model_existing_directories(tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    with pytest.raises(
        FileExistsError, match=r"not a complete checkpoint \(missing model\.safetensors"
    ):
        create_tiny_model(partial, seed=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (create_tiny_model(empty, seed=0) / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "partial"]


def test_tiny_model_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nested" / "cli-model"
    assert main(["--out", str(out), "--seed", "5"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert (out / "tokenizer.json").is_file()


# ----------------------------------------------------------------------------- sampler


@settings(max_examples=60, deadline=None)
@given(
    num_items=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    shuffle=st.booleans(),
    before=st.lists(st.integers(0, 15), max_size=5),
    after=st.lists(st.integers(0, 15), max_size=5),
)
def test_sampler_resume_equals_uninterrupted(
    num_items: int, seed: int, shuffle: bool, before: list[int], after: list[int]
) -> None:
    uninterrupted = PromptSampler(num_items, seed=seed, shuffle=shuffle)
    for n in before:
        uninterrupted.next_indices(n)
    expected = [uninterrupted.next_indices(n) for n in after]

    first = PromptSampler(num_items, seed=seed, shuffle=shuffle)
    for n in before:
        first.next_indices(n)
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints may store it as JSON
    # A fresh sampler with another seed: the checkpoint's seed must win.
    resumed = PromptSampler(num_items, seed=seed + 1, shuffle=shuffle)
    resumed.load_state_dict(state)
    assert [resumed.next_indices(n) for n in after] == expected
    assert resumed.state_dict() == uninterrupted.state_dict()


def test_sampler_epochs_are_permutations() -> None:
    sampler = PromptSampler(50, seed=3, shuffle=True)
    drawn = sampler.next_indices(120)  # crosses two epoch boundaries
    epochs = [drawn[:50], drawn[50:100]]
    assert all(sorted(e) == list(range(50)) for e in epochs)
    assert epochs[0] != epochs[1] and epochs[0] != list(range(50))
    assert (sampler.epoch, sampler.position) == (2, 20)
    assert drawn[100:] == PromptSampler(50, seed=3 + 2, shuffle=True).next_indices(20)

    ordered = PromptSampler(4, seed=0, shuffle=False)
    assert ordered.next_indices(10) == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert ordered.next_indices(0) == []


def test_sampler_state_errors() -> None:
    sampler = PromptSampler(10, seed=0, shuffle=True)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="covered 10 prompts but the dataset now has 9"):
        PromptSampler(9, seed=0, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="data.shuffle=True"):
        PromptSampler(10, seed=0, shuffle=False).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks position"):
        sampler.load_state_dict({"epoch": 0, "seed": 0})
    with pytest.raises(ValueError, match="at least one prompt"):
        PromptSampler(0, seed=0, shuffle=True)


def test_build_datasets_remainder() -> None:
    splits = build_datasets(data_config(format="remainder"), seed=3)
    assert len(splits.train) == 64 and splits.val is not None and len(splits.val) == 10
    assert all(r.ground_truth.count("\n") == 1 for r in splits.train.records)
    assert "remainder(n=10..129, d=3..9, seed=3)" in splits.train.source
