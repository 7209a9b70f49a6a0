"""The guard that keeps tests off the checkout's runs/ (tests/conftest.py): the main job's
run directory there is the user's, and CI runs that job before the tests."""

from __future__ import annotations

import os
from pathlib import Path

from checkout_guard import REPO, runs_changes, runs_snapshot


def test_each_test_runs_outside_the_checkout() -> None:
    # A recipe's relative run.output_dir (runs/...) resolves here, never in the checkout.
    assert not Path.cwd().resolve().is_relative_to(REPO)


def test_the_snapshot_sees_a_file_created_changed_or_removed(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    (root / "dapo-tiny-cpu" / "model").mkdir(parents=True)
    config = root / "dapo-tiny-cpu" / "model" / "config.json"
    config.write_text("{}")
    before = runs_snapshot(root)
    assert runs_changes(before, runs_snapshot(root)) == []

    (root / "dapo-tiny-cpu" / "metrics.jsonl").write_text("{}\n")
    config.write_text('{"model_type": "qwen3"}')
    after = runs_snapshot(root)
    # The directory that gained a file changed too (its mtime).
    assert runs_changes(before, after) == [
        "dapo-tiny-cpu",
        "dapo-tiny-cpu/metrics.jsonl",
        "dapo-tiny-cpu/model/config.json",
    ]
    config.unlink()
    assert "dapo-tiny-cpu/model/config.json" in runs_changes(after, runs_snapshot(root))


def test_a_missing_runs_directory_is_an_empty_snapshot(tmp_path: Path) -> None:
    assert runs_snapshot(tmp_path / "absent") == {}
    assert os.path.exists(tmp_path)
