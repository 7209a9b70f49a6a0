"""SIGTERM (a Slurm preemption or time limit, ``kill``): stop at the next safe point.

The signal only records the request; the loop checks it where a checkpoint is consistent
(the end of a step, the start of an attempt), saves there and raises ``Preempted``. A step
cannot be cut short without losing it, so the request also starts a deadline of
``run.preemption_grace_s``: if no safe point comes in time, ``PreemptionDeadline`` is raised
from the controller's wait for its workers (``check_deadline``, polled by
controller/remote.py; never from the handler itself: an exception raised in a signal
handler while Ray's Cython wait runs it comes out as a SystemError) and the run stops
without saving, before the SIGKILL that follows the signal. Further SIGTERMs change
nothing (srun and Slurm may each send one).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import FrameType


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

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.requested_at: float | None = None
        self.safe_point_reached = False
        self._previous: dict[int, object] = {}

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
            raise PreemptionDeadline(self.grace_s)


# The run's hook, when dapo-train installed one; the loop asks it at every safe point.
_active: Preemption | None = None


def activate(hook: Preemption | None) -> None:
    global _active
    _active = hook


def requested() -> bool:
    """Whether a SIGTERM asked the run to stop at its next safe point."""
    return _active is not None and _active.requested


def stop_clock() -> None:
    """A safe point was reached: the deadline no longer applies (stopping the workers
    must not be cut short by it)."""
    if _active is not None:
        _active.safe_point_reached = True


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
