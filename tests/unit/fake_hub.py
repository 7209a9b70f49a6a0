"""A local fake Hugging Face hub for the hub tests (import: ``unit.fake_hub``).

The fake hub is a folder of repositories in tmp_path, in the published column layouts of
DAPO-Math-17k, AIME-2024, GSM8K, MATH-500 and OpenMathInstruct-2 (tiny files).
`hub.download_snapshot`, the one function that talks to the hub, is replaced by a copy from
that folder into an HF cache laid out as huggingface_hub lays it out
(``datasets--Org--Name/refs/main``, ``snapshots/<commit>/...``); the network is never
asked. Test modules import the `fake_hub` fixture and the writers from here."""

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
from dapo_megatron.data import hub
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


def openmath2_row(problem: str, answer: str, source: str = "augmented_math") -> dict[str, Any]:
    """A row in nvidia/OpenMathInstruct-2's published columns."""
    return {
        "problem": problem,
        "generated_solution": f"Long worked solution of {problem} ... $\\boxed{{{answer}}}$",
        "expected_answer": answer,
        "problem_source": source,
    }


def add_openmath2(fake: FakeHub) -> None:
    """train_1M in two shards (5 rows, one problem twice, as the real split repeats
    problems with other solutions) and a one-row train split."""
    repo = fake.repo("dataset", "nvidia/OpenMathInstruct-2")
    write_parquet(
        repo / "data/train_1M-00000-of-00002.parquet",
        [openmath2_row("What is 1+1?", "2", "math"), openmath2_row("Half of 1?", "\\frac{1}{2}")],
    )
    write_parquet(
        repo / "data/train_1M-00001-of-00002.parquet",
        [
            openmath2_row("What is 1+1?", "2", "math"),
            openmath2_row("3*3?", "9", "gsm8k"),
            openmath2_row("2^10?", "1024"),
        ],
    )
    write_parquet(repo / "data/train-00000-of-00001.parquet", [openmath2_row("Full?", "7")])


def add_model(fake: FakeHub, repo_id: str = "fake-org/Tiny-Model") -> Path:
    """A complete tiny checkpoint (config, safetensors, tokenizer) as a hub repository."""
    return create_tiny_model(fake.repo("model", repo_id), seed=0)
