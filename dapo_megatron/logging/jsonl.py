"""metrics.jsonl: the always-on, crash-safe record of a run's metrics.

One JSON object per line, ``{"step": N, "time": <unix seconds>, "<metric>": value, ...}``.
Every line is flushed and fsynced before ``write`` returns, so a SIGKILL (OOM killer,
preemption, Ray tearing down the job) loses at most the rest of the line being written. A
truncated last line is not dropped silently: its complete ``"key": value`` pairs are kept
(``salvage_record``; a step's validation is merged into its one row, so dropping the line
would lose the step), and the reader and the resume each say what was cut.

Non-finite floats are written as ``null``: bare ``NaN``/``Infinity`` are not JSON, and jq,
pandas and JavaScript dashboards reject files that contain them. ``read_metrics`` turns
``null`` back into NaN (inf is not recoverable; it is equally "not a usable number").

Resume: the controller restarts from its last checkpoint, which is usually older than the
last logged step. The first step logged after a resume is taken as the resume point and
every line with ``step >= `` it is dropped first (atomic rewrite), so the file never holds
two different values for one step.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

__all__ = [
    "METRICS_FILENAME",
    "SFT_METRICS_FILENAME",
    "JsonlWriter",
    "read_metrics",
    "to_float_metrics",
]

METRICS_FILENAME = "metrics.jsonl"
SFT_METRICS_FILENAME = "sft_metrics.jsonl"
"""The SFT warm-up's steps, in a file of their own: its step numbers are not DAPO steps
(step 0 of metrics.jsonl is the validation before training), and its one curve is
plotted on its own axis (``plots.py``)."""
RESERVED_KEYS = frozenset({"step", "time"})

_log = logging.getLogger(__name__)


def to_float_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Check metric names and convert every value to a Python float.

    Accepts anything with ``__float__`` (int, numpy scalars, 0-d torch tensors), so the
    controller need not ``.item()`` each value, and fails here with the key's name rather
    than deep inside a sink.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"metric names must be non-empty strings, got {key!r}")
        if key in RESERVED_KEYS:
            raise ValueError(f"metric name {key!r} is reserved by metrics.jsonl")
        try:
            out[key] = float(value)
        except (TypeError, ValueError) as err:
            raise TypeError(f"metric {key!r} is not a number: {value!r}") from err
    return out


def _json_value(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is; not supported everywhere.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _parse_line(line: str) -> dict[str, Any] | None:
    """A record, or None if the line is not a JSON object with an integer step."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or type(record.get("step")) is not int:
        return None
    return record


def salvage_record(line: str) -> dict[str, Any] | None:
    """The complete part of a line cut short by a crash: the longest prefix that ends
    after a whole ``"key": value`` pair, closed as an object; None when no metric value
    survived (only the step and time: nothing to keep). (Lines are written as one compact
    JSON object, step and time first.)"""
    end = len(line)
    while (end := line.rfind(",", 0, end)) > 0:
        record = _parse_line(line[:end] + "}")
        if record is not None:
            return record if set(record) - RESERVED_KEYS else None
    return None


def _torn_note(path: Path, record: dict[str, Any] | None) -> str:
    if record is None:
        return (
            f"{path}: its last line was cut short by a crash before any complete metric "
            f"value: dropped"
        )
    return (
        f"{path}: the last line (step {record['step']}) was cut short by a crash: kept its "
        f"{len(set(record) - RESERVED_KEYS)} complete metric value(s), the rest of the line "
        f"is lost"
    )


def _drop_steps_from(path: Path, first_step: int) -> None:
    """Rewrite ``path`` atomically without lines whose step is ``>= first_step``."""
    if not path.exists():
        return
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    kept: list[str] = []
    unreadable = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = _parse_line(line)
        if record is None and lineno == len(lines) and not text.endswith("\n"):
            # Cut short by a crash: keep what was complete, and say so.
            record = salvage_record(line)
            print(f"[metrics] {_torn_note(path, record)}", flush=True)
            if record is not None:
                line = json.dumps(record, allow_nan=False, separators=(",", ":"))
        if record is None:
            unreadable += 1
            continue
        if record["step"] < first_step:
            kept.append(line)
    if unreadable:
        _log.warning("%s: dropped %d unreadable line(s) while resuming", path, unreadable)
    if len(kept) == len(lines) and (not text or text.endswith("\n")):
        return  # nothing to drop: avoid rewriting a long file on every restart
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class JsonlWriter:
    """Appends one fsynced line per ``write`` to a metrics.jsonl file.

    ``resume=False`` starts the file afresh (truncating any old one: whether a run
    directory may be reused is the controller's decision). ``resume=True`` keeps the old
    lines and drops those at or after the first step written (see the module docstring).
    """

    def __init__(self, path: Path, *, resume: bool) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The file stays open across writes (closed in close()), hence no `with` below.
        self._file: IO[str] | None = None
        self._closed = False
        if not resume:
            self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115

    def write(self, step: int, metrics: Mapping[str, float], *, wall_time: float) -> None:
        """Append the line of ``step`` and make it durable before returning."""
        if self._closed:
            raise RuntimeError(f"{self.path}: write after close")
        if self._file is None:
            _drop_steps_from(self.path, step)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        record: dict[str, Any] = {"step": step, "time": round(wall_time, 3)}
        record.update((key, _json_value(value)) for key, value in metrics.items())
        # One write call per line keeps a crash from interleaving half-lines.
        self._file.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file; idempotent."""
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: Path | str) -> list[dict[str, float]]:
    """Read a metrics.jsonl file into one dict per step, in file order.

    ``null`` values become NaN; ``step`` stays an int. Lines of the same step (a caller
    that logged a step in two calls) are merged, later values winning. A truncated last
    line (crash mid-write) keeps its complete values, with a warning; any other
    unreadable line raises ``ValueError``.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out: list[dict[str, float]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = _parse_line(line)
        if record is None:
            if lineno == len(lines) and not text.endswith("\n"):
                record = salvage_record(line)
                _log.warning("%s", _torn_note(path, record))
                if record is None:
                    break
            else:
                raise ValueError(f"{path}:{lineno}: not a metrics record: {line[:80]!r}")
        row = {key: math.nan if value is None else value for key, value in record.items()}
        if out and out[-1]["step"] == row["step"]:
            out[-1].update(row)
        else:
            out.append(row)
    return out
