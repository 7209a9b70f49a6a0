"""controller/actors/cluster.py: a local cluster declares its GPUs on CUDA (CPU as before)."""

from __future__ import annotations

import torch

from dapo_megatron.controller.actors import cluster


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
