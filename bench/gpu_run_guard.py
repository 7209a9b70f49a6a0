"""What keeps bench/gpu_run.py inside one device call: the hard stop, child processes with
timeouts, the disk check, the carry's unpacking and the log tails. No torch here.

A device call has a wall-clock limit (600 s) and returns only what was written before it
ended; so the run measures its time from the start of scripts/gpu_run.sh
(``GPU_RUN_STARTED``, epoch seconds), gives every child the time left before the hard stop,
ends a child's whole process group when that time is up (SIGTERM: dapo-train's preemption
handling stops its Ray workers; SIGKILL after ``KILL_GRACE_S``), and stops in-process
phases with SIGALRM.

CLI (scripts/gpu_run.sh): ``python bench/gpu_run_guard.py unpack TARBALL DEST`` unpacks the
carry's xz tarball with Python's tarfile (the image need not have an ``xz`` binary).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

KILL_GRACE_S = 10.0
"""Between SIGTERM and SIGKILL of a child's process group."""

MIN_PHASE_S = 15.0
"""A phase is not started with less time than this left before the hard stop."""

# Bytes of disk per parameter. The random HF checkpoint is fp32 (4); the later phases add
# the resume run's Megatron checkpoint (bf16 weights 2 + fp32 main weights and two Adam
# moments 12) and the export (up to fp32, 4): 22 in all, 35 GiB for qwen3-1.7b's 1.72 B.
MODEL_BYTES_PER_PARAM = 4
LATER_BYTES_PER_PARAM = 18
DISK_MARGIN_BYTES = 2 * 2**30
"""Logs, Ray's session files and the object store's spill: kept free besides the models."""


class Stopped(Exception):
    """The hard stop (or a SIGTERM to the run) ended the phase in progress."""


class HardStop:
    """Seconds left before the run must have written its results and ended."""

    def __init__(self, limit_s: float | None, started_epoch: float | None = None) -> None:
        self.limit_s = limit_s
        self.started = time.time() if started_epoch is None else started_epoch

    def elapsed(self) -> float:
        return time.time() - self.started

    def left(self) -> float:
        """Seconds to the hard stop (inf without one)."""
        if self.limit_s is None:
            return float("inf")
        return self.limit_s - self.elapsed()

    def child_timeout(self) -> float | None:
        """A child's timeout: what is left once its group's SIGTERM grace is kept aside."""
        if self.limit_s is None:
            return None
        return max(1.0, self.left() - KILL_GRACE_S)


_children: set[subprocess.Popen[str]] = set()


def stop_group(proc: subprocess.Popen[str], grace_s: float | None = None) -> None:
    """End a child started in its own session and everything in its process group:
    SIGTERM, then SIGKILL after ``grace_s`` (default KILL_GRACE_S). (Ray's node processes
    run in a session of their own and die with the dapo-train driver, controller/actors/cluster.py.)"""
    grace = KILL_GRACE_S if grace_s is None else grace_s
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # a straggler of the group
        os.killpg(proc.pid, signal.SIGKILL)


def stop_children() -> None:
    """End every child still running (the run itself is being stopped)."""
    for proc in list(_children):
        stop_group(proc, grace_s=3.0)


def _die_with_parent() -> None:
    """In a child before its exec: SIGKILL when the run's process dies, even by SIGKILL (a
    device call's end), Linux's PR_SET_PDEATHSIG. Its own session keeps it out of signals
    to the run's group, so without this an orphaned dapo-train would train on, holding the
    GPU (its Ray processes die with it: controller/actors/cluster.py)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_child(
    argv: Sequence[str],
    logfile: Path,
    *,
    timeout_s: float | None,
    echo: Callable[[str], None],
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[int | None, float]:
    """Run ``argv`` in its own session, its output (stdout and stderr) to ``logfile`` and
    each line to ``echo``; (exit code, or None when the timeout ended it; wall seconds)."""
    started = time.perf_counter()
    with logfile.open("w") as fh:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: one killpg ends it all
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        _children.add(proc)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                echo(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            code = None
        except BaseException:  # a SIGTERM to the run (Stopped): the child goes too
            stop_group(proc, grace_s=3.0)
            raise
        finally:
            if proc.poll() is None:  # a stop interrupted by the alarm: no grace left
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            _children.discard(proc)
        reader.join(timeout=5.0)
    return code, time.perf_counter() - started


@contextlib.contextmanager
def alarm(seconds: float | None) -> Iterator[None]:
    """Raise Stopped in this (main) thread after ``seconds``: an in-process phase (the
    transformers generate, the kernel check) ends at the hard stop too."""
    if seconds is None:
        yield
        return

    def ring(signum: int, frame: FrameType | None) -> None:
        raise Stopped(f"hard stop: in-process phase ended after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(0.5, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def stop_on_sigterm() -> Any:
    """A SIGTERM to the run (the device call's own end, a test) raises Stopped in the main
    thread: the run ends its child, writes its JSON and logs, and exits. Returns the
    handler it replaced (restored once the run has wrapped up)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Stopped("SIGTERM")

    return signal.signal(signal.SIGTERM, handler)


@dataclass(frozen=True)
class DiskPlan:
    """Which models the disk holds: timed run only, or every phase; why not the rest."""

    timed: list[str]
    full: list[str]
    notes: dict[str, str]


def plan_disk(free_bytes: int, params: dict[str, int]) -> DiskPlan:
    """Models in order: a model's timed run needs its random checkpoint on disk
    (``MODEL_BYTES_PER_PARAM``) beside the earlier models' ones (every timed run comes
    first); its later phases (resume checkpoint and export, ``LATER_BYTES_PER_PARAM``)
    run after the earlier models' later phases deleted their directories. A model that
    does not fit is left out with a note saying by how much."""
    gib = 2**30
    usable = free_bytes - DISK_MARGIN_BYTES
    timed: list[str] = []
    notes: dict[str, str] = {}
    held = 0
    for name, n in params.items():
        need = n * MODEL_BYTES_PER_PARAM
        if held + need > usable:
            notes[name] = (
                f"skipped: its checkpoint needs {need / gib:.1f} GiB, "
                f"{max(0, usable - held) / gib:.1f} GiB free (of {free_bytes / gib:.1f})"
            )
            continue
        timed.append(name)
        held += need
    full: list[str] = []
    for i, name in enumerate(timed):
        resident = sum(params[m] * MODEL_BYTES_PER_PARAM for m in timed[i:])
        need = resident + params[name] * LATER_BYTES_PER_PARAM
        if need > usable:
            notes[name] = (
                f"timed run only: resume and export need {need / gib:.1f} GiB, "
                f"{usable / gib:.1f} GiB free"
            )
        else:
            full.append(name)
    return DiskPlan(timed, full, notes)


def unpack(tarball: Path, dest: Path) -> None:
    """Unpack an xz (or any) tarball with Python's tarfile: no xz binary needed."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, mode="r:*") as tar:
        if hasattr(tarfile, "data_filter"):  # 3.12 and 3.11.4+: no paths out of dest
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - older Pythons
            tar.extractall(dest)


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file, saying how many it has."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(unreadable: {e})\n"
    kept = text[-lines:]
    return f"(last {len(kept)} of {len(text)} lines)\n" + "\n".join(kept) + "\n"


def write_text(out: Path, body: str, limit: int = 1_000_000) -> None:
    """Write ``body`` (its last ``limit`` characters) atomically: the device returns a
    few files two folders deep, so the logs' tails travel as ONE file."""
    if len(body) > limit:
        body = "...\n" + body[-limit:]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(body)
    tmp.replace(out)


def main(argv: list[str]) -> int:
    """CLI: ``unpack TARBALL DEST`` (module docstring)."""
    if len(argv) == 3 and argv[0] == "unpack":
        unpack(Path(argv[1]), Path(argv[2]))
        return 0
    print("usage: gpu_run_guard.py unpack TARBALL DEST", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
