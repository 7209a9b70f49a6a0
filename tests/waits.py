"""Waits of the functional and real-Slurm tests, sized by the work instead of the clock.

A busy machine runs the same job several times slower (the node-loss run: 84 s alone, 522 s
beside other work on 2 cores), so a fixed wall-clock budget turns load into a red test that
says nothing about the code. Every wait here therefore fails only when what it waits on has
shown no progress (a new output line, a file written, the job's state changing, CPU time
used) for an idle limit, and the idle limit is scaled by the machine's measured speed
(``speed_factor``). A real hang shows no progress and still fails, after the idle limit;
``CAP_S`` is a safety net far above any plausible loaded run, for a livelock that keeps
printing.

- ``wait_until(ready, what=..., idle_s=..., progress=...)``: poll ``ready()``.
- ``wait_line(proc, match, ...)`` / ``communicate(proc, ...)``: a child's output, read by
  a thread (the pipe never fills), every line resetting the idle clock; a child that goes
  idle is killed with its process group and the error shows its last output.
- ``run(cmd, idle_s=..., ...)``: ``subprocess.run(..., capture_output=True, text=True)``
  with that wait instead of ``timeout=``.
- ``scaled(seconds)``: a bound a test asserts on the code's own speed ("stops within 60 s"),
  scaled the same way; bounds set by a clock outside the code (Ray's health check, Slurm's
  KillWait) stay as they are.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import IO, Any

import psutil

# Safety net only: some 20x the slowest functional test on a quiet 2-core machine, so no
# loaded run reaches it; a run that is hung shows no progress and fails at its idle limit.
CAP_S = 1800.0
# Seconds of the calibration loop below on a quiet 2-core CI machine (best of 3).
REFERENCE_S = 0.10
# Beyond this the machine is not slow but stuck, and a wait should say so.
MAX_FACTOR = 20.0

Progress = Callable[[], Hashable]


class WaitTimeout(AssertionError):
    """A wait saw no progress for its idle limit (or reached CAP_S)."""


@functools.cache
def _calibration_factor() -> float:
    """How much slower than REFERENCE_S a fixed loop of Python runs here (once a session)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(2_000_000):
            total += i
        best = min(best, time.perf_counter() - started)
    return best / REFERENCE_S


def speed_factor() -> float:
    """How many times longer than on a quiet machine work takes now, at least 1: the
    session's calibration loop against REFERENCE_S, or the runnable processes per core
    (the 1-minute load average, read at each call: load comes and goes), the larger."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(MAX_FACTOR, max(1.0, _calibration_factor(), load))


def scaled(seconds: float) -> float:
    """``seconds`` on a quiet machine, as long as the same work takes here now."""
    return seconds * speed_factor()


# --- progress tokens ----------------------------------------------------------------------
def files_progress(*roots: Path) -> Progress:
    """A token that changes whenever a file under any of roots (files or directories, which
    may not exist yet) is created, removed, grown or rewritten."""

    def token() -> Hashable:
        seen = []
        for root in roots:
            paths = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
            for path in paths:
                try:
                    st = path.stat()
                except OSError:  # removed meanwhile
                    continue
                seen.append((str(path), st.st_size, st.st_mtime_ns))
        return tuple(seen)

    return token


def cpu_progress(pids: Callable[[], Iterable[int]]) -> Progress:
    """A token that changes while the processes pids() returns (and their descendants) use
    CPU time, in 0.1 s steps: ranks computing make progress; ranks blocked make none."""

    def token() -> Hashable:
        total = 0.0
        for pid in pids():
            try:
                root = psutil.Process(pid)
                for p in (root, *root.children(recursive=True)):
                    times = p.cpu_times()
                    total += times.user + times.system
            except psutil.Error:  # exited meanwhile
                continue
        return round(total, 1)

    return token


def _as_list(progress: Progress | Iterable[Progress] | None) -> list[Progress]:
    if progress is None:
        return []
    return [progress] if callable(progress) else list(progress)


# --- the wait -----------------------------------------------------------------------------
def wait_until(
    ready: Callable[[], Any],
    *,
    what: str,
    idle_s: float,
    progress: Progress | Iterable[Progress] | None = None,
    cap_s: float = CAP_S,
    poll_s: float = 0.1,
    details: Callable[[], str] = lambda: "",
) -> float:
    """Poll ready() until it is true; the seconds waited. Fails (WaitTimeout, with what was
    awaited and details()) once progress() has not changed for scaled(idle_s) seconds, or
    after cap_s in all. ready() may raise to give up early (the job ended first)."""
    callables = _as_list(progress)

    def tokens() -> tuple:
        return tuple(f() for f in callables)

    started = last_change = time.monotonic()
    last = tokens()
    while True:
        if ready():
            return time.monotonic() - started
        now = time.monotonic()
        token = tokens()
        if token != last:
            last, last_change = token, now
        limit = scaled(idle_s)
        if now - last_change > limit or now - started > cap_s:
            why = (
                f"no progress for {now - last_change:.0f} s (idle limit {idle_s:g} s x "
                f"{limit / idle_s:.1f} for this machine's speed)"
                if now - last_change > limit
                else f"still progressing at the {cap_s:.0f} s safety cap"
            )
            raise WaitTimeout(
                f"waited {now - started:.0f} s for {what}: {why}; load average "
                f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n{details()}"
            )
        time.sleep(poll_s)


# --- children's output --------------------------------------------------------------------
class Output:
    """A text pipe read line by line by a daemon thread: the lines so far and whether it
    closed. Reading keeps the child from blocking on a full pipe while a test waits."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                self.lines.append(line)
        except (OSError, ValueError):  # the pipe closed under us
            pass
        finally:
            self.closed.set()

    def text(self) -> str:
        return "".join(self.lines)

    def tail(self, chars: int = 3000) -> str:
        return self.text()[-chars:]

    def finish(self, seconds: float = 30.0) -> str:
        """The whole text once the pipe closed (the child exited; its own children may hold
        the pipe a moment longer), or what arrived within ``seconds``."""
        self.closed.wait(seconds)
        return self.text()


_outputs: weakref.WeakKeyDictionary[subprocess.Popen, dict[str, Output]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def output_of(proc: subprocess.Popen, stream: str = "stdout") -> Output | None:
    """The reader of proc.stdout (or proc.stderr), started on the first call; None when
    that stream is not a pipe. Every later read of it must go through this reader."""
    pipe = getattr(proc, stream)
    if pipe is None:
        return None
    with _lock:
        readers = _outputs.setdefault(proc, {})
        if stream not in readers:
            readers[stream] = Output(pipe)
        return readers[stream]


def _line_count(proc: subprocess.Popen) -> Progress:
    readers = [r for r in (output_of(proc), output_of(proc, "stderr")) if r is not None]
    return lambda: sum(len(r.lines) for r in readers)


def _details(proc: subprocess.Popen) -> Callable[[], str]:
    def text() -> str:
        parts = []
        for name in ("stdout", "stderr"):
            reader = output_of(proc, name)
            if reader is not None:
                parts.append(f"its last {name}:\n{reader.tail()}")
        return "\n".join(parts) or "(its output is not captured)"

    return text


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child and, when it leads its own process group, the whole group."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:  # exited meanwhile
        pass
    proc.wait()


def wait_line(
    proc: subprocess.Popen,
    match: Callable[[str], bool],
    *,
    what: str,
    idle_s: float,
    progress: Progress | Iterable[Progress] | None = None,
    cap_s: float = CAP_S,
) -> str:
    """The first line of proc's stdout (from its start) that match() accepts. Fails if
    the child exits first or goes idle (then it is killed with its group)."""
    reader = output_of(proc)
    assert reader is not None, "wait_line needs stdout=subprocess.PIPE"

    def found() -> str | None:
        hit = next((x for x in reader.lines if match(x)), None)
        if hit is None and reader.closed.is_set():
            proc.wait()
            raise AssertionError(f"exited ({proc.returncode}) before {what}:\n{reader.tail()}")
        return hit

    try:
        wait_until(
            found, what=what, idle_s=idle_s, progress=[_line_count(proc), *_as_list(progress)],
            cap_s=cap_s, details=_details(proc),
        )  # fmt: skip
    except BaseException:  # idle, or the test interrupted: never leave the child running
        kill_group(proc)
        raise
    return found() or ""


def communicate(
    proc: subprocess.Popen,
    *,
    what: str = "the child's exit",
    idle_s: float,
    progress: Progress | Iterable[Progress] | None = None,
    cap_s: float = CAP_S,
    cpu: bool = False,
) -> str:
    """Wait for proc to exit while its output (or progress) moves; its whole stdout since
    it started ("" when not captured). A child idle for the limit is killed with its
    process group and the wait fails with its last output. cpu: the CPU time of proc and
    its descendants counts as progress too (for a child that computes quietly; not for one
    with a Ray cluster, whose daemons use CPU while idle)."""
    output_of(proc), output_of(proc, "stderr")  # start reading before waiting
    extra = [cpu_progress(lambda: [proc.pid])] if cpu else []
    try:
        wait_until(
            lambda: proc.poll() is not None, what=what, idle_s=idle_s,
            progress=[_line_count(proc), *_as_list(progress), *extra], cap_s=cap_s,
            details=_details(proc),
        )  # fmt: skip
    except BaseException:  # idle, or the test interrupted: never leave the child running
        kill_group(proc)
        raise
    reader = output_of(proc)
    return reader.finish() if reader is not None else ""


def run(
    cmd: list[str],
    *,
    idle_s: float,
    what: str | None = None,
    progress: Progress | Iterable[Progress] | None = None,
    cap_s: float = CAP_S,
    cpu: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """subprocess.run(cmd, capture_output=True, text=True, **popen), waited on by output
    and progress instead of a timeout; the child runs in its own session (killed whole)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=popen.pop("start_new_session", True), **popen,
    )  # fmt: skip
    try:
        communicate(proc, what=what or f"{cmd[0]} to exit", idle_s=idle_s,
                    progress=progress, cap_s=cap_s, cpu=cpu)  # fmt: skip
    finally:
        if proc.poll() is None:  # an error in the wait itself (Ctrl-C): never leave it
            kill_group(proc)
    out, err = output_of(proc), output_of(proc, "stderr")
    assert out is not None and err is not None
    return subprocess.CompletedProcess(cmd, proc.returncode, out.finish(), err.finish())


def wait_exited(processes: list[psutil.Process], *, what: str, idle_s: float) -> list:
    """Wait until none of processes runs (each exit is progress); those still alive."""

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:  # gone meanwhile
            return False

    def alive() -> list[psutil.Process]:
        return [p for p in processes if running(p)]

    try:
        wait_until(lambda: not alive(), what=what, idle_s=idle_s, progress=lambda: len(alive()))
    except WaitTimeout:
        return alive()
    return []
