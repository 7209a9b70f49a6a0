"""The packed layout (data/packing.py), by hand-derived numbers."""

from __future__ import annotations

import pytest
import torch

from dapo_megatron.config.parallel import padded_length
from dapo_megatron.data.packing import (
    local_order,
    make_layout,
    pack_tokens,
    positions,
    unpack_predictions,
)


def test_cp_local_order_by_hand() -> None:
    # Segments of 8 and 4 tokens, CP2: chunks of 2 and 1; rank 0 holds chunks 0 and 3.
    assert local_order([8, 4], 0, 2).tolist() == [0, 1, 6, 7, 8, 11]
    assert local_order([8, 4], 1, 2).tolist() == [2, 3, 4, 5, 9, 10]
    assert local_order([3, 2], 0, 1).tolist() == [0, 1, 2, 3, 4]


def test_layout_pack_positions_and_unpack() -> None:
    ids = torch.tensor([[11, 12, 13, 0, 0], [21, 22, 0, 0, 0], [31, 32, 33, 34, 35]])
    layout = make_layout([0, 2], [3, 5], multiple=2, total=10)
    # Segments 3 -> 4 and 5 -> 6 (multiple 2), no filler (total 10 = 4 + 6).
    assert layout.seg_lengths == (4, 6) and layout.cu_seqlens().tolist() == [0, 4, 10]
    assert pack_tokens(layout, ids).tolist() == [11, 12, 13, 0, 31, 32, 33, 34, 35, 0]
    assert positions(layout).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5]
    # Per-row [B] values broadcast over the row's real tokens.
    assert pack_tokens(layout, torch.tensor([1.0, 2.0, 3.0])).tolist() == [
        1,
        1,
        1,
        0,
        3,
        3,
        3,
        3,
        3,
        0,
    ]
    # A prediction at packed position p belongs to the token at p + 1 of the same row.
    prediction = torch.arange(10, dtype=torch.float32)
    out = torch.zeros(3, 5)
    unpack_predictions(layout, prediction, out)
    assert out.tolist() == [[0, 0, 1, 0, 0], [0] * 5, [0, 4, 5, 6, 7]]
    with_filler = make_layout([1], [2], multiple=2, total=6)
    assert with_filler.seg_lengths == (2, 4)


def test_row_index_under_context_parallelism() -> None:
    layout = make_layout([0, 1], [7, 3], multiple=4, cp_size=2, cp_rank=1)
    # Segments 8 and 4 (chunks of 2 and 1); rank 1 holds chunks 1 and 2 of each: positions
    # 2-5 of segment 0 and 9, 10 of segment 1.
    assert layout.local_order().tolist() == [2, 3, 4, 5, 9, 10]
    assert layout.row_index().tolist() == [[0, 1, 2, 3], [4, 5, -1, -1]]


def _loop_reference(layout, rows_BS: torch.Tensor, prediction: torch.Tensor, out: torch.Tensor):
    """The packed row, position ids, row index and unpacked predictions written as plain
    per-row loops (what the vectorised helpers must reproduce)."""
    packed = rows_BS.new_zeros(layout.total)
    for row, n, start in zip(layout.rows, layout.lengths, layout.starts, strict=False):
        packed[start : start + n] = rows_BS[row, :n]
        if n > 1:
            out[row, 1:n] = prediction[start : start + n - 1]
    pos = torch.cat([torch.arange(n) for n in layout.seg_lengths])
    order = layout.local_order()
    where = torch.full((layout.total,), -1, dtype=torch.long)
    where[order] = torch.arange(order.numel())
    width = max(n // layout.cp_size for n in layout.seg_lengths[: len(layout.rows)])
    index = torch.full((len(layout.rows), width), -1, dtype=torch.long)
    for i, start in enumerate(layout.starts[: len(layout.rows)]):
        local = where[start : start + layout.seg_lengths[i]]
        local = local[local >= 0]
        index[i, : local.numel()] = local
    return packed, pos, index


@pytest.mark.parametrize(
    ("multiple", "cp_size", "filler"), [(1, 1, False), (4, 2, True), (8, 2, True), (6, 3, False)]
)
def test_vectorised_pack_helpers_match_per_row_loops(multiple, cp_size, filler) -> None:
    gen = torch.Generator().manual_seed(multiple * 10 + cp_size)
    rows_BS = torch.randint(1, 100, (9, 23), generator=gen)
    lengths = torch.randint(1, 24, (9,), generator=gen).tolist()
    rows = [0, 2, 3, 5, 8]
    seg = sum(padded_length(lengths[r], multiple) for r in rows)
    total = seg + 2 * multiple if filler else None
    for cp_rank in range(cp_size):
        layout = make_layout(
            rows,
            [lengths[r] for r in rows],
            multiple=multiple,
            total=total,
            cp_size=cp_size,
            cp_rank=cp_rank,
        )
        prediction = torch.randn(layout.total, generator=gen)
        out, expected_out = torch.zeros(9, 23), torch.zeros(9, 23)
        packed, pos, index = _loop_reference(layout, rows_BS, prediction, expected_out)
        assert torch.equal(pack_tokens(layout, rows_BS), packed)
        assert torch.equal(positions(layout), pos)
        assert torch.equal(layout.row_index(), index)
        unpack_predictions(layout, prediction, out)
        assert torch.equal(out, expected_out)
