"""The weight group's host-side handshake (refit/group.py).

A sender that starts long after its receivers (a train step at
``rollout.max_staleness >= 1``): the receivers post no collective before it is ready, and
give up when it never starts."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from dapo_megatron.refit.broadcast import receive_buckets, send_buckets
from dapo_megatron.refit.buckets import plan_buckets
from dapo_megatron.refit.group import GroupAddress, WeightGroup
from dapo_megatron.refit.ipc import SharedBuffer, receive_shared, send_shared
from dapo_megatron.workers.policy_worker import free_port
from unit.refit.weight_groups import _run_members

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
    layout = plan_buckets([(n, t.shape) for n, t in sent], torch.float32, 256)
    exporters = 2 if transport == "shared" else 1
    buffers = [SharedBuffer.create(layout.max_bucket_bytes, "cpu") for _ in range(exporters)]
    ready: list[float] = []
    first_collective: dict[int, float] = {}

    def role(rank: int, group: WeightGroup):
        if rank < exporters:
            time.sleep(_SENDER_DELAY_S)  # the policy's train step
            ready.append(time.monotonic())
            if transport == "shared":
                return send_shared(iter(sent), layout, group, buffers[rank])
            return send_buckets(iter(sent), layout, group, device="cpu")
        name = "barrier" if transport == "shared" else "broadcast"
        collective = getattr(group, name)

        def recorded(*args, **kwargs):
            first_collective.setdefault(rank, time.monotonic())
            return collective(*args, **kwargs)

        setattr(group, name, recorded)
        if transport == "shared":
            mapped = SharedBuffer.open(buffers[0].handle)
            received = receive_shared(layout, group, mapped, device="cpu")
        else:
            received = receive_buckets(layout, group, device="cpu")
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
