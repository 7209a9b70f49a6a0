"""Prompt datasets (data/datasets.py): file layouts and their errors, the data config's
entry point and prompt encoding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.schema_data import ArithmeticTaskConfig, DataConfig, RemainderTaskConfig
from dapo_megatron.data.arithmetic import make_train_val_split
from dapo_megatron.data.datasets import (
    PromptRecord,
    build_datasets,
    encode_prompts,
    load_prompt_file,
)
from dapo_megatron.data.file_rows import max_row_bytes
from dapo_megatron.data.tokenizer import build_char_tokenizer, load_tokenizer

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
        "val_fraction": None,
        "prompt_key": None,
        "answer_key": None,
        "max_prompt_length": 32,
        "apply_chat_template": False,
        "prompt_template": None,
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


def test_build_datasets_remainder() -> None:
    splits = build_datasets(data_config(format="remainder"), seed=3)
    assert len(splits.train) == 64 and splits.val is not None and len(splits.val) == 10
    assert all(r.ground_truth.count("\n") == 1 for r in splits.train.records)
    assert "remainder(n=10..129, d=3..9, seed=3)" in splits.train.source


# ---------------------------------------------------------------------------------------
# Issue 30 case 10: the over-long prompt policy that configs/dapo_base.yaml documents.

REPO = Path(__file__).resolve().parents[3]


def test_over_long_prompts_are_skipped_and_counted_and_corrupt_rows_refused(
    tmp_path: Path,
) -> None:
    # What configs/dapo_base.yaml says of data.max_prompt_length, and what the code does.
    comment = next(
        line for line in (REPO / "configs/dapo_base.yaml").read_text().splitlines()
        if line.strip().startswith("max_prompt_length:")
    )  # fmt: skip
    assert "skipped and counted" in comment and "is an error" in comment
    from dapo_megatron.data.tiny_model import create_tiny_model

    tokenizer = load_tokenizer(create_tiny_model(tmp_path / "model", seed=0), key="model")
    rows = [{"question": "1+1=", "answer": "#### 2"}, {"question": "1+" * 40, "answer": "#### 3"}]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = load_prompt_file(train, "gsm8k", max_prompt_length=32)
    encoded = encode_prompts(
        dataset.records, tokenizer, apply_chat_template=False, max_prompt_length=32
    )
    assert len(encoded.records) == 1 and encoded.num_too_long == 1  # skipped, counted
    huge = {"question": "7" * (max_row_bytes(32) + 1), "answer": "#### 7"}
    train.write_text("".join(json.dumps(r) + "\n" for r in [*rows, huge]))
    with pytest.raises(ConfigError, match=f"{train} line 3: longer than"):
        load_prompt_file(train, "gsm8k", max_prompt_length=32)
