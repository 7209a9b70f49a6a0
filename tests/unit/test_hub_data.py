"""Hub datasets (``hf://Org/Name``) and hub models (``Org/Name``) against a local fake hub.

The fake hub is a folder of repositories in tmp_path, in the published column layouts of
DAPO-Math-17k, AIME-2024, GSM8K and MATH-500 (tiny files). `hub.download_snapshot`, the one
function that talks to the hub, is replaced by a copy from that folder into an HF cache laid
out as huggingface_hub lays it out (``datasets--Org--Name/refs/main``,
``snapshots/<commit>/...``); the network is never asked. Other test modules import
`fake_hub` and the writers from here.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_megatron.config import model_source
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.data import hub
from dapo_megatron.data.datasets import load_prompt_file
from dapo_megatron.data.hub_datasets import parse_hf_uri, resolve_data_path
from dapo_megatron.data.tiny_model import create_tiny_model

REAL_OFFLINE_REASON = hub.offline_reason
"""The real check (the fixture replaces it with "online"), for the offline tests."""
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should "
    "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
    "problem.\n\n"
)


@dataclass
class FakeHub:
    """Repositories under ``root/<type>/<Org>/<Name>/`` and the downloads asked of them."""

    root: Path
    cache: Path
    downloads: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)

    def repo(self, repo_type: str, repo_id: str) -> Path:
        path = self.root / repo_type / repo_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def download(self, repo_id: str, repo_type: str, allow_patterns: Any, cache_dir: Path) -> Path:
        """Stands in for hub.download_snapshot: copy the matching files into the cache."""
        self.downloads.append((repo_type, repo_id, tuple(allow_patterns)))
        source = self.root / repo_type / repo_id
        if not source.is_dir():
            raise RuntimeError(f"404 Client Error. Repository Not Found for url: {repo_id}")
        repo_dir = cache_dir / f"{repo_type}s--{repo_id.replace('/', '--')}"
        snapshot = repo_dir / "snapshots" / COMMIT
        for file in source.rglob("*"):
            name = file.relative_to(source).as_posix()
            if file.is_file() and any(fnmatch(name, p) for p in allow_patterns):
                (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(file, snapshot / name)
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text(COMMIT)
        return snapshot


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    """An online fake hub and an empty HF cache in tmp_path."""
    fake = FakeHub(tmp_path / "hub", tmp_path / "hf-cache")
    monkeypatch.setenv("HF_HUB_CACHE", str(fake.cache))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DAPO_MEGATRON_DATA_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub, "download_snapshot", fake.download)
    monkeypatch.setattr(hub, "offline_reason", lambda env=None: None)

    def fetch_config(repo_id: str) -> Path | None:
        # model_source's config.json lookup (validation) asks the same fake hub.
        try:
            return fake.download(repo_id, "model", ["config.json"], fake.cache) / "config.json"
        except RuntimeError:
            return None

    monkeypatch.setattr(model_source, "fetch_hub_config", fetch_config)
    return fake


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def dapo_row(problem: str, answer: str, source: str = "math_dapo") -> dict[str, Any]:
    """A row in DAPO-Math-17k's (and BytedTsinghua-SIA/AIME-2024's) published columns."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": DAPO_INSTRUCTION + problem}],
        "ability": "MATH",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": "x"},
    }


def add_dapo_math(fake: FakeHub) -> None:
    rows = [dapo_row("1+1?", "2"), dapo_row("2+3?", "5")] * 3  # repeated like the real file
    write_parquet(
        fake.repo("dataset", "BytedTsinghua-SIA/DAPO-Math-17k") / "data/dapo-math-17k.parquet", rows
    )


def add_aime(fake: FakeHub) -> None:
    rows = [dapo_row("AIME 1", "204", "math_aime")] * 2
    write_parquet(
        fake.repo("dataset", "BytedTsinghua-SIA/AIME-2024") / "data/aime-2024.parquet", rows
    )


def add_gsm8k(fake: FakeHub) -> None:
    repo = fake.repo("dataset", "openai/gsm8k")
    write_parquet(
        repo / "main/train-00000-of-00001.parquet",
        [{"question": "3 + 4?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}],
    )
    write_parquet(
        repo / "main/test-00000-of-00001.parquet",
        [
            {"question": "Cost?", "answer": "It costs 1,200\n#### 1,200"},
            {"question": "No final?", "answer": "no marker"},
        ],
    )
    write_parquet(
        repo / "socratic/train-00000-of-00001.parquet", [{"question": "s", "answer": "#### 1"}]
    )


def add_math500(fake: FakeHub) -> None:
    write_jsonl(
        fake.repo("dataset", "HuggingFaceH4/MATH-500") / "test.jsonl",
        [
            {
                "problem": "What is $\\frac{1}{2}+\\frac{1}{2}$?",
                "solution": "It is $\\boxed{1}$.",
                "answer": "1",
                "subject": "Algebra",
                "level": 1,
                "unique_id": "test/algebra/1.json",
            }
        ],
    )


def add_model(fake: FakeHub, repo_id: str = "fake-org/Tiny-Model") -> Path:
    """A complete tiny checkpoint (config, safetensors, tokenizer) as a hub repository."""
    return create_tiny_model(fake.repo("model", repo_id), seed=0)


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
    assert "`dapo-prepare --config RECIPE`" in message and "set data.train_path" in message
    assert fake_hub.downloads == []


def test_offline_with_cache_uses_it(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    add_gsm8k(fake_hub)
    first = resolve_data_path("hf://openai/gsm8k", "gsm8k", what="data.train_path")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "offline_reason", lambda env=None: "HF_HUB_OFFLINE is set")
    first.unlink()  # converted again from the cached snapshot, without the network
    assert resolve_data_path("hf://openai/gsm8k", "gsm8k", what="data.train_path") == first
    assert len(fake_hub.downloads) == 1


# ----------------------------------------------------------------------------- models


def test_hub_model_is_downloaded_complete_once(fake_hub: FakeHub) -> None:
    add_model(fake_hub)
    snapshot = hub.fetch_model("fake-org/Tiny-Model", what="policy.model_name_or_path")
    assert (snapshot / "config.json").is_file() and (snapshot / "model.safetensors").is_file()
    assert (snapshot / "tokenizer.json").is_file()
    assert hub.fetch_model("fake-org/Tiny-Model", what="k") == snapshot
    assert len(fake_hub.downloads) == 1  # the second found it complete in the cache


def test_incomplete_cached_model_is_downloaded_again(fake_hub: FakeHub) -> None:
    add_model(fake_hub)
    # Validation fetched config.json alone: not a model a run can load.
    fake_hub.download("fake-org/Tiny-Model", "model", ["config.json"], fake_hub.cache)
    snapshot = hub.fetch_model("fake-org/Tiny-Model", what="k")
    assert hub.model_snapshot_complete(snapshot)


def test_local_looking_paths_are_not_hub_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert hub.is_hub_model_id("Qwen/Qwen3-8B")
    (tmp_path / "models").mkdir()
    assert not hub.is_hub_model_id("models/Qwen3-8B")  # a local folder to be filled
    assert not hub.is_hub_model_id("/abs/Qwen3-8B") and not hub.is_hub_model_id("a/b/c")
