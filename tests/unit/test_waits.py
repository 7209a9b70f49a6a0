"""tests/waits.py: a wait fails only when what it waits on stops progressing; a slow child
that keeps printing is never killed, an idle one is (with its process group)."""

from __future__ import annotations

import subprocess
import sys
import time
from itertools import count

import psutil
import pytest
import waits


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine at reference speed: idle limits as written, whatever the load now."""
    monkeypatch.setattr(waits, "speed_factor", lambda: 1.0)


def _python(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip


def test_idle_fires_when_nothing_progresses(quiet):
    started = time.monotonic()
    with pytest.raises(waits.WaitTimeout, match=r"for the flag: no progress for \d+ s"):
        waits.wait_until(lambda: False, what="the flag", idle_s=0.3, progress=lambda: 0)
    assert 0.3 <= time.monotonic() - started < 5


def test_progress_resets_the_idle_clock(quiet):
    ticks = count()
    done_at = time.monotonic() + 1.0  # three idle limits: only progress carries it there
    seconds = waits.wait_until(
        lambda: time.monotonic() > done_at, what="the end", idle_s=0.3, progress=lambda: next(ticks)
    )
    assert seconds >= 1.0


def test_the_cap_stops_a_wait_that_progresses_forever(quiet):
    ticks = count()
    with pytest.raises(waits.WaitTimeout, match="safety cap"):
        waits.wait_until(
            lambda: False, what="never", idle_s=10, progress=lambda: next(ticks), cap_s=0.3
        )


def test_a_slow_child_that_keeps_printing_is_not_killed(quiet):
    # 2 s in all, a line every 0.2 s, against an idle limit of 0.8 s (once started: the
    # interpreter's start alone may take longer on a busy machine).
    proc = _python("import time\nfor i in range(10):\n    print(i); time.sleep(0.2)\n")
    waits.wait_line(proc, lambda x: x == "0\n", what="the first line", idle_s=30)
    output = waits.communicate(proc, idle_s=0.8)
    assert proc.returncode == 0
    assert output.split() == [str(i) for i in range(10)]


def test_an_idle_child_is_killed_with_its_group_and_shows_its_last_output(quiet):
    # The child starts a grandchild in its group, prints, and then hangs.
    proc = _python(
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('grandchild', g.pid); print('about to hang'); time.sleep(60)\n"
    )
    grandchild = int(waits.wait_line(proc, lambda x: x.startswith("grandchild"),
                                     what="the grandchild", idle_s=30).split()[1])  # fmt: skip
    with pytest.raises(waits.WaitTimeout, match="(?s)no progress.*about to hang"):
        waits.communicate(proc, what="the hang", idle_s=0.5)
    assert proc.returncode == -9
    assert waits.wait_exited([psutil.Process(grandchild)], what="the grandchild", idle_s=5) == []


def test_wait_line_fails_when_the_child_exits_first(quiet):
    proc = _python("print('only line')")
    with pytest.raises(AssertionError, match="(?s)exited \\(0\\) before the marker.*only line"):
        waits.wait_line(proc, lambda x: "marker" in x, what="the marker", idle_s=30)


def test_run_keeps_stdout_and_stderr_apart(quiet):
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    done = waits.run([sys.executable, "-c", code], idle_s=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_files_progress_sees_a_file_appear_and_grow(tmp_path):
    token = waits.files_progress(tmp_path / "run")
    empty = token()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    first = token()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n{}\n")
    assert len({empty, first, token()}) == 3


def test_speed_factor_follows_the_load_and_never_drops_below_1(monkeypatch):
    monkeypatch.setattr(waits, "_calibration_factor", lambda: 0.5)
    monkeypatch.setattr(waits.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(waits.os, "getloadavg", lambda: (8.0, 0.0, 0.0))
    assert waits.speed_factor() == 4.0 and waits.scaled(30) == 120.0
    monkeypatch.setattr(waits.os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    assert waits.speed_factor() == 1.0
    monkeypatch.setattr(waits.os, "getloadavg", lambda: (500.0, 0.0, 0.0))
    assert waits.speed_factor() == waits.MAX_FACTOR
