"""The optional sinks (logging/sinks.py): TensorBoard event files, W&B and MLflow runs
(stand-ins), missing packages and failing sinks."""

from __future__ import annotations

import json
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.logging import keys, read_metrics
from dapo_megatron.logging.sinks import LOGGER_STATE_FILENAME
from unit.logging.loggers import make_logger

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
