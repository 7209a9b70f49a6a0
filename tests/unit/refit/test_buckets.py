"""The refit's bucket layout (refit/buckets.py): hand-computed offsets, pack and unpack."""

from __future__ import annotations

import pytest
import torch

from dapo_megatron.refit.buckets import ALIGN_BYTES, BucketLayout, pack, plan_buckets, unpack


def test_layout_offsets_are_aligned_and_greedy() -> None:
    # bf16: 2 bytes per element. a: 10 elements = 20 B at 0; b: 30 elements = 60 B at 64
    # (aligned), ending at 124 -> bucket 0 is 128 B. c (100 B) would end at 128 + 100 > 200,
    # so it opens bucket 1. d (1000 B) exceeds the bucket size: alone in bucket 2.
    layout = plan_buckets(
        [("a", (10,)), ("b", (5, 6)), ("c", (50,)), ("d", (500,)), ("e", (1,))],
        torch.bfloat16,
        bucket_bytes=200,
    )
    slots = [[(s.name, s.offset, s.nbytes) for s in b.slots] for b in layout.buckets]
    assert slots == [
        [("a", 0, 20), ("b", 64, 60)],
        [("c", 0, 100)],
        [("d", 0, 1000)],
        [("e", 0, 2)],
    ]
    assert [b.nbytes for b in layout.buckets] == [128, 128, 1024, 64]
    assert all(s.offset % ALIGN_BYTES == 0 for b in layout.buckets for s in b.slots)
    assert layout.total_bytes == 20 + 60 + 100 + 1000 + 2
    assert layout.max_bucket_bytes == 1024
    assert BucketLayout.from_wire(layout.to_wire()) == layout


def test_pack_unpack_round_trip_converts_dtype_and_checks_names() -> None:
    torch.manual_seed(0)
    tensors = [("w", torch.randn(3, 5)), ("b", torch.randn(7))]
    layout = plan_buckets([(n, t.shape) for n, t in tensors], torch.bfloat16, 1 << 20)
    buffer = torch.zeros(layout.max_bucket_bytes, dtype=torch.uint8)
    pack(layout.buckets[0], tensors, buffer)
    for (name, sent), (got_name, got) in zip(
        tensors, unpack(layout.buckets[0], buffer), strict=True
    ):
        assert got_name == name and got.dtype == torch.bfloat16
        assert torch.equal(got, sent.to(torch.bfloat16))
    with pytest.raises(ValueError, match="bucket layout expects w"):
        pack(layout.buckets[0], [("x", tensors[0][1]), tensors[1]], buffer)
    with pytest.raises(ValueError, match=r"expects b \[7\]"):
        pack(layout.buckets[0], [tensors[0], ("b", torch.randn(8))], buffer)
