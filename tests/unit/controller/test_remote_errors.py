"""A failed worker call's error carries the worker's traceback; a local cluster's GPUs."""

from __future__ import annotations

import traceback

import ray
import torch

from dapo_megatron.controller import cluster, remote


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


def test_local_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cluster.local_gpus("cuda") == 2
    assert cluster.local_gpus("cpu") is None  # Ray's own count, as before
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert cluster.local_gpus("cuda") is None


def test_init_local_declares_gpus_only_on_cuda(monkeypatch):
    seen: list[dict] = []
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: seen.append(kw))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cluster._init_local(num_cpus=2, device="cpu")
    cluster._init_local(num_cpus=2, device="cuda")
    assert [kw["num_gpus"] for kw in seen] == [None, 1]
    assert seen[0]["object_store_memory"] == 256 * 1024 * 1024 and seen[0]["num_cpus"] == 2
