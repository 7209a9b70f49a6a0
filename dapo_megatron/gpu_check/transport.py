"""Sections of the GPU check: the refit's handle transport, the collectives, the memory release.

``ipc_transport``: two processes, an exporter and a receiver, run the colocated refit's
handle transport (``refit.ipc``) exactly as a policy rank and an engine worker do:
a gloo weight group for the per-bucket barriers, one shared buffer created by the exporter
(CUDA IPC on a GPU, a shared-memory file on CPU: the twin), the handle passed as bytes. The
exporter packs deterministic tensors (one larger than a bucket, so it travels alone); the
receiver regenerates them from the same seeds and compares every byte.

``collectives``: ``dapo_megatron.device.collectives.self_check`` on a one-rank process group of the
device's production backend (NCCL on GPU, gloo on CPU), every wrapper called with CPU input
tensors and the real collective issued even at world size 1 (communication forced).

``memory_release``: the colocated phase change. A training-sized peak is allocated and freed
(the caching allocator keeps it reserved: what a vLLM engine waking in another process
cannot use), then ``release_cached_memory`` must hand it back to the driver.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import torch

_SHAPES = [(4096, 1024), (151936, 1024), (1024,), (3, 5, 7), (8192, 2048)]
"""Tensors of the transport check (bf16): the second (297 MiB) outgrows a 64 MiB bucket."""
_CPU_SHAPES = [(256, 64), (4096, 256), (64,), (3, 5, 7), (512, 128)]


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _tensor(index: int, shape: tuple[int, ...], device: str) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(1000 + index)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _transport_member(
    rank: int,
    port: int,
    shapes: list[tuple[int, ...]],
    bucket_bytes: int,
    handles: Any,
    queue: Any,
) -> None:
    """One side of the handle transport (spawned process): the exporter puts its buffer's
    handle on ``handles`` for the receiver; each puts its result on ``queue``."""
    from dapo_megatron.refit.buckets import plan_buckets
    from dapo_megatron.refit.group import GroupAddress, WeightGroup
    from dapo_megatron.refit.ipc import SharedBuffer, receive_shared, send_shared
    from dapo_megatron.refit.stats import TransferStats

    device = _device()
    try:
        names = [(f"w{i}", shape) for i, shape in enumerate(shapes)]
        layout = plan_buckets(names, torch.bfloat16, bucket_bytes)
        group = WeightGroup(GroupAddress("127.0.0.1", port, 2, "gloo", 120.0), rank)
        if rank == 0:
            buffer = SharedBuffer.create(layout.max_bucket_bytes, device)
            handles.put(buffer.handle)
            weights = ((f"w{i}", _tensor(i, shape, device)) for i, shape in enumerate(shapes))
            stats = send_shared(weights, layout, group, buffer)
            group.barrier()  # the receiver has checked every byte before the buffer goes
            buffer.close()
            queue.put(("sender", {"seconds": stats.seconds, "buckets": stats.buckets}))
        else:
            handle = handles.get(timeout=60)
            buffer = SharedBuffer.open(handle)
            recv_stats = TransferStats()
            mismatched = []
            checking = 0.0  # time spent regenerating and comparing, left out of the rate
            start = time.perf_counter()
            for name, tensor in receive_shared(
                layout, group, buffer, device=device, stats=recv_stats
            ):
                check_start = time.perf_counter()
                index = int(name[1:])
                want = _tensor(index, shapes[index], device)
                same = tensor.shape == want.shape and torch.equal(
                    tensor.view(torch.uint8), want.view(torch.uint8)
                )
                if not same:
                    mismatched.append(name)
                checking += time.perf_counter() - check_start
            seconds = time.perf_counter() - start - checking
            group.barrier()
            buffer.close()
            queue.put(
                (
                    "receiver",
                    {
                        "tensors": recv_stats.tensors,
                        "buckets": recv_stats.buckets,
                        "bytes": recv_stats.bytes,
                        "seconds": seconds,
                        "mismatched": mismatched,
                    },
                )
            )
        group.close()
    except Exception as exc:  # reported to the parent, which raises it
        queue.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def ipc_section() -> dict[str, Any]:
    """The two-process handle transport, byte-exact (module docstring)."""
    import torch.multiprocessing as mp

    device = _device()
    shapes = _SHAPES if device == "cuda" else _CPU_SHAPES
    bucket_bytes = 64 * 2**20 if device == "cuda" else 2**18
    ctx = mp.get_context("spawn")
    queue, handles = ctx.Queue(), ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_transport_member, args=(r, port, shapes, bucket_bytes, handles, queue))
        for r in (0, 1)
    ]
    for proc in procs:
        proc.start()
    results: dict[str, Any] = {}
    try:
        while len(results) < 2:
            kind, value = queue.get(timeout=100)
            if kind == "error":
                raise RuntimeError(value)
            results[kind] = value
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    recv = results["receiver"]
    assert not recv["mismatched"], f"bytes differ after the transport: {recv['mismatched']}"
    assert recv["tensors"] == len(shapes), recv
    return {
        "device": device,
        "transport": "cuda_ipc" if device == "cuda" else "shm_file (CPU twin)",
        "tensors": recv["tensors"],
        "buckets": recv["buckets"],
        "mib": round(recv["bytes"] / 2**20, 1),
        "receiver_gb_s_without_check": round(recv["bytes"] / max(recv["seconds"], 1e-9) / 1e9, 2),
        "byte_exact": True,
    }


def collectives_section() -> dict[str, Any]:
    """``collectives.self_check`` on a one-rank group of the production backend."""
    import torch.distributed as dist

    from dapo_megatron.device import collectives

    device = _device()
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        result = collectives.self_check(device)
    finally:
        dist.destroy_process_group()
    return {"backend": backend, **result}


def memory_release_section(peak_gib: float = 8.0) -> dict[str, Any] | str:
    """A freed training peak stays reserved until ``release_cached_memory`` (module docstring)."""
    if not torch.cuda.is_available():
        return "needs CUDA: the CPU has no caching allocator (tests/unit fake the CUDA calls to check the order)"
    from dapo_megatron.device.memory_release import release_cached_memory

    gib = 2**30
    blocks = [
        torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(int(peak_gib * 4))
    ]
    for block in blocks:
        block.fill_(1)
    del blocks, block
    kept = torch.cuda.memory_reserved()
    free_kept, _ = torch.cuda.mem_get_info()
    released = release_cached_memory("gpu-check")
    after = torch.cuda.memory_reserved()
    free_after, _ = torch.cuda.mem_get_info()
    figures = {
        "peak_gib": peak_gib,
        "reserved_after_free_gib": round(kept / gib, 2),
        "reserved_after_release_gib": round(after / gib, 2),
        "driver_free_gain_gib": round((free_after - free_kept) / gib, 2),
        "release_result": released,
    }
    assert kept >= 0.9 * peak_gib * gib, f"the allocator did not keep the freed peak: {figures}"
    assert after <= 0.1 * gib and free_after - free_kept >= 0.9 * peak_gib * gib, figures
    return figures
