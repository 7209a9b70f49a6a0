"""Sequence packing: rows of a batch concatenated into token-budget micro-batches (THD).

A padded micro-batch spends its compute on pad tokens: DAPO responses range from a few
tokens to the response cap, so most of a ``[B, S]`` batch is padding. A *pack* instead
concatenates whole rows (each cut to its real length, then padded only to ``multiple``,
which context and sequence parallelism need) into one row of at most ``max_tokens``
tokens, with ``cu_seqlens`` marking the sequence boundaries; attention never crosses them
and RoPE positions restart in each sequence (megatron/context_parallel.py, Megatron's thd
RoPE).

Layouts (``T`` = tokens of a pack, ``n`` = its rows):

* global packed order: segment i holds row ``rows[i]``'s first ``lengths[i]`` tokens, then
  zeros up to ``seg_lengths[i]``; an optional last filler segment (no row) pads ``T`` to a
  fixed size (pipeline parallelism sends equal shapes);
* under context parallelism every segment is cut into ``2*CP`` equal chunks and CP rank r
  holds chunks ``r`` and ``2*CP-1-r`` of each segment, segment by segment (the
  load-balanced layout of Megatron / Transformer Engine): ``local_order`` gives, for each
  local position, its global packed position;
* ``row_index`` maps each row back: ``[n, W]`` local positions of the row's tokens, in
  sequence order (-1 = none), so per-row loss tensors can be gathered from packed ones and
  the loss keeps its per-sequence semantics.

Pure torch (no Megatron). Which rows go in which pack is decided in data/pack_plan.py
(torch-free: the config validation and the controller use it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from dapo_megatron.config.parallel import padded_length


@dataclass(frozen=True)
class PackLayout:
    """Where the rows of one pack sit, globally and on this CP rank."""

    rows: tuple[int, ...]
    """Batch rows in the pack, in segment order."""
    lengths: tuple[int, ...]
    """Real tokens of each row."""
    seg_lengths: tuple[int, ...]
    """Padded length of every segment, including a final filler segment (no row) if any."""
    cp_size: int
    """Context-parallel size the layout is split for."""
    cp_rank: int
    """This rank's index in the CP group."""

    @property
    def total(self) -> int:
        """Tokens of the pack (global, all CP ranks)."""
        return sum(self.seg_lengths)

    @property
    def starts(self) -> list[int]:
        """Global packed position of each segment's first token."""
        out, pos = [], 0
        for n in self.seg_lengths:
            out.append(pos)
            pos += n
        return out

    def cu_seqlens(self) -> torch.Tensor:
        """int32 ``[segments + 1]`` cumulative padded lengths (global)."""
        return torch.tensor(
            [0, *torch.tensor(self.seg_lengths).cumsum(0).tolist()], dtype=torch.int32
        )

    def max_seqlen(self) -> int:
        return max(self.seg_lengths)

    def local_order(self) -> torch.Tensor:
        """``[T / cp]`` global packed position of each of this rank's local positions."""
        return self._local_order

    @cached_property
    def _local_order(self) -> torch.Tensor:
        return local_order(self.seg_lengths, self.cp_rank, self.cp_size)

    @cached_property
    def token_sources(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where each real token of the pack comes from and goes: ``(row, column,
        position)``, three ``[sum(lengths)]`` long tensors (batch row, column in that row,
        global packed position), segments in order. Built once per pack (a pack's tensors
        are all gathered with it: one indexing op each, not a Python loop per row)."""
        lengths = torch.tensor(self.lengths, dtype=torch.long)
        seg_starts = torch.tensor(self.starts[: len(self.rows)], dtype=torch.long)
        first = torch.cumsum(lengths, 0) - lengths  # each row's first token among the real ones
        column = torch.arange(int(lengths.sum())) - first.repeat_interleave(lengths)
        row = torch.tensor(self.rows, dtype=torch.long).repeat_interleave(lengths)
        return row, column, seg_starts.repeat_interleave(lengths) + column

    def row_index(self) -> torch.Tensor:
        """``[n, W]`` local position of each row's j-th local token (sequence order), -1 for
        none; W is the most local tokens of a row (a padded segment's share)."""
        order = self.local_order()
        where = torch.full((self.total,), -1, dtype=torch.long)
        where[order] = torch.arange(order.numel())
        n = len(self.rows)
        seg = torch.tensor(self.seg_lengths[:n], dtype=torch.long)
        # Under CP a segment's local tokens are an equal share of it, in pack order.
        local = where[: int(seg.sum())]
        held = local >= 0
        counts = seg // self.cp_size
        segment = torch.arange(n).repeat_interleave(seg)[held]
        column = torch.arange(int(counts.sum())) - (
            torch.cumsum(counts, 0) - counts
        ).repeat_interleave(counts)
        out = torch.full((n, int(counts.max())), -1, dtype=torch.long)
        out[segment, column] = local[held]
        return out


def make_layout(
    rows: Sequence[int],
    lengths: Sequence[int],
    *,
    multiple: int,
    total: int | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> PackLayout:
    """The layout of a pack: segment lengths padded to ``multiple`` (a multiple of 2*CP, and
    of TP under SP), plus a filler segment up to ``total`` tokens when given."""
    seg = [padded_length(n, multiple) for n in lengths]
    if total is not None:
        if total < sum(seg) or total % multiple:
            raise ValueError(f"a pack of {sum(seg)} tokens cannot be padded to {total}")
        if total > sum(seg):
            seg.append(total - sum(seg))
    if any(n % (2 * cp_size if cp_size > 1 else 1) for n in seg):
        raise ValueError(f"segment lengths {seg} must be multiples of 2 * CP = {2 * cp_size}")
    return PackLayout(tuple(rows), tuple(lengths), tuple(seg), cp_size, cp_rank)


def local_order(seg_lengths: Sequence[int], cp_rank: int, cp_size: int) -> torch.Tensor:
    """Global packed positions held by CP rank ``cp_rank``: per segment, chunk ``cp_rank``
    then chunk ``2*cp_size-1-cp_rank`` of its ``2*cp_size`` equal chunks."""
    if cp_size == 1:
        return torch.arange(sum(seg_lengths))
    parts, start = [], 0
    for n in seg_lengths:
        chunk = n // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            parts.append(torch.arange(start + c * chunk, start + (c + 1) * chunk))
        start += n
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def pack_tokens(layout: PackLayout, rows_BS: torch.Tensor) -> torch.Tensor:
    """Token-aligned ``[B, S]`` (or ``[B]``, broadcast over the row's tokens) -> the pack's
    global ``[T]`` row: each segment holds its row's first ``length`` values, then zeros."""
    row, column, position = layout.token_sources
    out = rows_BS.new_zeros(layout.total)
    out[position] = rows_BS[row, column] if rows_BS.dim() == 2 else rows_BS[row]
    return out


def positions(layout: PackLayout) -> torch.Tensor:
    """``[T]`` position ids restarting at 0 in every segment."""
    seg = torch.tensor(layout.seg_lengths, dtype=torch.long)
    return torch.arange(layout.total) - (torch.cumsum(seg, 0) - seg).repeat_interleave(seg)


def unpack_predictions(layout: PackLayout, packed_T: torch.Tensor, out_BS: torch.Tensor) -> None:
    """Write a pack's global PREDICTION-aligned values (position p predicts p + 1) into the
    token-aligned ``out_BS`` rows: token t of a row gets the value at its position t - 1."""
    row, column, position = layout.token_sources
    predicted = column > 0  # a row's first token has no prediction
    out_BS[row[predicted], column[predicted]] = packed_T[position[predicted] - 1].to(out_BS.dtype)
