"""bench/compare_runs.py: two runs' metrics compared exactly, wall-clock keys left out."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).resolve().parents[3] / "bench" / "compare_runs.py"
_spec = importlib.util.spec_from_file_location("compare_runs_bench", _PATH)
assert _spec is not None and _spec.loader is not None
compare_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_runs)


def _run(path: Path, rows: list[dict]) -> Path:
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROW = {"step": 1, "time": 1.0, "loss": 0.25, "timing/step_s": 0.5, "tokens_per_s": 9.0}


def test_equal_runs_differ_only_in_wall_clock_keys(tmp_path, capsys):
    a = _run(tmp_path / "a", [ROW, {**ROW, "step": 2}])
    b = _run(tmp_path / "b", [{**ROW, "time": 7.0, "timing/step_s": 0.9}, {**ROW, "step": 2}])
    assert compare_runs.main([str(a), str(b)]) == 0
    # step and loss in each of the 2 records; time, timing/step_s and tokens_per_s skipped
    assert "4 values compared, 0 differ" in capsys.readouterr().out


def test_a_changed_value_or_a_missing_key_fails_naming_it(tmp_path, capsys):
    a = _run(tmp_path / "a", [ROW])
    b = _run(tmp_path / "b", [{**ROW, "loss": 0.2500001}])
    c = _run(tmp_path / "c", [{k: v for k, v in ROW.items() if k != "loss"}])
    assert compare_runs.main([str(a), str(b), str(a), str(c)]) == 1
    out = capsys.readouterr().out
    assert "step 1: loss 0.25 != 0.2500001" in out
    assert "keys differ: ['loss']" in out
