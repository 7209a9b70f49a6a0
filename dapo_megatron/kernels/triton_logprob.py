"""Fused Triton kernels for vocab-parallel token logprobs (and entropy) from hidden states.

Same contract and numerics as :mod:`.chunked` (read its module docstring and the backward
derivation there); the fp32 ``[N, V]`` logits are never materialised:

  * forward (:func:`_forward_kernel`): program (token block, vocab split) loops over the
    vocab blocks of its split's contiguous range, computes the logit tile
    ``H_blk @ W_blk^T / T`` (``tl.dot``, fp32 accumulation over H in blocks) and folds it
    into online per-row statistics: the local max ``m_r``, ``sum exp(z - m_r)``,
    ``sum exp(z - m_r) (z - m_r)`` and the target logit. Programs are rastered GROUP_M token
    blocks at a time, so a wave shares its hidden-state panels in L2 while it streams S
    vocab ranges. Only O(S N) statistics are written; they are combined over the splits and
    then over the TP group in torch (:func:`.chunked.combine_shard_statistics`, two
    collectives per call).
  * backward, per chunk of vocab columns (a ``[N, chunk]`` dz buffer of at most
    DZ_CHUNK_BYTES): :func:`_dlogits_kernel` recomputes each logit tile and writes
    ``dz`` (the formula of :class:`.chunked.ChunkedLinearLogprob`) in the input dtype; then
    two GEMMs (:func:`_matmul_kernel`, fp32 accumulation): ``dW[chunk] = dz^T H``, written
    once in the weight dtype, and ``dH += dz W[chunk]`` into an fp32 accumulator. Every
    output tile has one owning program and a fixed summation order (no atomics), so dH and
    dW are bitwise deterministic. The work is exactly the three GEMMs of the problem
    (logits, dH, dW); the extra traffic is the dz chunk (written once, read twice) and one
    read and write of the fp32 dH per chunk (bench/kernels.py models both).

The kernels, their tiles, warps and stages per target (``_FWD_TILES``, ``_DZ_TILES``,
``_MATMUL_TILES``: the first candidate is launched) and :func:`compile_specs`, which lists
every launch for the ahead-of-time compile check (tests/kernels/test_compile.py: registers,
spills, tensor-core instructions, shared memory on sm_90 and sm_80), are in
:mod:`.triton_logprob_kernels`.

Supported inputs: fp16 / bf16 / fp32 (fp64 stays on the chunked path, which gradchecks).
fp32 inputs use IEEE fp32 dots (not TF32) so they match the chunked path to ~1e-6;
low-precision inputs feed the tensor cores in their own dtype, and ``dz`` is rounded to
that dtype for the two backward GEMMs (the usual fused-kernel trade-off; the statistics and
all accumulation stay fp32).

The kernels use only ops the Triton interpreter (``TRITON_INTERPRET=1``) supports, so the
CPU test suite checks them against the float64 reference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import triton

from dapo_megatron.kernels.chunked import (
    _all_reduce,
    _local_targets,
    _TensorOptions,
    combine_shard_statistics,
)
from dapo_megatron.kernels.triton_logprob_kernels import (
    CHUNK_MULTIPLE,
    _dlogits_kernel,
    _forward_kernel,
    _matmul_kernel,
    dz_chunk_columns,
    forward_splits,
    launch_tiles,
    sm_count,
)


def _upcast_dots(t: torch.Tensor) -> bool:
    """Feed bf16 dots fp32 operands: only on CPU (the interpreter), whose bf16 dot is wrong."""
    return t.dtype == torch.bfloat16 and not t.is_cuda


def _combine_splits(part_4SN: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Statistics of the whole shard from the forward's per-split partials ``[4, S, N]``
    (max, sum exp, sum exp (z - m), target logit; same identities as the TP combine)."""
    max_SN, sum_exp_SN, sum_exp_z_SN, target_SN = part_4SN
    if max_SN.shape[0] == 1:
        return max_SN[0], sum_exp_SN[0], sum_exp_z_SN[0], target_SN[0]
    max_N = max_SN.amax(dim=0)
    # An empty split holds m = -1e30 and zero sums: its scale is 0 and shift * s is 0.
    shift_SN = max_SN - max_N
    scale_SN = torch.exp(shift_SN)
    sum_exp_N = (sum_exp_SN * scale_SN).sum(dim=0)
    sum_exp_z_N = ((sum_exp_z_SN + shift_SN * sum_exp_SN) * scale_SN).sum(dim=0)
    return max_N, sum_exp_N, sum_exp_z_N, target_SN.sum(dim=0)


def _matmul(a_MK: torch.Tensor, b_KN: torch.Tensor, c_MN: torch.Tensor, accumulate: bool,
            blocks: tuple[int, int, int] | None) -> None:  # fmt: skip
    """``c (+)= a @ b`` with :func:`_matmul_kernel` (``c`` has unit column stride)."""
    (m, k), n = a_MK.shape, b_KN.shape[1]
    t = launch_tiles(a_MK.device, a_MK.dtype, "matmul", blocks)
    grid = (triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n),)
    _matmul_kernel[grid](
        a_MK, b_KN, c_MN, m, n, k, a_MK.stride(0), a_MK.stride(1), b_KN.stride(0),
        b_KN.stride(1), c_MN.stride(0), ACCUMULATE=accumulate,
        IEEE=a_MK.dtype == torch.float32, UPCAST=_upcast_dots(a_MK), BLOCK_M=t.block_m,
        BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m, num_warps=t.num_warps,
        num_stages=t.num_stages,
    )  # fmt: skip


def _backward_chunks(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    local_tgt_N: torch.Tensor,
    max_N: torch.Tensor,
    log_sum_exp_N: torch.Tensor,
    mean_zm_N: torch.Tensor,
    g_lp_N: torch.Tensor | None,
    g_ent_N: torch.Tensor | None,
    dh_NH: torch.Tensor | None,
    dw_VH: torch.Tensor | None,
    inv_t: float,
    blocks: tuple[int, int, int] | None,
    vocab_chunk: int | None,
) -> None:
    """The backward over vocab chunks (see the module docstring): per chunk, dz in the input
    dtype, then ``dW[chunk] = dz^T H`` and ``dH += dz W[chunk]`` (fp32), in place."""
    n_tokens, n_hidden = hidden_NH.shape
    vocab_local = weight_VH.shape[0]
    elem = hidden_NH.element_size()
    chunk = vocab_chunk or dz_chunk_columns(n_tokens, vocab_local, elem, CHUNK_MULTIPLE)
    chunk = min(chunk, vocab_local)
    dz_NC = torch.empty(n_tokens, chunk, dtype=hidden_NH.dtype, device=hidden_NH.device)
    t = launch_tiles(hidden_NH.device, hidden_NH.dtype, "dz", blocks)
    for c0 in range(0, vocab_local, chunk):
        width = min(chunk, vocab_local - c0)
        w_CH = weight_VH[c0 : c0 + width]
        grid = (triton.cdiv(n_tokens, t.block_m) * triton.cdiv(width, t.block_n),)
        _dlogits_kernel[grid](
            hidden_NH, w_CH, local_tgt_N, max_N, log_sum_exp_N, mean_zm_N,
            g_lp_N if g_lp_N is not None else max_N,  # dummy pointer, never read
            g_ent_N if g_ent_N is not None else max_N,
            dz_NC, n_tokens, width, n_hidden, hidden_NH.stride(0), weight_VH.stride(0),
            dz_NC.stride(0), c0, inv_t,
            HAS_LP=g_lp_N is not None, HAS_ENT=g_ent_N is not None,
            IEEE=hidden_NH.dtype == torch.float32, UPCAST=_upcast_dots(hidden_NH),
            BLOCK_M=t.block_m, BLOCK_V=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m,
            num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip
        dz_chunk = dz_NC[:, :width]
        if dw_VH is not None:
            _matmul(dz_chunk.T, hidden_NH, dw_VH[c0 : c0 + width], False, blocks)
        if dh_NH is not None:
            _matmul(dz_chunk, w_CH, dh_NH, True, blocks)


class TritonLinearLogprob(torch.autograd.Function):
    """autograd.Function behind :func:`triton_linear_logprob` (see the module docstring).

    ``forward`` returns ``logprob_N`` or ``(logprob_N, entropy_N)``; not twice differentiable.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden_NH: torch.Tensor,
        weight_VH: torch.Tensor,
        targets_N: torch.Tensor,
        temperature: float,
        vocab_start: int,
        tp_group: Any,
        compute_entropy: bool,
        reduce_grad_hidden: bool,
        blocks: tuple[int, int, int] | None,
        vocab_chunk: int | None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # The kernels index the hidden dimension with unit stride.
        hidden_NH = hidden_NH.contiguous()
        weight_VH = weight_VH.contiguous()
        n_tokens, n_hidden = hidden_NH.shape
        vocab_local = weight_VH.shape[0]
        local_idx_N, owned_N = _local_targets(targets_N, vocab_start, vocab_local)
        local_tgt_N = torch.where(owned_N, local_idx_N, -1).to(torch.int32)
        stat = _TensorOptions(dtype=torch.float32, device=hidden_NH.device)
        max_r_N = torch.empty(n_tokens, **stat)
        sum_exp_r_N = torch.empty(n_tokens, **stat)
        sum_exp_z_r_N = torch.empty(n_tokens, **stat)
        target_N = torch.empty(n_tokens, **stat)
        if vocab_local == 0:
            # Padding-only shard (see chunked.py): contributes nothing to the combine.
            max_r_N.fill_(torch.finfo(torch.float32).min / 2)
            sum_exp_r_N.zero_()
            sum_exp_z_r_N.zero_()
            target_N.zero_()
        elif n_tokens > 0:
            dev = hidden_NH.device
            t = launch_tiles(dev, hidden_NH.dtype, "fwd", blocks)
            grid_m, grid_v = triton.cdiv(n_tokens, t.block_m), triton.cdiv(vocab_local, t.block_n)
            splits = forward_splits(sm_count(dev), grid_m, grid_v, t.group_m, dev.type == "cuda")
            part_4SN = torch.empty(4, splits, n_tokens, **stat)
            _forward_kernel[(grid_m * splits,)](
                hidden_NH, weight_VH, local_tgt_N, part_4SN[0], part_4SN[1], part_4SN[2], part_4SN[3],
                n_tokens, vocab_local, n_hidden, hidden_NH.stride(0), weight_VH.stride(0),
                triton.cdiv(grid_v, splits) * t.block_n, splits, 1.0 / temperature,
                ENTROPY=compute_entropy, IEEE=hidden_NH.dtype == torch.float32,
                UPCAST=_upcast_dots(hidden_NH), BLOCK_M=t.block_m, BLOCK_V=t.block_n,
                BLOCK_K=t.block_k, GROUP_M=t.group_m, num_warps=t.num_warps, num_stages=t.num_stages,
            )  # fmt: skip
            max_r_N, sum_exp_r_N, sum_exp_z_r_N, target_N = _combine_splits(part_4SN)

        max_N, log_sum_exp_N, mean_zm_N, logprob_N = combine_shard_statistics(
            max_r_N, sum_exp_r_N, sum_exp_z_r_N, target_N, tp_group
        )
        ctx.save_for_backward(hidden_NH, weight_VH, local_tgt_N, max_N, log_sum_exp_N, mean_zm_N)
        ctx.temperature = temperature
        ctx.tp_group = tp_group
        ctx.compute_entropy = compute_entropy
        ctx.reduce_grad_hidden = reduce_grad_hidden
        ctx.blocks = blocks
        ctx.vocab_chunk = vocab_chunk
        ctx.set_materialize_grads(False)
        if not compute_entropy:
            return logprob_N
        entropy_N = (log_sum_exp_N - mean_zm_N).clamp_(min=0.0)
        return logprob_N, entropy_N

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        # dz formula and its derivation: ChunkedLinearLogprob.backward.
        hidden_NH, weight_VH, local_tgt_N, max_N, log_sum_exp_N, mean_zm_N = ctx.saved_tensors
        grad_lp_N = grads[0]
        grad_ent_N = grads[1] if ctx.compute_entropy else None
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_lp_N is None and grad_ent_N is None) or not (need_dh or need_dw):
            return (None,) * 10

        n_tokens, n_hidden = hidden_NH.shape
        vocab_local = weight_VH.shape[0]
        inv_t = 1.0 / ctx.temperature
        g_lp_N = None if grad_lp_N is None else grad_lp_N.float().mul(inv_t).contiguous()
        g_ent_N = None if grad_ent_N is None else grad_ent_N.float().mul(inv_t).contiguous()
        dev = hidden_NH.device
        dh_NH = (
            torch.zeros(n_tokens, n_hidden, dtype=torch.float32, device=dev) if need_dh else None
        )
        dw_VH = torch.zeros_like(weight_VH) if need_dw else None
        if vocab_local > 0 and n_tokens > 0:
            _backward_chunks(
                hidden_NH, weight_VH, local_tgt_N, max_N, log_sum_exp_N, mean_zm_N, g_lp_N,
                g_ent_N, dh_NH, dw_VH, inv_t, ctx.blocks, ctx.vocab_chunk,
            )  # fmt: skip

        dh_out = None
        if dh_NH is not None:
            # The hidden input is replicated over the TP group: its gradient is the sum over
            # shards, unless the caller's own TP region op reduces it (see chunked.py).
            if ctx.reduce_grad_hidden:
                _all_reduce(dh_NH, dist.ReduceOp.SUM, ctx.tp_group)
            dh_out = dh_NH.to(hidden_NH.dtype)
        return dh_out, dw_VH, None, None, None, None, None, None, None, None


def triton_linear_logprob(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    targets_N: torch.Tensor,
    *,
    temperature: float,
    vocab_start: int,
    tp_group: Any,
    compute_entropy: bool,
    reduce_grad_hidden: bool = True,
    blocks: tuple[int, int, int] | None = None,
    vocab_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Fused Triton logprob/entropy; inputs are assumed valid (see ``dispatch.linear_logprob``).

    Args:
        hidden_NH: ``[N, H]`` fp16/bf16/fp32 hidden states, replicated on every rank of
            ``tp_group``; CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.
        weight_VH: ``[V_local, H]`` this rank's vocab shard, same dtype as ``hidden_NH``.
        targets_N: ``[N]`` int64 GLOBAL token ids.
        temperature: logits are ``h W^T / temperature``.
        vocab_start: global id of ``weight_VH[0]``.
        tp_group: process group sharding the vocab, or None for a single process.
        compute_entropy: also return the entropy.
        reduce_grad_hidden: all-reduce the hidden-state gradient over ``tp_group``.
        blocks: ``(BLOCK_M, BLOCK_V, BLOCK_K)`` tile sizes (powers of two, >= 16); None picks
            them per device. Tests use small ones to cover multi-block loops and tails.
        vocab_chunk: vocab columns per backward chunk (the dz buffer is ``[N, chunk]``);
            None: a buffer of at most DZ_CHUNK_BYTES. Tests use small ones.

    Returns:
        ``(logprob_N, entropy_N or None)`` in fp32; ``logprob_N <= 0``, ``entropy_N >= 0``.
    """
    out = TritonLinearLogprob.apply(
        hidden_NH,
        weight_VH,
        targets_N,
        temperature,
        vocab_start,
        tp_group,
        compute_entropy,
        reduce_grad_hidden,
        blocks,
        vocab_chunk,
    )
    if compute_entropy:
        return out[0], out[1]
    return out, None
