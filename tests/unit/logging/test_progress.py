"""The progress display (logging/progress.py): step lines, the bar on a terminal."""

from __future__ import annotations

import io
import math
import os

import pytest

from dapo_megatron.logging import StepProgress, keys
from dapo_megatron.logging.progress import format_value

# --- progress --------------------------------------------------------------------------


def test_progress_disabled_prints_one_line_per_step(capsys):
    headline = [keys.REWARD_RAW_MEAN, keys.REWARD_ACC, keys.RESPONSE_LENGTH_MEAN, "custom/x"]
    with StepProgress(10, start_step=2, enabled=False, headline=headline) as progress:
        assert not progress.uses_bar
        for step in (3, 4, 5):
            progress.update(
                step,
                {
                    keys.REWARD_RAW_MEAN: step / 10,
                    keys.REWARD_ACC: 0.4302,
                    keys.RESPONSE_LENGTH_MEAN: 812.4,
                    "custom/x": math.nan,
                    keys.LOSS: 9.0,  # not a headline metric
                },
            )
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 3
    for step, line in zip((3, 4, 5), lines, strict=True):
        assert line.startswith(f"step {step}/10 reward={step / 10:.3g} acc=0.43 len=812 ")
        assert "custom/x=nan" in line and "loss" not in line
        assert "elapsed=" in line and "eta=" in line


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    piped = io.StringIO()
    with StepProgress(5, start_step=0, enabled=True, stream=piped) as progress:
        assert not progress.uses_bar  # a log file gets lines, not carriage returns
        progress.update(1, {keys.REWARD_ACC: 0.5})
    assert piped.getvalue().startswith("step 1/5 acc=0.5 ")

    terminal = FakeTerminal()
    with StepProgress(5, start_step=1, enabled=True, stream=terminal) as progress:
        assert progress.uses_bar
        progress.update(3, {keys.REWARD_ACC: 0.75, keys.STEP_TIME_S: 31.25})
        progress.write("validation done")
    out = terminal.getvalue()
    assert "3/5" in out and "acc=0.75" in out and "step_s=31.2" in out
    assert "validation done" in out


def bar_screens(text: str) -> list[str]:
    """What a terminal shows for each redraw of a bar: the segments between carriage returns."""
    return [seg for seg in text.replace("\n", "\r").split("\r") if seg.strip()]


def test_step_line_shows_validation_only_when_measured(capsys):
    with StepProgress(20, start_step=0, enabled=False) as progress:
        progress.update(9, {keys.REWARD_ACC: 0.5, keys.DS_KEEP_RATE: 0.75})
        progress.update(
            10,
            {
                keys.REWARD_ACC: 0.5,
                keys.VAL_ACC: 0.6175,
                keys.VAL_ACC_STDERR: 0.02431,
                keys.DS_KEEP_RATE: 0.75,
            },
        )
        progress.update(11, {keys.REWARD_ACC: 0.5, keys.VAL_ACC: 0.25})  # stderr unknown
    lines = capsys.readouterr().err.splitlines()
    assert "val_acc" not in lines[0]
    assert lines[0].startswith("step 9/20 acc=0.5 keep=0.75 elapsed=")
    assert lines[1].startswith("step 10/20 acc=0.5 val_acc=0.618±0.024 keep=0.75 elapsed=")
    assert lines[2].startswith("step 11/20 acc=0.5 val_acc=0.25 elapsed=")


def test_reward_column_is_dropped_only_when_it_equals_acc(capsys):
    with StepProgress(2, start_step=0, enabled=False) as progress:
        # A 0/1 verifier: the mean score is the accuracy; one column says it.
        progress.update(1, {keys.REWARD_RAW_MEAN: 0.375, keys.REWARD_ACC: 0.375})
        # Partial credit: the two differ, both show.
        progress.update(2, {keys.REWARD_RAW_MEAN: 0.5, keys.REWARD_ACC: 0.375})
    first, second = capsys.readouterr().err.splitlines()
    assert first.startswith("step 1/2 acc=0.375 elapsed=") and "reward" not in first
    assert second.startswith("step 2/2 reward=0.5 acc=0.375 elapsed=")


def test_sft_lines_every_n_steps_and_at_the_last():
    out = io.StringIO()
    with StepProgress(
        25,
        start_step=0,
        enabled=True,  # not a terminal: lines, never carriage returns
        headline=(keys.SFT_NLL,),
        name="sft warm-up",
        line_every=10,
        stream=out,
    ) as progress:
        for step in range(1, 26):
            progress.update(step, {keys.SFT_NLL: 4.0 / step})
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [line.split(" nll=")[0] for line in lines] == [
        "sft warm-up 10/25",
        "sft warm-up 20/25",
        "sft warm-up 25/25",
    ]
    assert lines[0].startswith("sft warm-up 10/25 nll=0.4 elapsed=") and "eta=" in lines[0]


class SizedTerminal(FakeTerminal):
    """A terminal whose descriptor reports a size (os.get_terminal_size is patched)."""

    def fileno(self) -> int:
        return 2


@pytest.mark.parametrize("reported", [None, (0, 0)], ids=["no-size", "pty-0x0"])
def test_bar_shows_under_a_terminal_of_unknown_width(monkeypatch, reported):
    monkeypatch.delenv("COLUMNS", raising=False)
    terminal: FakeTerminal = FakeTerminal()
    if reported is not None:
        # `script` without a controlling terminal, some CI runners: a pty of 0 x 0.
        monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size(reported))
        terminal = SizedTerminal()
    long_metrics = {
        keys.REWARD_ACC: 0.75,
        keys.VAL_ACC: 0.5,
        keys.VAL_ACC_STDERR: 0.01,
        keys.DS_KEEP_RATE: 0.5,
        keys.RESPONSE_LENGTH_MEAN: 812.0,
        keys.STEP_TIME_S: 31.25,
        keys.REWARD_RAW_MEAN: 0.6,
    }
    with StepProgress(4, start_step=0, enabled=True, stream=terminal) as progress:
        assert progress.uses_bar
        progress.update(2, long_metrics)
    screens = bar_screens(terminal.getvalue())
    assert screens, "the bar drew nothing"
    last = screens[-1]
    assert last.startswith("step 2/4 |") and "acc=0.75" in last
    bar = last.split("|")[1]
    assert len(bar) == 16 and bar.strip(), last  # a visible, half-filled bar
    # A fixed width: a redraw never wraps onto a second line that \r cannot erase.
    assert all(len(s) <= 80 for s in screens)


def test_bar_keeps_the_last_validation_in_view():
    terminal = FakeTerminal()
    with StepProgress(20, start_step=0, enabled=True, stream=terminal) as progress:
        progress.update(10, {keys.REWARD_ACC: 0.5, keys.VAL_ACC: 0.625, keys.VAL_ACC_STDERR: 0.02})
        progress.update(11, {keys.REWARD_ACC: 0.55})
    last = bar_screens(terminal.getvalue())[-1]
    assert "acc=0.55 val_acc@10=0.625±0.02" in last


def test_format_value():
    assert [format_value(v) for v in (812.4, 0.4302, 31.25, 1e-6, math.inf)] == [
        "812",
        "0.43",
        "31.2",
        "1e-06",
        "inf",
    ]


# --- width -------------------------------------------------------------------------------

LONG_STEP = {
    keys.REWARD_RAW_MEAN: 0.4321,
    keys.REWARD_ACC: 0.5123,
    keys.VAL_ACC: 0.9512,
    keys.VAL_ACC_STDERR: 0.0123,
    keys.DS_KEEP_RATE: 0.6875,
    keys.RESPONSE_LENGTH_MEAN: 12345.6,
    keys.STEP_TIME_S: 1234.5,
}


@pytest.mark.parametrize("terminal", [False, True], ids=["log-lines", "bar"])
def test_every_progress_line_fits_80_columns(monkeypatch, terminal):
    # A long run late on: six-digit counts, every headline column, days of elapsed time and
    # an ETA of weeks. Before: 142-character log lines ("elapsed=3 days, 0:00:00
    # eta=262962 days, ...") and a bar that tqdm cut mid-value ("... val_acc").
    monkeypatch.setenv("COLUMNS", "80")
    stream = FakeTerminal() if terminal else io.StringIO()
    with StepProgress(100000, start_step=12345, enabled=True, stream=stream) as progress:
        assert progress.uses_bar == terminal
        progress._t0 -= 3 * 86400
        progress.update(12346, LONG_STEP)
        progress.update(23456, {**LONG_STEP, keys.VAL_ACC: 0.5})
    lines = [line for line in stream.getvalue().replace("\r", "\n").splitlines() if line.strip()]
    assert lines and max(len(line) for line in lines) <= 80, lines
    last = lines[-1]
    assert "23456/100000" in last and "acc=0.512" in last
    # Whole columns are dropped, never a value cut in half.
    columns = last.split(", ", 1)[1].split() if terminal else last.split()[2:]
    assert columns and all(c.partition("=")[2] for c in columns), last
    if not terminal:
        assert last.endswith("eta=20d16h") and "val_acc=0.5±0.012" in last


def test_a_wide_terminal_keeps_every_column(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    stream = io.StringIO()
    with StepProgress(100000, start_step=12345, enabled=False, stream=stream) as progress:
        progress.update(12346, LONG_STEP)
    line = stream.getvalue().strip()
    for part in ("reward=0.432", "keep=0.688", "len=12346", "step_s=1234", "elapsed=", "eta="):
        assert part in line
