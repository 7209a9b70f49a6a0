"""Hub datasets (``hf://Org/Name``, data/hub_datasets.py) against a local fake hub
(unit/fake_hub.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.data import hub
from dapo_megatron.data.datasets import build_datasets, load_prompt_file
from dapo_megatron.data.hub_datasets import parse_hf_uri, resolve_data_path
from dapo_megatron.data.prompt_template import NEMO_COT_TEMPLATE, apply_prompt_template
from dapo_megatron.shared.commands import tool_command
from unit.data.test_datasets import data_config
from unit.fake_hub import (
    COMMIT,
    REAL_OFFLINE_REASON,
    FakeHub,
    add_aime,
    add_dapo_math,
    add_gsm8k,
    add_math500,
    add_openmath2,
    write_parquet,
)

# ----------------------------------------------------------------------------- datasets


def test_parse_names_repo_and_split() -> None:
    assert parse_hf_uri("hf://openai/gsm8k", "k").repo_id == "openai/gsm8k"
    assert parse_hf_uri("hf://openai/gsm8k:test", "k").split == "test"
    with pytest.raises(ConfigError, match="write hf://Org/Name or hf://Org/Name:split"):
        parse_hf_uri("hf://gsm8k", "data.train_path")


def test_dapo_math_is_downloaded_once_converted_and_deduplicated(
    fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    add_dapo_math(fake_hub)
    name = "hf://BytedTsinghua-SIA/DAPO-Math-17k"
    dataset = load_prompt_file(name, "dapo_math", what="data.train_path")
    assert [r.ground_truth for r in dataset.records] == ["2", "5"]
    assert dataset.records[0].messages[0]["content"].endswith("1+1?")
    assert dataset.records[0].metadata["data_source"] == "math_dapo"
    out = capsys.readouterr().out
    assert "4 repeated prompts dropped" in out and "2 rows" in out
    assert fake_hub.downloads == [
        ("dataset", "BytedTsinghua-SIA/DAPO-Math-17k", ("data/*.parquet",))
    ]
    # Cached: the second use neither downloads nor converts.
    again = load_prompt_file(name, "dapo_math", what="data.train_path")
    assert len(again) == 2 and len(fake_hub.downloads) == 1
    assert Path(again.source).parent.name == COMMIT


def test_aime_reads_with_the_aime_format(fake_hub: FakeHub) -> None:
    add_aime(fake_hub)
    dataset = load_prompt_file("hf://BytedTsinghua-SIA/AIME-2024", "aime")
    assert [r.ground_truth for r in dataset.records] == ["204"]


def test_gsm8k_splits_and_final_answers(fake_hub: FakeHub) -> None:
    add_gsm8k(fake_hub)
    train = load_prompt_file("hf://openai/gsm8k", "gsm8k")
    assert [(r.text, r.ground_truth) for r in train.records] == [("3 + 4?", "7")]
    test = load_prompt_file("hf://openai/gsm8k:test", "gsm8k")
    assert [r.ground_truth for r in test.records] == ["1200"]
    assert test.skipped == {"answer without a final answer after ####": 1}
    # Read as dapo_math: chat messages and the final number as the ground truth.
    as_math = load_prompt_file("hf://openai/gsm8k:test", "dapo_math")
    assert as_math.records[0].messages == [{"role": "user", "content": "Cost?"}]
    assert as_math.records[0].ground_truth == "1200"
    assert as_math.skipped == {"missing answer": 1}


def test_math500_problem_and_answer(fake_hub: FakeHub) -> None:
    add_math500(fake_hub)
    (record,) = load_prompt_file("hf://HuggingFaceH4/MATH-500", "aime").records
    assert record.ground_truth == "1" and "frac" in record.text
    assert record.metadata["subject"] == "Algebra"


def test_known_dataset_refuses_a_format_or_split_it_has_not(fake_hub: FakeHub) -> None:
    add_math500(fake_hub)
    with pytest.raises(ConfigError, match="set data.format=aime"):
        resolve_data_path("hf://HuggingFaceH4/MATH-500", "gsm8k", what="data.val_path")
    with pytest.raises(ConfigError, match="has no split 'train'; it has test"):
        resolve_data_path("hf://HuggingFaceH4/MATH-500:train", "aime", what="data.val_path")


def test_unknown_dataset_maps_through_the_keys(fake_hub: FakeHub) -> None:
    rows = [{"q": "1+2?", "sol": {"final": 3}}]
    write_parquet(fake_hub.repo("dataset", "someone/mathy") / "data/train-0.parquet", rows)
    write_parquet(fake_hub.repo("dataset", "someone/mathy") / "data/test-0.parquet", rows * 2)
    with pytest.raises(ConfigError) as e:
        load_prompt_file("hf://someone/mathy", "aime", what="data.train_path")
    message = str(e.value)
    assert "no converter knows this dataset" in message and "['q', 'sol']" in message
    assert "data.prompt_key" in message and "data.answer_key" in message
    dataset = load_prompt_file("hf://someone/mathy", "aime", prompt_key="q", answer_key="sol.final")
    assert [(r.text, r.ground_truth) for r in dataset.records] == [("1+2?", "3")]
    test = load_prompt_file(
        "hf://someone/mathy:test", "aime", prompt_key="q", answer_key="sol.final"
    )
    assert len(test) == 2


def test_missing_repository_names_the_download_failure(fake_hub: FakeHub) -> None:
    with pytest.raises(ConfigError, match="downloading dataset nobody/none from the hub failed"):
        resolve_data_path("hf://nobody/none", "aime", what="data.train_path")


def test_offline_without_cache_names_dapo_prepare(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_gsm8k(fake_hub)
    monkeypatch.setattr(hub, "offline_reason", REAL_OFFLINE_REASON)  # reads HF_HUB_OFFLINE
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as e:
        resolve_data_path("hf://openai/gsm8k", "gsm8k", what="data.train_path")
    message = str(e.value)
    assert message.startswith("data.train_path = hf://openai/gsm8k: not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE is set" in message
    assert (
        f"`{tool_command('dapo-prepare')} --config RECIPE`" in message
        and "set data.train_path" in message
    )
    assert fake_hub.downloads == []


def test_offline_with_cache_uses_it(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    add_gsm8k(fake_hub)
    first = resolve_data_path("hf://openai/gsm8k", "gsm8k", what="data.train_path")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "offline_reason", lambda env=None: "HF_HUB_OFFLINE is set")
    first.unlink()  # converted again from the cached snapshot, without the network
    assert resolve_data_path("hf://openai/gsm8k", "gsm8k", what="data.train_path") == first
    assert len(fake_hub.downloads) == 1


# ----------------------------------------------------------------------------- OpenMathInstruct-2


def test_openmathinstruct2_problem_and_expected_answer(fake_hub: FakeHub) -> None:
    add_openmath2(fake_hub)
    dataset = load_prompt_file("hf://nvidia/OpenMathInstruct-2", "aime", what="data.train_path")
    # train_1M by default, its shards in order; the repeated problem is kept (NeMo RL keeps it).
    assert [(r.text, r.ground_truth) for r in dataset.records] == [
        ("What is 1+1?", "2"),
        ("Half of 1?", "\\frac{1}{2}"),
        ("What is 1+1?", "2"),
        ("3*3?", "9"),
        ("2^10?", "1024"),
    ]
    assert dataset.records[0].messages == [{"role": "user", "content": "What is 1+1?"}]
    assert dataset.records[3].metadata["problem_source"] == "gsm8k"
    assert "generated_solution" not in dataset.records[0].metadata  # not kept in memory
    assert fake_hub.downloads == [
        ("dataset", "nvidia/OpenMathInstruct-2", ("data/train_1M-*.parquet",))
    ]
    full = load_prompt_file("hf://nvidia/OpenMathInstruct-2:train", "dapo_math")
    assert [(r.text, r.ground_truth) for r in full.records] == [("Full?", "7")]
    with pytest.raises(ConfigError, match="set data.format=aime"):
        resolve_data_path("hf://nvidia/OpenMathInstruct-2", "gsm8k", what="data.train_path")
    with pytest.raises(ConfigError, match="no split 'test'; it has train_1M, train_2M"):
        resolve_data_path("hf://nvidia/OpenMathInstruct-2:test", "aime", what="data.train_path")


def test_openmathinstruct2_as_grpo_math_1b_builds_it(fake_hub: FakeHub) -> None:
    """NeMo RL's grpo_math_1B data block in our keys: OpenMathInstruct-2, 5% -> here 20% of
    the five rows held out with seed 42, the cot.txt prompt around each problem."""
    add_openmath2(fake_hub)
    cfg = data_config(format="aime", train_path="hf://nvidia/OpenMathInstruct-2", val_fraction=0.2)
    splits = build_datasets(cfg, seed=42)
    # ceil(0.2 * 5) = 1 row held out: np.random.default_rng(42).permutation(5) = [4, 2, 3, 1, 0].
    assert splits.val is not None and [r.text for r in splits.val.records] == ["2^10?"]
    assert [r.text for r in splits.train.records] == [  # rows 2, 3, 1, 0
        "What is 1+1?",
        "3*3?",
        "Half of 1?",
        "What is 1+1?",
    ]
    (message,) = apply_prompt_template(splits.val.records[0].messages, NEMO_COT_TEMPLATE)
    text = message["content"]  # the user message encode_prompts puts in the chat template
    assert text == (
        "Think step-by-step to solve the following problem. Output your answer inside of "
        "\\\\boxed{} tags.:\n2^10?\n\nLet's think step-by-step"
    )
