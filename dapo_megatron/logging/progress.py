"""Progress over training steps: a tqdm bar on a terminal, concise lines elsewhere.

A DAPO step takes seconds to minutes, so the display is per step, with the few numbers
an RL engineer watches (reward, accuracy, validation accuracy, keep rate, response length,
step time). tqdm redraws with carriage returns, which turns a Slurm/CI log file into one
unreadable line; so the bar is drawn only when enabled *and* the stream is a terminal.
Otherwise each step prints one concise line to stderr::

    step 12/500 acc=0.43 keep=0.75 len=812 step_s=31.2 elapsed=0:06:14 eta=4:13:40
    step 20/500 acc=0.51 val_acc=0.62±0.024 keep=0.69 len=790 elapsed=0:10:20 eta=4:06:00

Both fit the terminal's width (COLUMNS, else 80 for a log file): a line that would not
drops ``elapsed``, then headline columns from the end of ``headline`` (the least
important last), so a log stays one readable line per step and tqdm never cuts a value in half.
Durations of a day or more read ``3d04h``.

The SFT warm-up (hundreds of sub-second steps) uses the same class with ``line_every``:
a bar on a terminal, one line per ``line_every`` steps (and the last) elsewhere.

Columns: a headline metric is left out of a step whose value repeats another column's
(``keys.HEADLINE_DUPLICATES``): the mean verifier score of a 0/1 verifier *is* the training
accuracy, so ``reward`` shows only when the verifier gives partial credit. The decision is
per step, from the values, so it needs no knowledge of the verifier. Validation accuracy
shows, with its standard error, on the steps that measured it (on the bar: the last
measurement, with its step).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, TextIO

from dapo_megatron.logging.keys import (
    DEFAULT_HEADLINE,
    HEADLINE_DUPLICATES,
    HEADLINE_LABELS,
    VAL_ACC,
    VAL_ACC_STDERR,
)

__all__ = ["FALLBACK_COLUMNS", "StepProgress", "format_val", "format_value", "terminal_columns"]

FALLBACK_COLUMNS = 80
"""Width assumed for a terminal that reports none (a pty of size 0x0 under `script`, a CI
runner's pseudo-terminal) when COLUMNS is not set either."""

_FALLBACK_ROWS = 24

# The bar's layout: a fixed-width bar right after the count, so a long metric text (cut
# at the terminal's width) can never squeeze the bar out of the line.
_BAR_FORMAT = "{desc} {n_fmt}/{total_fmt} |{bar:16}| {elapsed}<{remaining}{postfix}"


def format_value(value: float) -> str:
    """Short, stable rendering: lengths as integers, rates with 3 significant digits."""
    if not math.isfinite(value):
        return str(value)  # nan / inf / -inf
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def format_val(acc: float, stderr: float | None) -> str:
    """Validation accuracy with its standard error when known: ``0.62±0.024``."""
    text = format_value(acc)
    if stderr is not None and math.isfinite(stderr):
        text += f"±{stderr:.2g}"
    return text


def _format_duration(seconds: float) -> str:
    """``H:MM:SS`` under a day, ``3d04h`` from a day on: timedelta's ``3 days, 4:00:00``
    holds a space and a comma, and long ETAs made the line wrap."""
    seconds = round(seconds)
    if seconds < 86400:
        return str(timedelta(seconds=seconds))
    days, rest = divmod(seconds, 86400)
    return f"{days}d{rest // 3600:02d}h"


def fit_parts(parts: Sequence[str], room: int) -> list[str]:
    """The longest prefix of ``parts`` whose space-joined text is at most ``room`` wide
    (parts come most important first, so the tail is what a narrow terminal loses)."""
    kept: list[str] = []
    used = -1
    for part in parts:
        if used + 1 + len(part) > room:
            break
        kept.append(part)
        used += 1 + len(part)
    return kept


def terminal_columns(stream: TextIO) -> int | None:
    """Width of the terminal ``stream`` writes to, or None when it reports none.

    A pty may report 0 columns (``script`` without a controlling terminal, some CI
    runners); tqdm then draws nothing at all, so 0 counts as unknown.
    """
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no fd (StringIO), not a tty, closed
        return None
    return columns if columns > 0 else None


def _fallback_columns() -> int:
    """COLUMNS when it is a positive integer, else ``FALLBACK_COLUMNS``."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return FALLBACK_COLUMNS
    return columns if columns > 0 else FALLBACK_COLUMNS


class StepProgress:
    """Shows progress over ``total_steps``, starting at ``start_step`` (steps already done).

    ``update(step, metrics)`` is called once a step finishes, where ``step`` is the number
    of steps completed (the controller's 1-based step index). ``headline`` picks the
    metrics shown, labelled with ``keys.HEADLINE_LABELS`` (the key itself otherwise);
    metrics absent from a step are left out of that step's display. Without a bar, a line
    is printed every ``line_every`` steps and at the last step; ``name`` starts the line
    (and labels the bar).
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int,
        enabled: bool,
        headline: Sequence[str] = DEFAULT_HEADLINE,
        stream: TextIO | None = None,
        name: str = "step",
        line_every: int = 1,
    ) -> None:
        self.total_steps = total_steps
        self.start_step = start_step
        self.headline = list(headline)
        self.name = name
        self.line_every = max(1, line_every)
        self._stream = stream if stream is not None else sys.stderr
        self._t0 = time.monotonic()
        self._bar: Any = None
        self._last_val: tuple[int, float, float | None] | None = None  # (step, acc, stderr)
        isatty = getattr(self._stream, "isatty", None)
        if enabled and isatty is not None and isatty():
            from tqdm import tqdm

            columns = terminal_columns(self._stream)
            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc=name,
                unit="step",
                file=self._stream,
                bar_format=_BAR_FORMAT,
                # A terminal that reports its width is followed as it resizes; one that
                # does not gets a fixed size, or tqdm would draw nothing at all (it reads
                # 0 x 0 and takes 0 rows as "no room") or an unbounded line that wraps
                # and is never erased.
                ncols=None if columns else _fallback_columns(),
                nrows=None if columns else _FALLBACK_ROWS,
                dynamic_ncols=columns is not None,
            )

    @property
    def uses_bar(self) -> bool:
        """True if a tqdm bar is drawn, False if steps are printed as lines."""
        return self._bar is not None

    def headline_text(self, metrics: Mapping[str, float], *, val_step: int | None = None) -> str:
        """``label=value`` pairs of the headline metrics present in ``metrics``, without a
        column that repeats another on this step, and with the validation accuracy (and
        its standard error) when the step measured it; ``val_step``: the validation shown
        is that earlier step's (labelled ``val_acc@STEP``)."""
        return " ".join(self.headline_parts(metrics, val_step=val_step))

    def headline_parts(
        self, metrics: Mapping[str, float], *, val_step: int | None = None
    ) -> list[str]:
        """headline_text's pairs, one string each, in ``headline`` order."""
        parts = []
        for key in self.headline:
            if key not in metrics or _repeats_another(key, metrics):
                continue
            label = HEADLINE_LABELS.get(key, key)
            if key == VAL_ACC:
                value = format_val(float(metrics[key]), _stderr(metrics))
                if val_step is not None:
                    label += f"@{val_step}"
            else:
                value = format_value(float(metrics[key]))
            parts.append(f"{label}={value}")
        return parts

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Advance to ``step`` completed steps and show the headline metrics."""
        if VAL_ACC in metrics:
            self._last_val = (step, float(metrics[VAL_ACC]), _stderr(metrics))
        if self._bar is not None:
            shown = dict(metrics)
            val_step = None
            if VAL_ACC not in shown and VAL_ACC in self.headline and self._last_val:
                # The bar shows one step at a time: the last measurement stays in view.
                val_step, shown[VAL_ACC], stderr = self._last_val
                if stderr is not None:
                    shown[VAL_ACC_STDERR] = stderr
            parts = self.headline_parts(shown, val_step=val_step)
            self._bar.set_postfix_str(" ".join(self._fit_bar(parts)), refresh=False)
            self._bar.update(step - self._bar.n)
            return
        if step % self.line_every and step != self.total_steps:
            return
        done_here = step - self.start_step
        elapsed = time.monotonic() - self._t0
        timing = f"elapsed={_format_duration(elapsed)}"
        if done_here > 0 and step < self.total_steps:
            remaining = elapsed / done_here * (self.total_steps - step)
            timing += f" eta={_format_duration(remaining)}"
        head = f"{self.name} {step}/{self.total_steps}"
        width = _fallback_columns()
        headline = self.headline_parts(metrics)
        # Elapsed is the first to go: a headline column, or the ETA, tells more.
        for shown_timing in (timing, timing.split(" ")[-1]):
            room = width - len(head) - 1 - len(shown_timing) - 1
            parts = fit_parts(headline, room)
            if len(parts) == len(headline):
                break
        print(" ".join([head, *parts, shown_timing])[:width], file=self._stream, flush=True)

    def _fit_bar(self, parts: list[str]) -> list[str]:
        """The headline pairs that fit beside the bar's own text on this terminal: tqdm
        cuts an overlong line at the width, mid-value (``val_acc`` with no number)."""
        width = terminal_columns(self._stream) or _fallback_columns()
        self._bar.set_postfix_str("", refresh=False)
        # The bar without a postfix, plus room for its counters and times to grow (a
        # longer count, an ETA gaining a digit) before the next redraw, and tqdm's ", ".
        bare = len(str(self._bar)) + len(str(self.total_steps)) - len(str(self._bar.n)) + 6
        return fit_parts(parts, width - bare)

    @property
    def elapsed_s(self) -> float:
        """Seconds since the display was created."""
        return time.monotonic() - self._t0

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


def _stderr(metrics: Mapping[str, float]) -> float | None:
    value = metrics.get(VAL_ACC_STDERR)
    return None if value is None else float(value)


def _repeats_another(key: str, metrics: Mapping[str, float]) -> bool:
    """True when ``key``'s value equals that of the column it may duplicate on this step."""
    other = HEADLINE_DUPLICATES.get(key)
    if other is None or other not in metrics:
        return False
    return math.isclose(float(metrics[key]), float(metrics[other]), rel_tol=1e-9, abs_tol=1e-12)
