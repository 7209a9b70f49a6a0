"""Tests of dapo_megatron.logging: metrics.jsonl, TensorBoard, W&B/MLflow wiring, progress, plots."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import struct
import subprocess
import sys
import textwrap
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.schema_run import LoggerConfig
from dapo_megatron.logging import (
    METRIC_KEYS,
    MetricsLogger,
    StepProgress,
    keys,
    read_metrics,
    write_plots,
)
from dapo_megatron.logging.progress import format_value
from dapo_megatron.logging.sinks import LOGGER_STATE_FILENAME

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

BASE = LoggerConfig(
    log_dir=None,
    tensorboard_enabled=False,
    wandb_enabled=False,
    wandb_project="dapo-test",
    mlflow_enabled=False,
    mlflow_tracking_uri=None,
    progress_bar=False,
    plots=False,
)


def make_logger(run_dir: Path, *, resume: bool = False, **overrides: Any) -> MetricsLogger:
    return MetricsLogger(replace(BASE, **overrides), run_dir=run_dir, run_name="t", resume=resume)


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


# --- TensorBoard -----------------------------------------------------------------------


def read_tfrecords(path: Path) -> list[bytes]:
    """Records of a TFRecord file, each CRC-checked (the format TensorBoard reads)."""
    from tensorboardX.crc32c import crc32c

    def masked(data: bytes) -> int:
        x = crc32c(data) & 0xFFFFFFFF
        return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    data = path.read_bytes()
    records, pos = [], 0
    while pos < len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        assert header_crc == masked(header)
        payload = data[pos + 12 : pos + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        assert payload_crc == masked(payload)
        records.append(payload)
        pos += 16 + length
    return records


def read_events(log_dir: Path) -> list[Any]:
    from tensorboardX.proto.event_pb2 import Event

    files = sorted(log_dir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {log_dir}"
    events = []
    for file in files:
        for record in read_tfrecords(file):
            event = Event()
            event.ParseFromString(record)
            events.append(event)
    return events


def scalars(events: list[Any]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for event in events:
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    with make_logger(tmp_path, tensorboard_enabled=True) as logger:
        for step in (1, 2, 3):
            logger.log(step, {keys.REWARD_RAW_MEAN: step / 4, keys.LOSS: -float(step)})
        assert logger.tensorboard_dir == tmp_path / "logs" / "tensorboard"
    got = scalars(read_events(tmp_path / "logs" / "tensorboard"))
    assert got[keys.REWARD_RAW_MEAN] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert got[keys.LOSS] == [(1, -1.0), (2, -2.0), (3, -3.0)]


def test_tensorboard_resume_purges_and_log_dir_override(tmp_path):
    log_dir = tmp_path / "elsewhere"
    run_dir = tmp_path / "run"
    with make_logger(run_dir, tensorboard_enabled=True, log_dir=str(log_dir)) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"x": float(step)})
    with make_logger(run_dir, resume=True, tensorboard_enabled=True, log_dir=str(log_dir)) as lg:
        lg.log(2, {"x": 20.0})
    events = read_events(log_dir / "tensorboard")
    # purge_step: TensorBoard hides the first attempt's events at steps >= 2.
    starts = [e.step for e in events if e.HasField("session_log") and e.session_log.status == 1]
    assert starts == [2]
    assert scalars(events)["x"][-1] == (2, 20.0)
    assert not (run_dir / "logs").exists()


# --- W&B and MLflow --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "module"), [("wandb_enabled", "wandb"), ("mlflow_enabled", "mlflow")]
)
def test_missing_optional_package_is_a_config_error(tmp_path, monkeypatch, flag, module):
    # None in sys.modules makes the import fail even where the package is installed.
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError) as info:
        make_logger(tmp_path, **{flag: True})
    message = str(info.value)
    assert f"logger.{flag}" in message
    assert f"pip install {module}" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing half-made


class FakeWandbRun:
    def __init__(self, run_id: str) -> None:
        self.id = run_id
        self.logged: list[tuple[dict[str, float], int]] = []
        self.finished: list[int] = []
        self.fail_log = False

    def log(self, data: dict[str, float], step: int) -> None:
        if self.fail_log:
            raise ConnectionError("wandb backend unreachable")
        self.logged.append((data, step))

    def finish(self, exit_code: int) -> None:
        self.finished.append(exit_code)


def fake_wandb(monkeypatch) -> types.ModuleType:
    module = types.ModuleType("wandb")
    module.inits = []  # type: ignore[attr-defined]
    module.runs = []  # type: ignore[attr-defined]

    def init(**kwargs: Any) -> FakeWandbRun:
        module.inits.append(kwargs)
        run = FakeWandbRun(kwargs.get("id", f"run{len(module.runs)}"))
        module.runs.append(run)
        return run

    module.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_wandb_run_is_logged_finished_and_resumed(tmp_path, monkeypatch):
    wandb = fake_wandb(monkeypatch)
    with make_logger(tmp_path, wandb_enabled=True) as logger:
        logger.log(1, {keys.REWARD_ACC: 0.5})
    assert wandb.inits[0] == {
        "project": "dapo-test",
        "name": "t",
        "dir": str(tmp_path / "logs/wandb"),
    }
    run = wandb.runs[0]
    assert run.logged == [({keys.REWARD_ACC: 0.5}, 1)] and run.finished == [0]
    state = json.loads((tmp_path / LOGGER_STATE_FILENAME).read_text())
    assert state == {"wandb_run_id": "run0"}

    with pytest.raises(KeyError), make_logger(tmp_path, resume=True, wandb_enabled=True):
        raise KeyError("the run crashed")
    assert wandb.inits[1]["id"] == "run0" and wandb.inits[1]["resume"] == "allow"
    assert wandb.runs[1].finished == [1]  # failed run


def test_failing_optional_sink_warns_and_keeps_jsonl(tmp_path, monkeypatch, caplog):
    wandb = fake_wandb(monkeypatch)
    with make_logger(tmp_path, wandb_enabled=True) as logger:
        wandb.runs[0].fail_log = True
        with caplog.at_level("WARNING"):
            logger.log(1, {"x": 1.0})
            logger.log(2, {"x": 2.0})
    warnings = [r.getMessage() for r in caplog.records if "sink wandb failed" in r.getMessage()]
    assert len(warnings) == 1 and "unreachable" in warnings[0]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_mlflow_run_is_logged_ended_and_resumed(tmp_path, monkeypatch):
    calls: list[tuple[str, Any]] = []
    module = types.ModuleType("mlflow")
    module.set_tracking_uri = lambda uri: calls.append(("uri", uri))  # type: ignore[attr-defined]

    def start_run(**kwargs: Any) -> Any:
        calls.append(("start", kwargs))
        info = types.SimpleNamespace(run_id=kwargs.get("run_id", "mlf-1"))
        return types.SimpleNamespace(info=info)

    module.start_run = start_run  # type: ignore[attr-defined]
    module.log_metrics = lambda m, step: calls.append(("log", (m, step)))  # type: ignore[attr-defined]
    module.end_run = lambda status: calls.append(("end", status))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlflow", module)

    uri = f"file://{tmp_path}/mlruns"
    with make_logger(tmp_path, mlflow_enabled=True, mlflow_tracking_uri=uri) as logger:
        logger.log(7, {keys.LOSS: 0.125})
    assert calls == [
        ("uri", uri),
        ("start", {"run_name": "t"}),
        ("log", ({keys.LOSS: 0.125}, 7)),
        ("end", "FINISHED"),
    ]
    calls.clear()
    with make_logger(tmp_path, resume=True, mlflow_enabled=True):
        pass
    assert calls == [("start", {"run_id": "mlf-1"}), ("end", "FINISHED")]


# --- progress --------------------------------------------------------------------------


def test_progress_disabled_prints_one_line_per_step(capsys):
    headline = [keys.REWARD_RAW_MEAN, keys.REWARD_ACC, keys.RESPONSE_LENGTH_MEAN, "custom/x"]
    with StepProgress(10, start_step=2, enabled=False, headline=headline) as progress:
        assert not progress.uses_bar
        for step in (3, 4, 5):
            progress.update(
                step,
                {
                    keys.REWARD_RAW_MEAN: step / 10,
                    keys.REWARD_ACC: 0.4302,
                    keys.RESPONSE_LENGTH_MEAN: 812.4,
                    "custom/x": math.nan,
                    keys.LOSS: 9.0,  # not a headline metric
                },
            )
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 3
    for step, line in zip((3, 4, 5), lines, strict=True):
        assert line.startswith(f"step {step}/10 reward={step / 10:.3g} acc=0.43 len=812 ")
        assert "custom/x=nan" in line and "loss" not in line
        assert "elapsed=" in line and "eta=" in line


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    piped = io.StringIO()
    with StepProgress(5, start_step=0, enabled=True, stream=piped) as progress:
        assert not progress.uses_bar  # a log file gets lines, not carriage returns
        progress.update(1, {keys.REWARD_ACC: 0.5})
    assert piped.getvalue().startswith("step 1/5 acc=0.5 ")

    terminal = FakeTerminal()
    with StepProgress(5, start_step=1, enabled=True, stream=terminal) as progress:
        assert progress.uses_bar
        progress.update(3, {keys.REWARD_ACC: 0.75, keys.STEP_TIME_S: 31.25})
        progress.write("validation done")
    out = terminal.getvalue()
    assert "3/5" in out and "acc=0.75" in out and "step_s=31.2" in out
    assert "validation done" in out


def bar_screens(text: str) -> list[str]:
    """What a terminal shows for each redraw of a bar: the segments between carriage returns."""
    return [seg for seg in text.replace("\n", "\r").split("\r") if seg.strip()]


def test_step_line_shows_validation_only_when_measured(capsys):
    with StepProgress(20, start_step=0, enabled=False) as progress:
        progress.update(9, {keys.REWARD_ACC: 0.5, keys.DS_KEEP_RATE: 0.75})
        progress.update(
            10,
            {
                keys.REWARD_ACC: 0.5,
                keys.VAL_ACC: 0.6175,
                keys.VAL_ACC_STDERR: 0.02431,
                keys.DS_KEEP_RATE: 0.75,
            },
        )
        progress.update(11, {keys.REWARD_ACC: 0.5, keys.VAL_ACC: 0.25})  # stderr unknown
    lines = capsys.readouterr().err.splitlines()
    assert "val_acc" not in lines[0]
    assert lines[0].startswith("step 9/20 acc=0.5 keep=0.75 elapsed=")
    assert lines[1].startswith("step 10/20 acc=0.5 val_acc=0.618±0.024 keep=0.75 elapsed=")
    assert lines[2].startswith("step 11/20 acc=0.5 val_acc=0.25 elapsed=")


def test_reward_column_is_dropped_only_when_it_equals_acc(capsys):
    with StepProgress(2, start_step=0, enabled=False) as progress:
        # A 0/1 verifier: the mean score is the accuracy; one column says it.
        progress.update(1, {keys.REWARD_RAW_MEAN: 0.375, keys.REWARD_ACC: 0.375})
        # Partial credit: the two differ, both show.
        progress.update(2, {keys.REWARD_RAW_MEAN: 0.5, keys.REWARD_ACC: 0.375})
    first, second = capsys.readouterr().err.splitlines()
    assert first.startswith("step 1/2 acc=0.375 elapsed=") and "reward" not in first
    assert second.startswith("step 2/2 reward=0.5 acc=0.375 elapsed=")


def test_sft_lines_every_n_steps_and_at_the_last():
    out = io.StringIO()
    with StepProgress(
        25,
        start_step=0,
        enabled=True,  # not a terminal: lines, never carriage returns
        headline=(keys.SFT_NLL,),
        name="sft warm-up",
        line_every=10,
        stream=out,
    ) as progress:
        for step in range(1, 26):
            progress.update(step, {keys.SFT_NLL: 4.0 / step})
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [line.split(" nll=")[0] for line in lines] == [
        "sft warm-up 10/25",
        "sft warm-up 20/25",
        "sft warm-up 25/25",
    ]
    assert lines[0].startswith("sft warm-up 10/25 nll=0.4 elapsed=") and "eta=" in lines[0]


class SizedTerminal(FakeTerminal):
    """A terminal whose descriptor reports a size (os.get_terminal_size is patched)."""

    def fileno(self) -> int:
        return 2


@pytest.mark.parametrize("reported", [None, (0, 0)], ids=["no-size", "pty-0x0"])
def test_bar_shows_under_a_terminal_of_unknown_width(monkeypatch, reported):
    monkeypatch.delenv("COLUMNS", raising=False)
    terminal: FakeTerminal = FakeTerminal()
    if reported is not None:
        # `script` without a controlling terminal, some CI runners: a pty of 0 x 0.
        monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size(reported))
        terminal = SizedTerminal()
    long_metrics = {
        keys.REWARD_ACC: 0.75,
        keys.VAL_ACC: 0.5,
        keys.VAL_ACC_STDERR: 0.01,
        keys.DS_KEEP_RATE: 0.5,
        keys.RESPONSE_LENGTH_MEAN: 812.0,
        keys.STEP_TIME_S: 31.25,
        keys.REWARD_RAW_MEAN: 0.6,
    }
    with StepProgress(4, start_step=0, enabled=True, stream=terminal) as progress:
        assert progress.uses_bar
        progress.update(2, long_metrics)
    screens = bar_screens(terminal.getvalue())
    assert screens, "the bar drew nothing"
    last = screens[-1]
    assert last.startswith("step 2/4 |") and "acc=0.75" in last
    bar = last.split("|")[1]
    assert len(bar) == 16 and bar.strip(), last  # a visible, half-filled bar
    # A fixed width: a redraw never wraps onto a second line that \r cannot erase.
    assert all(len(s) <= 80 for s in screens)


def test_bar_keeps_the_last_validation_in_view():
    terminal = FakeTerminal()
    with StepProgress(20, start_step=0, enabled=True, stream=terminal) as progress:
        progress.update(10, {keys.REWARD_ACC: 0.5, keys.VAL_ACC: 0.625, keys.VAL_ACC_STDERR: 0.02})
        progress.update(11, {keys.REWARD_ACC: 0.55})
    last = bar_screens(terminal.getvalue())[-1]
    assert "acc=0.55 val_acc@10=0.625±0.02" in last


def test_format_value():
    assert [format_value(v) for v in (812.4, 0.4302, 31.25, 1e-6, math.inf)] == [
        "812",
        "0.43",
        "31.2",
        "1e-06",
        "inf",
    ]


# --- summary, related commands, worker logs ----------------------------------------------


def test_summary_names_steps_time_validation_and_paths(tmp_path):
    from dapo_megatron.logging import format_summary

    rows = [
        {"step": 0, keys.VAL_ACC: 0.0725, keys.VAL_ACC_STDERR: 0.0131},
        {"step": 1, keys.REWARD_ACC: 0.2},
        {"step": 2, keys.REWARD_ACC: 0.5, keys.VAL_ACC: 0.96, keys.VAL_ACC_STDERR: 0.00981},
        {"step": 3, keys.REWARD_ACC: 0.6},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = format_summary(
        tmp_path,
        total_steps=3,
        wall_s=754.4,
        checkpoint=tmp_path / "checkpoints" / "step_000003",
        export=tmp_path / "hf" / "step_000003",
        plots=tmp_path / "plots",
        worker_logs=tmp_path / "logs" / "workers",
    )
    assert text.splitlines() == [
        "dapo-train: finished 3/3 steps in 0:12:34",
        "  validation accuracy  0.96 ± 0.0098 at step 2 (0.0725 ± 0.013 before training)",
        f"  last checkpoint      {tmp_path}/checkpoints/step_000003",
        f"  Hugging Face export  {tmp_path}/hf/step_000003",
        f"  metrics and plots    {tmp_path}/metrics.jsonl, {tmp_path}/plots",
        f"  worker logs          {tmp_path}/logs/workers",
    ]
    assert "{" not in text  # no Python dict


def test_summary_without_validation_checkpoint_or_export(tmp_path):
    from dapo_megatron.logging import format_summary

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, keys.LOSS: 0.1}) + "\n")
    text = format_summary(tmp_path, total_steps=1, wall_s=5, checkpoint=None, export=None)
    assert text.splitlines() == [
        "dapo-train: finished 1/1 steps in 0:00:05",
        "  last checkpoint      none saved",
        f"  metrics              {tmp_path}/metrics.jsonl",
    ]


def test_train_help_names_the_related_commands(capsys):
    from dapo_megatron.cli import train_main

    with pytest.raises(SystemExit) as exited:
        train_main(["--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    related = help_text.split("related commands:")[1]
    for command in ("dapo-plan", "dapo-prepare", "dapo-import-config", "dapo-export"):
        assert f"\n  {command} " in related, command


def test_worker_output_stays_put_outside_a_ray_actor(tmp_path):
    from dapo_megatron.logging import redirect_worker_output

    assert redirect_worker_output(tmp_path, "policy_rank0") is None  # pytest's own output
    assert not (tmp_path / "logs").exists()


def test_worker_output_goes_to_its_file_in_an_actor(tmp_path):
    """In an actor, Python's and C-level (fd) output of the process lands in the file."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from dapo_megatron.logging import worker_logs
        worker_logs.in_ray_actor = lambda: True  # what a Ray actor's process sees
        print("before")
        path = worker_logs.redirect_worker_output(Path({str(tmp_path)!r}), "policy_rank1")
        print("megatron says hello")
        print("a warning", file=sys.stderr)
        os.write(2, b"from C\\n")
        sys.stdout.flush()
        assert path is not None and path.name == "policy_rank1.log"
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "before\n" and proc.stderr == ""
    log = (tmp_path / "logs" / "workers" / "policy_rank1.log").read_text()
    assert log.splitlines() == ["megatron says hello", "a warning", "from C"]


def test_sft_steps_have_their_own_file_and_plot(tmp_path):
    with make_logger(tmp_path, plots=True) as logger:
        for step in range(1, 4):
            logger.log_sft(step, {keys.SFT_NLL: 3.0 / step})
        logger.log(0, {keys.VAL_ACC: 0.1})
    sft = read_metrics(tmp_path / "sft_metrics.jsonl")
    assert [r["step"] for r in sft] == [1, 2, 3] and sft[0][keys.SFT_NLL] == 3.0
    assert keys.SFT_NLL not in read_metrics(tmp_path / "metrics.jsonl")[0]
    assert "sft_warmup.png" in os.listdir(tmp_path / "plots")


# --- plots -----------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def write_synthetic_run(path: Path, steps: int = 30) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for step in range(1, steps + 1):
            row: dict[str, Any] = {"step": step, "time": 1000.0 + step}
            for i, key in enumerate(METRIC_KEYS):
                row[key] = math.sin(step / 5 + i)
            row[keys.GRAD_NORM] = None if step == 7 else 1.0  # a NaN point
            if step % 10:
                del row[keys.VAL_ACC]  # validation every 10 steps only
            f.write(json.dumps(row) + "\n")


def test_write_plots_draws_every_figure_as_png_with_agg(tmp_path, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    agg_writes: list[str] = []
    real_print_png = FigureCanvasAgg.print_png

    # matplotlib passes extra savefig kwargs (orientation, ...) to print methods that are
    # not its own; the real one does not take them.
    def spy(self: FigureCanvasAgg, target: Any, *, metadata: Any = None, **_: Any) -> Any:
        if not isinstance(target, io.IOBase):  # constrained layout renders to a buffer first
            agg_writes.append(str(target))
        return real_print_png(self, target, metadata=metadata)

    monkeypatch.setattr(FigureCanvasAgg, "print_png", spy)
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    write_synthetic_run(metrics)
    written = write_plots(metrics, tmp_path / "plots")
    assert sorted(p.name for p in written) == [
        "accuracy.png",
        "dynamic_sampling.png",
        "optimization.png",
        "response_length.png",
        "reward.png",
        "step_time.png",
    ]
    for path in written:
        width, height = png_size(path)
        assert width >= 400 and height >= 200
    assert sorted(Path(w).name for w in agg_writes) == sorted(p.name + ".tmp" for p in written)
    assert sorted(os.listdir(tmp_path / "plots")) == sorted(p.name for p in written)


def test_write_plots_skips_missing_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(
            json.dumps({"step": s, keys.REWARD_RAW_MEAN: s / 10, keys.VAL_ACC: None}) + "\n"
            for s in range(1, 4)
        ),
        encoding="utf-8",
    )
    assert [p.name for p in write_plots(metrics, tmp_path / "plots")] == ["reward.png"]
    metrics.write_text("", encoding="utf-8")
    assert write_plots(metrics, tmp_path / "empty") == []


def test_logger_close_writes_plots_when_enabled(tmp_path):
    with make_logger(tmp_path, plots=True) as logger:
        for step in (1, 2):
            logger.log(step, {keys.DS_KEEP_RATE: 0.5 * step})
    assert png_size(tmp_path / "plots" / "dynamic_sampling.png")[0] > 0
    assert sorted(os.listdir(tmp_path / "plots")) == ["dynamic_sampling.png"]


def test_failed_construction_closes_what_it_opened(tmp_path, monkeypatch):
    wandb = fake_wandb(monkeypatch)
    module = types.ModuleType("mlflow")

    def start_run(**kwargs: Any) -> Any:
        raise ConnectionError("connection refused")

    module.start_run = start_run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlflow", module)
    with pytest.raises(RuntimeError, match=r"logger\.mlflow_enabled.*connection refused"):
        make_logger(tmp_path, wandb_enabled=True, mlflow_enabled=True)
    assert wandb.runs[0].finished == [1]  # the W&B run is not left open
    assert not (tmp_path / LOGGER_STATE_FILENAME).exists()
