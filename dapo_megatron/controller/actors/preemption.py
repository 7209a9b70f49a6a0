"""SIGTERM (a Slurm preemption or time limit, ``kill``): stop at the next safe point.

The signal only records the request; the loop checks it where a checkpoint is consistent
(the end of a step, the start of an attempt), saves there and raises ``Preempted``. A step
cannot be cut short without losing it, so the request also starts a deadline of
``run.preemption_grace_s``: if no safe point comes in time, ``PreemptionDeadline`` is raised
from the controller's wait for its workers (``check_deadline``, polled by
controller/actors/remote.py; never from the handler itself: an exception raised in a signal
handler while Ray's Cython wait runs it comes out as a SystemError) and the run stops
without saving, before the SIGKILL that follows the signal. Further SIGTERMs change
nothing (srun and Slurm may each send one).

The signal may reach every process of the job, not only this one: a terminal's or
``timeout``'s process-group signal, and Slurm, which at a preemption or the time limit sends
SIGTERM to every process of every job step (then SIGKILL after KillWait, 30 s by default).
A local cluster survives a process-group signal (controller/actors/cluster.py starts its node
processes in a session of their own). A Ray daemon that receives it shuts down (the raylet
and the GCS stop on SIGTERM; a Ray worker's ``Worker.main_loop`` in ray/_private/worker.py
installs a SIGTERM handler that exits the process with status 1), so the safe point may be
reached with the GCS gone: then nothing after the checkpoint may wait for it (Ray's GCS
client retries for ``gcs_rpc_server_reconnect_timeout_s`` = 60 s and then aborts the
process). Once a safe point is reached (``reached_safe_point``) or the deadline has passed,
a watchdog thread ends the process with status 143 and the run's final line as soon as the
GCS stops answering, and at the latest ``EXIT_BOUND_S`` later (or when the grace period
runs out, if later): the stop of the workers and Ray's shutdown at exit are best effort.
The same watchdog, running from the SIGTERM on, ends a run whose GCS stopped before the
safe point (its workers went with it) at once, with status 143 and a line that says no new
checkpoint was saved.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

EXIT_BOUND_S = 20.0
"""At most this long (or the rest of the grace period, if longer) from the safe point (or
the deadline) to the exit: stopping the workers and Ray's shutdown must not keep a
preempted run from exiting (with its line) before Slurm's SIGKILL."""

GCS_PROBE_PERIOD_S = 0.5
"""How often the watchdog checks that the GCS still accepts connections."""

PREEMPTED_EXIT = 143  # 128 + SIGTERM


class Preempted(Exception):
    """The run stopped at a safe point after SIGTERM (``saved``: the checkpoint written
    there, None when the last one was already current or checkpointing is off)."""

    def __init__(self, step: int, saved: Path | None) -> None:
        super().__init__(f"preempted at step {step}")
        self.step = step
        self.saved = saved


class PreemptionDeadline(BaseException):
    """No safe point within ``run.preemption_grace_s`` of SIGTERM. A BaseException, like
    KeyboardInterrupt: no ``except Exception`` on the way may swallow it."""

    def __init__(self, grace_s: float) -> None:
        super().__init__(f"no safe point within run.preemption_grace_s = {grace_s:g} s")
        self.grace_s = grace_s


class Preemption:
    """The SIGTERM hook of dapo-train (installed by cli.py around the run)."""

    def __init__(self, grace_s: float, final_line: Callable[[str], str] | None = None) -> None:
        self.grace_s = grace_s
        self.requested_at: float | None = None
        self.safe_point_reached = False
        self._previous: dict[int, object] = {}
        # The run's last line from its outcome ("saved step N; " or the deadline's words):
        # what the watchdog prints when it has to end the process itself.
        self._final_line = final_line
        self.outcome: str | None = None
        """Set at the safe point or the deadline: what the run's final line says."""
        self.reported = False
        """The final line was printed (by the CLI or the watchdog): never twice."""
        self._lock = threading.Lock()
        self.gcs_address: str | None = None
        """host:port of the GCS, recorded after ray.init (``watch_gcs``)."""
        self._watchdog: threading.Thread | None = None

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def install(self) -> None:
        """Take SIGTERM until ``uninstall``."""
        self._previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_term)}

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous = {}

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        if self.requested_at is not None:
            return
        self.requested_at = time.monotonic()
        self._start_watchdog()
        # os.write, not print: a handler that prints while the interrupted code is
        # printing fails on the buffered stream ("reentrant call").
        os.write(
            2,
            f"[preemption] SIGTERM: stopping at the end of the current step with a "
            f"checkpoint, within run.preemption_grace_s = {self.grace_s:g} s\n".encode(),
        )

    def check_deadline(self) -> None:
        """Raise PreemptionDeadline once the grace period after SIGTERM is over."""
        if self.requested_at is None or self.safe_point_reached:
            return
        if time.monotonic() - self.requested_at > self.grace_s:
            error = PreemptionDeadline(self.grace_s)
            self.arm(f"{error}, so the workers were stopped without a new checkpoint; ")
            raise error

    def arm(self, outcome: str) -> None:
        """The run's outcome is decided (a safe point, or the deadline): from here the
        process exits with status 143 within a bound (``EXIT_BOUND_S`` or the rest of the
        grace period), whatever the stop of the workers and Ray do."""
        self.outcome = outcome
        self._start_watchdog()

    def _start_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, daemon=True, name="preemption-exit-watchdog"
            )
            self._watchdog.start()

    def final_line(self) -> str | None:
        """The run's final line, once: None when it was already printed (the watchdog and
        the CLI race for it)."""
        with self._lock:
            if self.reported:
                return None
            self.reported = True
        outcome = self.outcome or ""
        return self._final_line(outcome) if self._final_line else f"preempted: SIGTERM; {outcome}"

    def _watch(self) -> None:
        # A daemon thread, from the SIGTERM on: it keeps running through the interpreter's
        # atexit handlers (Ray's shutdown among them) and ends with the process.
        requested_at = self.requested_at if self.requested_at is not None else time.monotonic()
        exit_by: float | None = None
        while True:
            now = time.monotonic()
            if self.outcome is not None and exit_by is None:
                exit_by = now + max(EXIT_BOUND_S, self.grace_s - (now - requested_at))
            if exit_by is not None and now > exit_by:
                self._exit("stopping the workers and Ray took too long")
            if exit_by is None and now - requested_at > self.grace_s + EXIT_BOUND_S:
                # The controller did not get to check the deadline (stuck inside Ray).
                self._decide(
                    f"no safe point within run.preemption_grace_s = {self.grace_s:g} s, so "
                    f"the workers were stopped without a new checkpoint; "
                )
                self._exit("the controller is stuck in a call to Ray")
            if self.gcs_address is not None and not gcs_reachable(self.gcs_address):
                # The signal stopped the cluster too (Slurm signals every process of the
                # job): no worker is left to end the step, and every wait for Ray would
                # last 60 s and end in an abort.
                self._decide(
                    "the Ray cluster's GCS stopped (the signal reached it too) before the "
                    "end of the step, so no new checkpoint was saved; "
                )
                self._exit("the Ray cluster's GCS is gone")
            time.sleep(GCS_PROBE_PERIOD_S)

    def _decide(self, outcome: str) -> None:
        with self._lock:
            if self.outcome is None:
                self.outcome = outcome

    def _exit(self, why: str) -> None:
        line = self.final_line()
        if line is not None:  # else the CLI printed it and the process is exiting (atexit)
            os.write(2, f"[preemption] {why}: exiting without waiting for Ray\n{line}\n".encode())
        os._exit(PREEMPTED_EXIT)


def gcs_reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Whether the GCS at host:port accepts a TCP connection (a dead GCS on a live host
    refuses at once)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


# The run's hook, when dapo-train installed one; the loop asks it at every safe point.
_active: Preemption | None = None


def activate(hook: Preemption | None) -> None:
    global _active
    _active = hook


def requested() -> bool:
    """Whether a SIGTERM asked the run to stop at its next safe point."""
    return _active is not None and _active.requested


def stop_clock(step: int | None = None, saved: Path | None = None) -> None:
    """A safe point was reached (at step ``step``, ``saved``: its checkpoint, complete):
    the deadline no longer applies (stopping the workers must not be cut short by it), and
    the exit is bounded from here (``Preemption.arm``)."""
    if _active is not None:
        _active.safe_point_reached = True
        _active.arm(saved_words(step, saved))


def saved_words(step: int | None, saved: Path | None) -> str:
    """The part of the final line that says what a safe point saved."""
    return f"saved step {step}; " if saved is not None else ""


def final_line() -> str | None:
    """The run's final line, if a safe point or the deadline decided it and nobody printed
    it yet."""
    return _active.final_line() if _active is not None and _active.outcome is not None else None


def check_deadline() -> None:
    """Raise PreemptionDeadline when a SIGTERM's grace period ran out before a safe
    point (called wherever the controller waits for its workers)."""
    if _active is not None:
        _active.check_deadline()


def reclaim_sigterm() -> None:
    """Take SIGTERM back after ``ray.init``, which installs its own handlers (the driver
    exits at once; a local head node kills its processes first): a preempted run must
    reach its safe point with its workers alive."""
    if _active is not None:
        signal.signal(signal.SIGTERM, _active._on_term)


def watch_gcs(address: str | None) -> None:
    """Record the GCS's host:port (after ray.init): the exit watchdog probes it."""
    if _active is not None:
        _active.gcs_address = address
