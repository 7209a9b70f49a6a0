"""metrics.jsonl (logging/jsonl.py): one durable line per step, non-finite values, resume,
torn and corrupt lines."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from dapo_megatron.logging import keys
from dapo_megatron.logging.jsonl import JsonlWriter, read_metrics
from unit.logging.loggers import make_logger

REPO_ROOT = Path(__file__).resolve().parents[3]


def reject_constant(name: str) -> None:
    raise AssertionError(f"metrics.jsonl holds the non-JSON constant {name}")


def strict_lines(path: Path) -> list[dict[str, Any]]:
    """Parse every line as strict JSON (NaN/Infinity literals fail)."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line, parse_constant=reject_constant) for line in text.splitlines()]


# --- metrics.jsonl ---------------------------------------------------------------------


def test_jsonl_one_durable_line_per_step_while_open(tmp_path, monkeypatch):
    fsynced: list[int] = []
    real_fsync = os.fsync

    def spy_fsync(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    with make_logger(tmp_path) as logger:
        logger.log(1, {keys.REWARD_RAW_MEAN: 0.25, keys.LOSS: 1.5})
        # Read by a second handle while the logger is still open: the line is already there.
        lines = strict_lines(tmp_path / "metrics.jsonl")
        assert len(lines) == 1
        assert lines[0]["step"] == 1
        assert lines[0][keys.REWARD_RAW_MEAN] == 0.25 and lines[0][keys.LOSS] == 1.5
        assert isinstance(lines[0]["time"], float)
        assert len(fsynced) == 1
        logger.log(2, {keys.REWARD_RAW_MEAN: 0.5})
        assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
        assert len(fsynced) == 2
    assert logger.metrics_path == tmp_path / "metrics.jsonl"


def test_jsonl_survives_sigkill(tmp_path):
    """A SIGKILLed process keeps every line written before the kill."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from dapo_megatron.config.schema_run import LoggerConfig
        from dapo_megatron.logging import MetricsLogger
        cfg = LoggerConfig(None, False, False, "p", False, None, False, False)
        logger = MetricsLogger(cfg, run_dir=Path({str(tmp_path)!r}), run_name="k", resume=False)
        for step in range(1, 6):
            logger.log(step, {{"reward/acc": step / 10}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[-1][keys.REWARD_ACC] == pytest.approx(0.5)


def test_non_finite_values_are_null_and_read_back_as_nan(tmp_path):
    with make_logger(tmp_path) as logger:
        logger.log(
            3,
            {
                "a": math.nan,
                "b": math.inf,
                "c": -math.inf,
                "d": 1.5,
                "tensor": torch.tensor(0.5),  # 0-d tensors and ints need no .item()
                "int": 7,
            },
        )
    (line,) = strict_lines(tmp_path / "metrics.jsonl")
    assert line["a"] is None and line["b"] is None and line["c"] is None
    assert line["d"] == 1.5 and line["tensor"] == 0.5 and line["int"] == 7.0
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert all(math.isnan(row[k]) for k in ("a", "b", "c"))
    assert row["d"] == 1.5 and row["step"] == 3


def test_log_rejects_bad_input(tmp_path):
    with make_logger(tmp_path) as logger:
        with pytest.raises(TypeError, match="'reward/acc' is not a number"):
            logger.log(1, {keys.REWARD_ACC: "high"})
        with pytest.raises(ValueError, match="reserved"):
            logger.log(1, {"step": 1.0})
        with pytest.raises(TypeError, match="non-negative int"):
            logger.log(1.0, {})  # type: ignore[arg-type]
        logger.log(5, {"x": 1.0})
        with pytest.raises(ValueError, match="step 4 logged after step 5"):
            logger.log(4, {"x": 1.0})
    with pytest.raises(RuntimeError, match="after close"):
        logger.log(6, {"x": 1.0})


def test_same_step_twice_is_merged_by_reader(tmp_path):
    with make_logger(tmp_path) as logger:
        logger.log(1, {keys.REWARD_ACC: 0.5})
        logger.log(1, {keys.VAL_ACC: 0.25})
        logger.log(2, {keys.REWARD_ACC: 0.75})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0][keys.REWARD_ACC] == 0.5 and rows[0][keys.VAL_ACC] == 0.25


def test_resume_drops_steps_at_and_after_the_resume_point(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with make_logger(tmp_path) as logger:
        for step in range(1, 6):
            logger.log(step, {"x": float(step)})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 6, "x": 6.')  # a crash in the middle of a line
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5]

    with make_logger(tmp_path, resume=True) as logger:
        # Nothing is dropped until the resume point is known.
        assert path.read_text(encoding="utf-8").endswith('"x": 6.')
        logger.log(4, {"x": 40.0})
        logger.log(5, {"x": 50.0})
    lines = strict_lines(path)
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]
    assert [line["x"] for line in lines] == [1.0, 2.0, 3.0, 40.0, 50.0]
    assert not path.with_name("metrics.jsonl.tmp").exists()

    # A fresh (non-resumed) run starts the file over.
    with make_logger(tmp_path) as logger:
        logger.log(1, {"x": -1.0})
    assert [line["x"] for line in strict_lines(path)] == [-1.0]


def test_read_metrics_rejects_a_corrupt_middle_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\nnot json\n{"step": 2, "x": 2}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(path)


# ---------------------------------------------------------------------------------------
# Issue 30 case 10: a torn last line of metrics.jsonl (a crash mid-write) on resume.


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
