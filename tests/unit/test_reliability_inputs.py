"""Issue 30 case 10: ``--config`` naming a directory, the over-long prompt policy that
configs/dapo_base.yaml documents, and a torn last line of metrics.jsonl (a crash mid-write)
on resume. Real files and a real dapo-train process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.data.datasets import encode_prompts, load_prompt_file
from dapo_megatron.data.file_rows import max_row_bytes
from dapo_megatron.data.tokenizer import load_tokenizer
from dapo_megatron.logging.jsonl import JsonlWriter, read_metrics

REPO = Path(__file__).resolve().parents[2]


def test_config_naming_a_directory_says_so() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dapo_megatron.cli", "--config", "recipes", "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: --config recipes is a directory; pass a recipe YAML file, e.g. "
        "--config recipes/dapo-tiny-cpu.yaml"
    ]


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


def test_a_torn_last_metrics_line_keeps_its_complete_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "metrics.jsonl"
    full = '{"step":4,"time":1.0,"loss":0.5,"val/acc":0.75,"reward/acc":0.5}'
    torn = full[: full.index("reward/acc") + 5]  # killed mid-write
    path.write_text('{"step":3,"time":0.5,"loss":0.6}\n' + torn)
    rows = read_metrics(path)
    assert rows[-1] == {"step": 4, "time": 1.0, "loss": 0.5, "val/acc": 0.75}
    # The resume point (step 5, after the checkpoint of step 4) keeps step 4's row.
    writer = JsonlWriter(path, resume=True)
    writer.write(5, {"loss": 0.4}, wall_time=2.0)
    writer.close()
    assert [r["step"] for r in read_metrics(path)] == [3, 4, 5]
    assert read_metrics(path)[1]["val/acc"] == 0.75
    assert capsys.readouterr().out == (
        f"[metrics] {path}: the last line (step 4) was cut short by a crash: kept its 2 "
        f"complete metric value(s), the rest of the line is lost\n"
    )
