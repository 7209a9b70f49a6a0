"""dapo_megatron.device.collectives on two real gloo ranks: every wrapper, results on every rank.

The device choice itself (NCCL -> CUDA) is tested with a faked backend in
tests/unit/device/test_collectives.py; this checks the wrappers' semantics across processes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from launch import run_distributed

from dapo_megatron.device import collectives

pytestmark = pytest.mark.distributed


def _two_ranks() -> dict[str, Any]:
    dist.init_process_group("gloo", init_method="env://")
    try:
        rank = dist.get_rank()
        out: dict[str, Any] = {}
        t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
        collectives.all_reduce(t)
        out["sum"] = t.tolist()
        m = torch.tensor([float(rank)])
        collectives.all_reduce(m, collectives.MAX)
        out["max"] = m.item()
        b = torch.tensor([rank + 100])
        collectives.broadcast(b, src=1)
        out["broadcast"] = b.item()
        parts = [torch.zeros(2, dtype=torch.int64) for _ in range(2)]
        collectives.all_gather(parts, torch.tensor([rank, rank * 2]))
        out["all_gather"] = [p.tolist() for p in parts]
        full = torch.zeros(4)
        collectives.all_gather_into_tensor(full, torch.tensor([rank, -rank], dtype=torch.float32))
        out["all_gather_into_tensor"] = full.tolist()
        values = collectives.reduce_values({"n": rank + 1, "x": torch.tensor(0.5)})
        out["reduce_values"] = {k: float(v) for k, v in values.items()}
        holder: list[Any] = [{"from": rank}]
        collectives.broadcast_object_list(holder, src=0)
        out["object"] = holder[0]
        everyone: list[Any] = [None, None]
        collectives.all_gather_object(everyone, rank * 3)
        out["all_gather_object"] = everyone
        shares: list[Any] | None = [None, None] if rank == 0 else None
        collectives.gather_object(f"r{rank}", shares, dst=0)
        out["gather_object"] = shares
        collectives.barrier()
        return out
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks():
    results = run_distributed(_two_ranks, 2, timeout=120)
    for rank, out in enumerate(results):
        assert out["sum"] == [3.0, 30.0]
        assert out["max"] == 1.0
        assert out["broadcast"] == 101
        assert out["all_gather"] == [[0, 0], [1, 2]]
        assert out["all_gather_into_tensor"] == [0.0, 0.0, 1.0, -1.0]
        assert out["reduce_values"] == {"n": 3.0, "x": 1.0}
        assert out["object"] == {"from": 0}
        assert out["all_gather_object"] == [0, 3]
        assert out["gather_object"] == (["r0", "r1"] if rank == 0 else None)
