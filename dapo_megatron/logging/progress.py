"""Progress over training steps: a tqdm bar on a terminal, one line per step elsewhere.

A DAPO step takes seconds to minutes, so the display is per step, with the few numbers
an RL engineer watches (reward, accuracy, keep rate, response length, step time).
tqdm redraws with carriage returns, which turns a Slurm/CI log file into one unreadable
line; so the bar is drawn only when enabled *and* the stream is a terminal. Otherwise
each step prints one concise line to stderr::

    step 12/500 reward=0.512 acc=0.43 keep=0.75 len=812 step_s=31.2 elapsed=0:06:14 eta=4:13:40
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, TextIO

from dapo_megatron.logging.keys import DEFAULT_HEADLINE, HEADLINE_LABELS

__all__ = ["StepProgress", "format_value"]


def format_value(value: float) -> str:
    """Short, stable rendering: lengths as integers, rates with 3 significant digits."""
    if not math.isfinite(value):
        return str(value)  # nan / inf / -inf
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _format_duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class StepProgress:
    """Shows progress over ``total_steps``, starting at ``start_step`` (steps already done).

    ``update(step, metrics)`` is called once a step finishes, where ``step`` is the number
    of steps completed (the controller's 1-based step index). ``headline`` picks the
    metrics shown, labelled with ``keys.HEADLINE_LABELS`` (the key itself otherwise);
    metrics absent from a step are left out of that step's display.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int,
        enabled: bool,
        headline: Sequence[str] = DEFAULT_HEADLINE,
        stream: TextIO | None = None,
    ) -> None:
        self.total_steps = total_steps
        self.start_step = start_step
        self.headline = list(headline)
        self._stream = stream if stream is not None else sys.stderr
        self._t0 = time.monotonic()
        self._bar: Any = None
        isatty = getattr(self._stream, "isatty", None)
        if enabled and isatty is not None and isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                unit="step",
                file=self._stream,
                dynamic_ncols=True,
            )

    @property
    def uses_bar(self) -> bool:
        """True if a tqdm bar is drawn, False if steps are printed as lines."""
        return self._bar is not None

    def headline_text(self, metrics: Mapping[str, float]) -> str:
        """``label=value`` pairs of the headline metrics present in ``metrics``."""
        parts = []
        for key in self.headline:
            if key in metrics:
                label = HEADLINE_LABELS.get(key, key)
                parts.append(f"{label}={format_value(float(metrics[key]))}")
        return " ".join(parts)

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Advance to ``step`` completed steps and show the headline metrics."""
        text = self.headline_text(metrics)
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(step - self._bar.n)
            return
        done_here = step - self.start_step
        elapsed = time.monotonic() - self._t0
        timing = f"elapsed={_format_duration(elapsed)}"
        if done_here > 0 and step < self.total_steps:
            remaining = elapsed / done_here * (self.total_steps - step)
            timing += f" eta={_format_duration(remaining)}"
        head = f"step {step}/{self.total_steps}"
        line = " ".join(part for part in (head, text, timing) if part)
        print(line, file=self._stream, flush=True)

    def write(self, message: str) -> None:
        """Print a message without breaking the bar (tqdm.write redraws it below)."""
        if self._bar is not None:
            self._bar.write(message, file=self._stream)
        else:
            print(message, file=self._stream, flush=True)

    def close(self) -> None:
        """Close the bar (leaving it on screen); idempotent."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
