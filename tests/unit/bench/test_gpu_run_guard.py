"""bench/gpu_run_guard.py: what keeps scripts/gpu_run.sh inside one device call (the carry's
unpacking without xz, the disk plan, child timeouts that end a process group, the alarm)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))
import gpu_run_guard as guard  # noqa: E402

GIB = 2**30


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def test_unpack_an_xz_carry_without_the_xz_binary(tmp_path):
    tarball = tmp_path / "site.tar.xz"
    with tarfile.open(tarball, "w:xz") as tar:
        _add(tar, "site/ray/__init__.py", b"VERSION = '2.60.0'\n")
        _add(tar, "site/ray/core/src/ray/raylet/raylet", b"\x7fELF", mode=0o755)
    dest = tmp_path / "unpacked"
    env = dict(os.environ, PATH=str(tmp_path / "no-binaries"))  # no xz, no tar on PATH
    subprocess.run(
        [sys.executable, str(REPO / "bench/gpu_run_guard.py"), "unpack", str(tarball), str(dest)],
        check=True,
        env=env,
    )
    assert (dest / "site/ray/__init__.py").read_text() == "VERSION = '2.60.0'\n"
    assert os.access(dest / "site/ray/core/src/ray/raylet/raylet", os.X_OK)  # binaries run


def test_unpack_refuses_paths_out_of_the_destination(tmp_path):
    tarball = tmp_path / "bad.tar.xz"
    with tarfile.open(tarball, "w:xz") as tar:
        _add(tar, "../escaped.txt", b"x")
    with pytest.raises(tarfile.FilterError):
        guard.unpack(tarball, tmp_path / "dest")
    assert not (tmp_path / "escaped.txt").exists()


def test_plan_disk_keeps_what_fits():
    params = {"qwen3-0.6b": 596_049_920, "qwen3-1.7b": 1_720_574_976}
    plenty = guard.plan_disk(200 * GIB, params)
    assert plenty.timed == plenty.full == list(params) and plenty.notes == {}
    # 30 GiB: both timed runs (2.2 + 6.4 GiB of checkpoints), 0.6B's later phases (with
    # 1.7B's checkpoint still there), but not 1.7B's 35 GiB.
    some = guard.plan_disk(30 * GIB, params)
    assert some.timed == list(params) and some.full == ["qwen3-0.6b"]
    assert some.notes["qwen3-1.7b"].startswith("timed run only: resume and export need 35.3 GiB")
    tight = guard.plan_disk(8 * GIB, params)
    assert tight.timed == ["qwen3-0.6b"] and tight.full == []
    assert tight.notes["qwen3-1.7b"].startswith("skipped: its checkpoint needs 6.4 GiB")


def test_hard_stop_leaves_the_kill_grace_to_children():
    stop = guard.HardStop(100.0, started_epoch=time.time() - 40)
    assert 59 < stop.left() <= 60
    assert stop.child_timeout() == pytest.approx(stop.left() - guard.KILL_GRACE_S, abs=0.5)
    assert guard.HardStop(None).child_timeout() is None
    assert guard.HardStop(None).left() == float("inf")


def _gone(pid: int) -> bool:
    """No such process, or a zombie (no init in a container may reap an orphan at once)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_run_child_timeout_ends_its_whole_process_group(tmp_path, monkeypatch):
    # The child starts a grandchild (as dapo-train starts reward workers) and ignores SIGTERM:
    # the timeout must still end both (SIGKILL after the grace).
    monkeypatch.setattr(guard, "KILL_GRACE_S", 1.0)
    script = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print(p.pid, flush=True); time.sleep(120)"
    )
    lines: list[str] = []
    started = time.monotonic()
    code, wall = guard.run_child(
        [sys.executable, "-c", script],
        tmp_path / "child.log",
        timeout_s=2.0,
        echo=lines.append,
        env=None,
    )
    assert code is None and wall < 2.0 + 1.0 + 8
    assert time.monotonic() - started < 15
    grandchild = int(lines[0])
    deadline = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(grandchild)
    assert (tmp_path / "child.log").read_text().strip() == str(grandchild)


def test_alarm_stops_an_in_process_phase():
    with pytest.raises(guard.Stopped), guard.alarm(0.5):
        time.sleep(5)
    with guard.alarm(None):  # no hard stop: nothing armed
        pass


def test_tail_and_write_text(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    text = guard.tail(log, 3)
    assert text == "(last 3 of 100 lines)\nline 97\nline 98\nline 99\n"
    out = tmp_path / "out" / "logs.txt"
    guard.write_text(out, "x" * 50, limit=10)
    assert out.read_text() == "...\n" + "x" * 10


def test_a_child_dies_with_the_run(tmp_path):
    """A run killed by SIGKILL (a device call's end) takes its child along: the child is in
    a session of its own, so only PR_SET_PDEATHSIG reaches it."""
    runner = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import gpu_run_guard as g; "
        "from pathlib import Path; "
        "g.run_child([sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); "
        "time.sleep(120)'], Path(sys.argv[2]), timeout_s=None, echo=print)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", runner, str(REPO / "bench"), str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child)
