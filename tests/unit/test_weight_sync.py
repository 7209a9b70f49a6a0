"""The refit's bucket protocol and its gloo transport (the CPU twin of the NCCL path).

The plan is checked against hand-computed offsets; the transport runs a real weight group
of one sender and several receivers (threads of this process, each with its own gloo
process group, exactly as separate processes would build it) and compares every received
tensor bit for bit with what was sent. A sender that starts long after its receivers (a
train step at ``rollout.max_staleness >= 1``) checks the transfer's host-side handshake.
"""

from __future__ import annotations

import os
import pickle
import threading
import time

import pytest
import torch

from dapo_megatron.refit.broadcast import receive_buckets, send_buckets
from dapo_megatron.refit.buckets import ALIGN_BYTES, BucketLayout, pack, plan_buckets, unpack
from dapo_megatron.refit.group import GroupAddress, WeightGroup
from dapo_megatron.refit.ipc import SharedBuffer, receive_shared, send_shared
from dapo_megatron.refit.stats import TransferStats
from dapo_megatron.workers.policy_worker import free_port


def test_plan_offsets_are_aligned_and_greedy() -> None:
    # bf16: 2 bytes per element. a: 10 elements = 20 B at 0; b: 30 elements = 60 B at 64
    # (aligned), ending at 124 -> bucket 0 is 128 B. c (100 B) would end at 128 + 100 > 200,
    # so it opens bucket 1. d (1000 B) exceeds the bucket size: alone in bucket 2.
    plan = plan_buckets(
        [("a", (10,)), ("b", (5, 6)), ("c", (50,)), ("d", (500,)), ("e", (1,))],
        torch.bfloat16,
        bucket_bytes=200,
    )
    layout = [[(s.name, s.offset, s.nbytes) for s in b.slots] for b in plan.buckets]
    assert layout == [
        [("a", 0, 20), ("b", 64, 60)],
        [("c", 0, 100)],
        [("d", 0, 1000)],
        [("e", 0, 2)],
    ]
    assert [b.nbytes for b in plan.buckets] == [128, 128, 1024, 64]
    assert all(s.offset % ALIGN_BYTES == 0 for b in plan.buckets for s in b.slots)
    assert plan.total_bytes == 20 + 60 + 100 + 1000 + 2
    assert plan.max_bucket_bytes == 1024
    assert BucketLayout.from_wire(plan.to_wire()) == plan


def test_pack_unpack_round_trip_converts_dtype_and_checks_names() -> None:
    torch.manual_seed(0)
    tensors = [("w", torch.randn(3, 5)), ("b", torch.randn(7))]
    plan = plan_buckets([(n, t.shape) for n, t in tensors], torch.bfloat16, 1 << 20)
    buffer = torch.zeros(plan.max_bucket_bytes, dtype=torch.uint8)
    pack(plan.buckets[0], tensors, buffer)
    for (name, sent), (got_name, got) in zip(tensors, unpack(plan.buckets[0], buffer), strict=True):
        assert got_name == name and got.dtype == torch.bfloat16
        assert torch.equal(got, sent.to(torch.bfloat16))
    with pytest.raises(ValueError, match="bucket layout expects w"):
        pack(plan.buckets[0], [("x", tensors[0][1]), tensors[1]], buffer)
    with pytest.raises(ValueError, match=r"expects b \[7\]"):
        pack(plan.buckets[0], [tensors[0], ("b", torch.randn(8))], buffer)


def _run_group(world: int, sender, receiver) -> list:
    """Run sender (rank 0) and receivers (ranks 1..world-1) concurrently; their results."""
    return _run_members(world, lambda rank, group: sender(group) if rank == 0 else receiver(group))


def _run_members(world: int, role, timeout_s: float = 60.0) -> list:
    """Run ``role(rank, group)`` for every rank of a gloo weight group concurrently (threads
    of this process, each with its own process group); their results, in rank order."""
    address = GroupAddress("127.0.0.1", free_port(), world, "gloo", timeout_s)
    results: list = [None] * world
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            group = WeightGroup(address, rank)
            results[rank] = role(rank, group)
            group.close()
        except BaseException as error:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(error)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("bucket_bytes", [256, 4096, 1 << 20])
def test_broadcast_delivers_every_tensor_bit_exactly(bucket_bytes: int) -> None:
    torch.manual_seed(1)
    shapes = [(17, 9), (9,), (64, 33), (1,), (300,), (5, 5, 5)]
    sent = [(f"layer.{i}.weight", torch.randn(*s)) for i, s in enumerate(shapes)]
    plan = plan_buckets([(n, t.shape) for n, t in sent], torch.bfloat16, bucket_bytes)

    def sender(group: WeightGroup) -> TransferStats:
        return send_buckets(iter(sent), plan, group, device="cpu")

    def receiver(group: WeightGroup) -> list:
        stats = TransferStats()
        got = [(n, t.clone()) for n, t in receive_buckets(plan, group, device="cpu", stats=stats)]
        return [got, stats]

    results = _run_group(3, sender, receiver)
    send_stats = results[0]
    assert send_stats.buckets == len(plan.buckets) and send_stats.tensors == len(sent)
    # The exporter holds one bucket buffer (plus the tensor being produced).
    assert send_stats.buffer_bytes == plan.max_bucket_bytes
    if bucket_bytes == 256:
        assert len(plan.buckets) > 3  # the small bucket really splits the model
    for got, stats in results[1:]:
        assert [n for n, _ in got] == [n for n, _ in sent]
        for (_, want), (_, have) in zip(sent, got, strict=True):
            assert torch.equal(have, want.to(torch.bfloat16))
        assert stats.bytes == sum(b.nbytes for b in plan.buckets)
        assert stats.buffer_bytes <= 2 * plan.max_bucket_bytes


def test_export_that_disagrees_with_the_plan_fails_loudly() -> None:
    plan = plan_buckets([("a", (4,)), ("b", (4,))], torch.float32, 1 << 20)

    def sender(group: WeightGroup) -> None:
        send_buckets(iter([("a", torch.ones(4))]), plan, group, device="cpu")

    def receiver(group: WeightGroup) -> None:
        return None  # never posts a receive: the sender fails before broadcasting

    with pytest.raises(ValueError, match="export ended after 1 tensors; the bucket layout has 2"):
        _run_group(2, sender, receiver)


def test_shared_buffers_deliver_every_tensor_to_every_paired_receiver() -> None:
    """Handle transport, CPU twin of CUDA IPC: 2 exporters (one without a paired worker
    would pass None) and 3 receivers, worker j mapping exporter j % 2's buffer."""
    torch.manual_seed(2)
    shapes = [(33, 7), (5,), (128, 3), (2, 2)]
    sent = [(f"w{i}", torch.randn(*s)) for i, s in enumerate(shapes)]
    plan = plan_buckets([(n, t.shape) for n, t in sent], torch.bfloat16, 600)
    assert len(plan.buckets) > 2
    exporters = [SharedBuffer.create(plan.max_bucket_bytes, "cpu") for _ in range(2)]
    handles = [b.handle for b in exporters]

    def role(rank: int, group: WeightGroup):
        if rank < 2:
            return send_shared(iter(sent), plan, group, exporters[rank])
        buffer = SharedBuffer.open(handles[(rank - 2) % 2])
        got = [(n, t.clone()) for n, t in receive_shared(plan, group, buffer, device="cpu")]
        buffer.close()
        return got

    try:
        results = _run_members(2 + 3, role)
    finally:
        for buffer in exporters:
            buffer.close()
    assert results[0].buckets == len(plan.buckets)
    for got in results[2:]:
        assert [n for n, _ in got] == [n for n, _ in sent]
        for (_, want), (_, have) in zip(sent, got, strict=True):
            assert torch.equal(have, want.to(torch.bfloat16))


def test_an_unlinked_shared_buffer_stays_mapped_and_leaves_no_file() -> None:
    """After the peers map it, the creator removes the shm file's name: the memory is still
    shared both ways, /dev/shm holds nothing a killed process could leak, and a late
    ``open`` fails clearly instead of mapping a fresh file of zeros."""
    creator = SharedBuffer.create(64, "cpu")
    _, path, _ = pickle.loads(creator.handle)
    peer = SharedBuffer.open(creator.handle)
    creator.mapped()[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    creator.unlink()
    assert not os.path.exists(path)
    creator.mapped()[4:8] = torch.tensor([5, 6, 7, 8], dtype=torch.uint8)  # after the unlink
    assert peer.mapped()[:8].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    peer.mapped()[8] = 9
    assert int(creator.mapped()[8]) == 9
    with pytest.raises(FileNotFoundError, match="no longer exists"):
        SharedBuffer.open(creator.handle)
    assert not os.path.exists(path)  # the failed open created nothing
    creator.unlink()  # idempotent
    creator.close()
    peer.close()


# A group timeout far below the sender's delay: a collective posted before the sender is
# ready times out (gloo here; NCCL's watchdog aborts the engine the same way on GPU).
_SHORT_TIMEOUT_S = 2.0
_SENDER_DELAY_S = 2.5 * _SHORT_TIMEOUT_S


def _late_sender_transfer(transport: str) -> tuple[float, list[float]]:
    """One transfer whose exporters start ``_SENDER_DELAY_S`` after the receivers (who are
    waiting already); checks every received tensor. Returns the exporters' ready time and
    each receiver's first collective time."""
    torch.manual_seed(3)
    sent = [(f"w{i}", torch.randn(40 + i)) for i in range(4)]
    plan = plan_buckets([(n, t.shape) for n, t in sent], torch.float32, 256)
    exporters = 2 if transport == "shared" else 1
    buffers = [SharedBuffer.create(plan.max_bucket_bytes, "cpu") for _ in range(exporters)]
    ready: list[float] = []
    first_collective: dict[int, float] = {}

    def role(rank: int, group: WeightGroup):
        if rank < exporters:
            time.sleep(_SENDER_DELAY_S)  # the policy's train step
            ready.append(time.monotonic())
            if transport == "shared":
                return send_shared(iter(sent), plan, group, buffers[rank])
            return send_buckets(iter(sent), plan, group, device="cpu")
        name = "barrier" if transport == "shared" else "broadcast"
        collective = getattr(group, name)

        def recorded(*args, **kwargs):
            first_collective.setdefault(rank, time.monotonic())
            return collective(*args, **kwargs)

        setattr(group, name, recorded)
        if transport == "shared":
            mapped = SharedBuffer.open(buffers[0].handle)
            received = receive_shared(plan, group, mapped, device="cpu")
        else:
            received = receive_buckets(plan, group, device="cpu")
        return [(n, t.clone()) for n, t in received]

    try:
        results = _run_members(exporters + 2, role, timeout_s=_SHORT_TIMEOUT_S)
    finally:
        for buffer in buffers:
            buffer.close()
    for got in results[exporters:]:
        assert [n for n, _ in got] == [n for n, _ in sent]
        assert all(torch.equal(have, want) for (_, want), (_, have) in zip(sent, got, strict=True))
    return min(ready), [first_collective[r] for r in sorted(first_collective)]


@pytest.mark.parametrize("transport", ["broadcast", "shared"])
def test_receivers_post_no_collective_before_a_late_sender_is_ready(transport: str) -> None:
    """Overlapped rollouts: the engines reach their receive while the policy still trains.
    They wait on the group's store, so the transfer completes although the sender starts
    well after the group timeout, and no receiver posted a collective before then."""
    ready, first_collective = _late_sender_transfer(transport)
    assert len(first_collective) == 2
    assert all(t >= ready for t in first_collective), (ready, first_collective)


@pytest.mark.parametrize("transport", ["broadcast", "shared"])
def test_without_the_handshake_a_late_sender_times_the_receivers_out(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control of the test above: without the handshake the receivers' first collective
    is posted at once and times out while the sender still 'trains'."""
    monkeypatch.setattr(WeightGroup, "begin_transfer", lambda self, sender: None)
    with pytest.raises(RuntimeError, match="[Tt]imed out"):
        _late_sender_transfer(transport)


def test_a_receiver_gives_up_when_the_sender_never_starts() -> None:
    """The wait is bounded (``sender_wait_s``): a sender that never sends fails the refit."""
    address = GroupAddress("127.0.0.1", free_port(), 2, "gloo", 10.0, sender_wait_s=0.5)
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        group = WeightGroup(address, rank)
        if rank == 1:
            try:
                group.begin_transfer(0)
            except BaseException as error:  # noqa: BLE001
                errors.append(error)
        group.barrier()  # rank 0 stays until the receiver has given up
        group.close()

    threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(errors) == 1 and isinstance(errors[0], torch.distributed.DistStoreError)
