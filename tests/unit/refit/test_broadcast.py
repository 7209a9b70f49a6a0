"""The refit's gloo broadcast (refit/broadcast.py, the CPU twin of the NCCL path).

The transport runs a real weight group of one sender and several receivers (threads of
this process, each with its own gloo process group, exactly as separate processes would
build it) and compares every received tensor bit for bit with what was sent."""

from __future__ import annotations

import pytest
import torch

from dapo_megatron.refit.broadcast import receive_buckets, send_buckets
from dapo_megatron.refit.buckets import plan_buckets
from dapo_megatron.refit.group import WeightGroup
from dapo_megatron.refit.stats import TransferStats
from unit.refit.weight_groups import _run_members


def _run_group(world: int, sender, receiver) -> list:
    """Run sender (rank 0) and receivers (ranks 1..world-1) concurrently; their results."""
    return _run_members(world, lambda rank, group: sender(group) if rank == 0 else receiver(group))


@pytest.mark.parametrize("bucket_bytes", [256, 4096, 1 << 20])
def test_broadcast_delivers_every_tensor_bit_exactly(bucket_bytes: int) -> None:
    torch.manual_seed(1)
    shapes = [(17, 9), (9,), (64, 33), (1,), (300,), (5, 5, 5)]
    sent = [(f"layer.{i}.weight", torch.randn(*s)) for i, s in enumerate(shapes)]
    layout = plan_buckets([(n, t.shape) for n, t in sent], torch.bfloat16, bucket_bytes)

    def sender(group: WeightGroup) -> TransferStats:
        return send_buckets(iter(sent), layout, group, device="cpu")

    def receiver(group: WeightGroup) -> list:
        stats = TransferStats()
        got = [(n, t.clone()) for n, t in receive_buckets(layout, group, device="cpu", stats=stats)]
        return [got, stats]

    results = _run_group(3, sender, receiver)
    send_stats = results[0]
    assert send_stats.buckets == len(layout.buckets) and send_stats.tensors == len(sent)
    # The exporter holds one bucket buffer (plus the tensor being produced).
    assert send_stats.buffer_bytes == layout.max_bucket_bytes
    if bucket_bytes == 256:
        assert len(layout.buckets) > 3  # the small bucket really splits the model
    for got, stats in results[1:]:
        assert [n for n, _ in got] == [n for n, _ in sent]
        for (_, want), (_, have) in zip(sent, got, strict=True):
            assert torch.equal(have, want.to(torch.bfloat16))
        assert stats.bytes == sum(b.nbytes for b in layout.buckets)
        assert stats.buffer_bytes <= 2 * layout.max_bucket_bytes


def test_export_that_disagrees_with_the_plan_fails_loudly() -> None:
    layout = plan_buckets([("a", (4,)), ("b", (4,))], torch.float32, 1 << 20)

    def sender(group: WeightGroup) -> None:
        send_buckets(iter([("a", torch.ones(4))]), layout, group, device="cpu")

    def receiver(group: WeightGroup) -> None:
        return None  # never posts a receive: the sender fails before broadcasting

    with pytest.raises(ValueError, match="export ended after 1 tensors; the bucket layout has 2"):
        _run_group(2, sender, receiver)
