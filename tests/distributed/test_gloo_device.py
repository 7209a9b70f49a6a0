"""Megatron's process groups on one gloo transport device (megatron/gloo_device.py).

Each gloo TCP device polls in a thread of its own; with a device per group a CPU rank ran
~20 of them. After ``initialize_parallel`` every group must work (collectives over the TP,
DP, model-parallel and gloo DP groups give the hand-computed sums) while the rank has a
single gloo polling thread, and groups created afterwards get torch's default again.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from launch import run_distributed

from dapo_megatron.config.parallel import ParallelDims

pytestmark = pytest.mark.distributed


def _gloo_loop_threads() -> int:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:  # a thread that just ended
            continue
    return names.count("gloo_tcp_loop")


def _collectives(tp: int, dp: int) -> dict:
    from megatron.core import parallel_state as ps

    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel

    initialize_parallel(ParallelDims(tp, 1, 1, dp, False), seed=0)
    rank = dist.get_rank()
    groups = {
        "world": None,
        "tp": ps.get_tensor_model_parallel_group(),
        "dp": ps.get_data_parallel_group(),
        "mp": ps.get_model_parallel_group(),
        "dp_gloo": ps.get_data_parallel_group_gloo(),
    }
    sums = {}
    for name, group in groups.items():
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value, group=group)
        sums[name] = value.item()
    loops = _gloo_loop_threads()
    # Outside initialize_parallel, torch's default again: a device (and thread) per group.
    extra = [dist.new_group(list(range(tp * dp)), backend="gloo") for _ in range(2)]
    for group in extra:
        dist.barrier(group=group)
    loops_after = _gloo_loop_threads()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    is_gloo = isinstance(backend, dist.ProcessGroupGloo)
    destroy_parallel()
    return {"sums": sums, "loops": loops, "loops_after": loops_after, "is_gloo": is_gloo}


@pytest.mark.parametrize(("tp", "dp", "ifname"), [(2, 2, None), (1, 2, "lo")])
def test_every_megatron_group_works_on_one_polling_thread(
    tp: int, dp: int, ifname: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ifname``: GLOO_SOCKET_IFNAME, as multi-node runs set it (the device per interface
    path of torch's constructor; the loopback interface exists everywhere)."""
    if ifname is None:
        monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    else:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", ifname)
    results = run_distributed(_collectives, tp * dp, tp, dp)
    for rank, got in enumerate(results):
        tp_rank, dp_rank = rank % tp, rank // tp  # Megatron's order: TP fastest
        tp_peers = [dp_rank * tp + t for t in range(tp)]
        dp_peers = [d * tp + tp_rank for d in range(dp)]
        want = {
            "world": float(sum(r + 1 for r in range(tp * dp))),
            "tp": float(sum(r + 1 for r in tp_peers)),
            "dp": float(sum(r + 1 for r in dp_peers)),
            "mp": float(sum(r + 1 for r in tp_peers)),  # pp = 1: model parallel = TP
            "dp_gloo": float(sum(r + 1 for r in dp_peers)),
        }
        assert got["sums"] == want, (rank, got["sums"], want)
        assert got["loops"] == 1, f"rank {rank}: {got['loops']} gloo polling threads"
        assert got["loops_after"] == 3, "groups made later should get devices of their own"
        assert got["is_gloo"]
