"""controller/actors/remote.py: a failed worker call's error carries the worker's traceback."""

from __future__ import annotations

import traceback

import ray

from dapo_megatron.controller.actors import remote


def _task_error(trace: str | None = None) -> ray.exceptions.RayTaskError:
    try:
        raise ValueError("bad shape [3, 4]")
    except ValueError as err:
        return ray.exceptions.RayTaskError(
            "PolicyWorker.train_step", trace or traceback.format_exc(), err
        )


def test_raised_text_keeps_the_one_line_and_adds_the_worker_traceback():
    text = remote.raised_text("policy rank 1 (tp_rank 0)", _task_error())
    first, *rest = text.splitlines()
    assert first == "policy rank 1 (tp_rank 0) raised: ValueError('bad shape [3, 4]')"
    assert rest[0] == "  worker traceback:"
    assert any("_task_error" in line for line in rest)  # the worker's frame
    assert rest[-1] == "  | ValueError: bad shape [3, 4]"


def test_raised_text_keeps_the_end_of_a_long_traceback():
    trace = "".join(f"  File frame{i}.py\n" for i in range(2000)) + "ValueError: last\n"
    text = remote.raised_text("engine 0", _task_error(trace))
    assert text.splitlines()[-1] == "  | ValueError: last"
    assert "frame0.py" not in text
    assert len(text) < remote.WORKER_TRACEBACK_CHARS + 2000  # the prefixes added per line
