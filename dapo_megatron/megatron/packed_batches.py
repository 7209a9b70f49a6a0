"""Micro-batches (``MicroBatch``) and the packed (THD) ones for the logprob and train passes
(data/packing.py's layout); policy_step.py builds the padded ones.

A packed micro-batch feeds the model one row of concatenated sequences with
``PackedSeqParams(qkv_format="thd")``; everything the loss needs is gathered back into
per-row ``[n, W]`` tensors (``row_index``), so the loss, its global normaliser and its
per-sequence modes are those of the padded path: packing changes where the tokens sit in
the forward pass, not what is computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams

from dapo_megatron.config.parallel import ParallelDims, sequence_multiple
from dapo_megatron.data.pack_plan import plan_packs
from dapo_megatron.data.packing import (
    PackLayout,
    make_layout,
    pack_tokens,
    positions,
    unpack_predictions,
)
from dapo_megatron.megatron.context_parallel import gather_packed_from_context_parallel
from dapo_megatron.megatron.routing_replay import packed_router_order
from dapo_megatron.shared.batch import PolicyBatch


def pad_multiple(dims: ParallelDims) -> int:
    """Sequence lengths must split into 2*CP chunks, each divisible by TP under SP."""
    return sequence_multiple(tp=dims.tp, cp=dims.cp, sequence_parallel=dims.sequence_parallel)


def row_lengths(batch: PolicyBatch) -> list[int]:
    """Real tokens of each row (the whole row when the batch does not say)."""
    if batch.lengths is None:
        return [batch.seq_len] * len(batch)
    return [int(n) for n in batch.lengths.tolist()]


def _shift(t: torch.Tensor) -> torch.Tensor:
    """Token-aligned packed ``[T]`` -> prediction-aligned (out[p] = t[p + 1], last 0). Across a
    segment boundary this reads the next sequence's first token, whose mask is always 0."""
    return torch.cat([t[1:], t.new_zeros(1)])


def compute_device() -> torch.device:
    """Where the model computes: this rank's CUDA device, or the CPU without CUDA."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch: the model's inputs and the loss's per-row tensors, on the compute
    device and CP-local. Padded: ``b`` rows of ``S_local`` tokens, and the loss's rows are the
    model's rows. Packed: one model row of concatenated sequences, and the loss's ``n`` rows
    of width ``W`` are gathered back from it by ``row_index``. Loss tensors are
    prediction-aligned (see policy_step.py)."""

    input_ids: torch.Tensor
    """``[b, S_local]`` token ids the model reads (``[1, T_local]`` when packed)."""
    position_ids: torch.Tensor
    """``[b, S_local]`` positions, restarting at 0 for each packed sequence."""
    labels: torch.Tensor
    """``[b, S_local]`` the token each position predicts (input_ids shifted by one)."""
    mask_BT: torch.Tensor
    """``[B, T]`` float loss mask per loss row."""
    advantages_BT: torch.Tensor | None
    """``[B, T]`` per-token advantages (None in passes without them)."""
    old_logprobs_BT: torch.Tensor | None
    """``[B, T]`` logprobs before the update; None when the batch has none."""
    rollout_logprobs_BT: torch.Tensor | None
    """``[B, T]`` engine logprobs; None when the batch has none."""
    ref_logprobs_BT: torch.Tensor | None
    """``[B, T]`` reference-policy logprobs; None when the batch has none."""
    packed_seq_params: PackedSeqParams | None = None
    """THD sequence boundaries for the attention; None when padded."""
    row_index: torch.Tensor | None = None
    """``[B, T]`` position of each loss-row token in the local pack (-1: none); None when
    padded."""
    layout: PackLayout | None = None
    """Where each sequence sits in the pack; None when padded."""
    routed_experts: torch.Tensor | None = None
    """``[tokens, layers, k]`` the experts to replay for each token this rank's routers see,
    in their order (routing_replay.py); None without routing replay."""

    def loss_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Model outputs ``[b, S_local]`` as the loss's rows ``[B, T]`` (packed: gathered by
        ``row_index``; padded: as they are). Differentiable."""
        if self.row_index is None:
            return values
        return to_rows(values, self.row_index)


@dataclass(frozen=True)
class MicroBatches:
    """The micro-batches of one pass, padded or packed."""

    micro: list[MicroBatch]
    """In schedule order."""
    seq_len: int
    """The schedule's sequence length: the padded length, or the global tokens of the
    largest pack."""
    rows_per_micro: int
    """The schedule's micro-batch size: rows of each model input (1 when packed)."""

    @property
    def packed(self) -> bool:
        """Whether these are packed (THD) micro-batches."""
        return self.micro[0].layout is not None


def packed_micro_batches(batch: PolicyBatch, max_tokens: int, dims: ParallelDims) -> MicroBatches:
    """Pack this rank's rows into micro-batches of at most ``max_tokens`` tokens.

    Under pipeline parallelism every pack is padded to the budget (the stages exchange
    tensors of one shape); otherwise each pack is as long as its rows.
    """
    multiple = pad_multiple(dims)
    lengths = row_lengths(batch)
    packs = plan_packs(lengths, max_tokens, multiple=multiple)
    budget = max_tokens // multiple * multiple
    total = budget if dims.pp > 1 else None
    if not packs:  # only empty rows: one filler pack keeps the schedule (and DDP) in step
        packs, total = [[]], total or multiple
    cp_rank = parallel_state.get_context_parallel_rank() if dims.cp > 1 else 0
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    device = compute_device()
    advantages = batch.advantages
    routed = batch.routed_experts
    micro = []
    for rows in packs:
        layout = make_layout(
            rows,
            [lengths[r] for r in rows],
            multiple=multiple,
            total=total,
            cp_size=dims.cp,
            cp_rank=cp_rank,
        )
        order = layout.local_order()
        # Built on the host with the rest of the layout, then moved with it below.
        row_index = (
            layout.row_index() if rows else torch.zeros((0, 1), dtype=torch.long, device="cpu")
        )

        def local(t: torch.Tensor, _order: torch.Tensor = order) -> torch.Tensor:
            return t[_order][None].to(device)

        def per_row(
            t: torch.Tensor | None,
            _layout: PackLayout = layout,
            _order: torch.Tensor = order,
            _index: torch.Tensor = row_index,
        ) -> torch.Tensor | None:
            if t is None:
                return None
            values = _shift(pack_tokens(_layout, t))[_order]
            return torch.where(_index >= 0, values[_index.clamp(min=0)], 0).to(device)

        ids = pack_tokens(layout, batch.input_ids)
        cu = layout.cu_seqlens().to(device)
        mask_BT = per_row(batch.loss_mask.float())
        assert mask_BT is not None
        micro.append(
            MicroBatch(
                input_ids=local(ids),
                position_ids=local(positions(layout)),
                labels=local(_shift(ids)),
                packed_seq_params=PackedSeqParams(
                    qkv_format="thd",
                    cu_seqlens_q=cu,
                    cu_seqlens_kv=cu,
                    max_seqlen_q=layout.max_seqlen(),
                    max_seqlen_kv=layout.max_seqlen(),
                ),
                row_index=row_index.to(device),
                layout=layout,
                mask_BT=mask_BT,
                advantages_BT=per_row(advantages),
                old_logprobs_BT=per_row(batch.old_logprobs),
                rollout_logprobs_BT=per_row(batch.rollout_logprobs),
                ref_logprobs_BT=per_row(batch.ref_logprobs),
                routed_experts=None
                if routed is None
                else packed_router_order(layout, routed, dims, tp_rank=tp_rank).to(device),
            )
        )
    seq_len = max(_layout(m).total for m in micro)
    return MicroBatches(micro, seq_len, rows_per_micro=1)


def _layout(mb: MicroBatch) -> PackLayout:
    assert mb.layout is not None, "a packed micro-batch has a layout"
    return mb.layout


def to_rows(values_1T: torch.Tensor, row_index: torch.Tensor) -> torch.Tensor:
    """A pack's local ``[1, T_local]`` outputs as per-row ``[n, W]`` (0 where no token);
    differentiable."""
    flat = values_1T.reshape(-1)
    return torch.where(row_index >= 0, flat[row_index.clamp(min=0)], 0)


def unpack_outputs(
    micro: list[MicroBatch], outputs: list[torch.Tensor], shape: tuple[int, int]
) -> torch.Tensor:
    """Token-aligned ``[B, S]`` from each pack's local prediction-aligned ``[1, T_local]``
    outputs (gathered over the CP group first), on the outputs' device: nothing is read back
    to the host here (the caller does it once for the whole batch)."""
    out = torch.zeros(shape, dtype=torch.float32, device=outputs[0].device)
    group = parallel_state.get_context_parallel_group() if _layout(micro[0]).cp_size > 1 else None
    for mb, values in zip(micro, outputs, strict=True):
        layout = _layout(mb)
        local = values.reshape(-1).float()
        full = gather_packed_from_context_parallel(
            local, layout.cu_seqlens(), seq_dim=0, group=group
        )
        unpack_predictions(layout, full, out)
    return out
