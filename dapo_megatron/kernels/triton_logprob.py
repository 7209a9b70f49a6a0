"""Fused Triton kernels for vocab-parallel token logprobs (and entropy) from hidden states.

Same contract and numerics as :mod:`.chunked` (read its module docstring and the backward
derivation there), with the logits never leaving on-chip memory:

  * forward: one program per block of tokens loops over this shard's vocabulary in blocks,
    computes the logit tile ``H_blk @ W_blk^T / T`` (``tl.dot``, fp32 accumulation over H in
    blocks) and folds it into online per-row statistics: the local max ``m_r``,
    ``sum exp(z - m_r)``, ``sum exp(z - m_r) (z - m_r)`` and the target logit. Only these
    O(N) statistics are written; they are combined over the TP group in torch with
    :func:`.chunked.combine_shard_statistics` (two collectives per call).
  * backward: one program per (token block, vocab split) walks the vocab blocks of its
    split (blocks ``split, split + S, ...``), recomputes each logit tile, forms ``dz`` with
    the formula of :class:`.chunked.ChunkedLinearLogprob`, and accumulates ``dz @ W_blk``
    into rows of ``dH`` that it alone owns (a ``[S, N, H]`` fp32 partial buffer, summed
    over splits in torch): the summation order of ``dH`` is fixed, so ``dH`` is bitwise
    deterministic run to run. ``dz^T @ H_blk`` is added into ``dW`` with fp32 atomics (one
    kernel recomputing each tile once; the last bits of ``dW`` are not deterministic on a
    GPU). ``S`` is 1 when there are enough token blocks to fill the GPU, so the partial
    buffer is then ``dH`` itself; small batches get more splits for parallelism.

Supported inputs: fp16 / bf16 / fp32 (fp64 stays on the chunked path, which gradchecks).
fp32 inputs use IEEE fp32 dots (not TF32) so they match the chunked path to ~1e-6;
low-precision inputs feed the tensor cores in their own dtype, and ``dz`` is rounded to
that dtype for the two backward dots (the usual fused-kernel trade-off; the statistics and
all accumulation stay fp32).

The kernels use only ops the Triton interpreter (``TRITON_INTERPRET=1``) supports, so the
CPU test suite checks them against the float64 reference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from dapo_megatron.kernels.chunked import (
    _all_reduce,
    _local_targets,
    _TensorOptions,
    combine_shard_statistics,
)

# A finite stand-in for -inf as the initial running max: the online update multiplies the
# old sums by exp(m_old - m_new) and adds (m_old - m_new) * s; with -inf that is -inf * 0.
_NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ b``: IEEE fp32 for fp32 operands (TF32 would cost ~1e-3 relative on
    logits), and fp32 operands under the interpreter, whose bf16 dot returns garbage."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    # A statement-level `if` on a constexpr is resolved at compile time (kept over a ternary).
    if IEEE:  # noqa: SIM108
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def _logit_tile(
    h_ptr,
    w_ptr,
    rows,
    cols,
    row_mask,
    col_mask,
    n_hidden,
    stride_hn,
    stride_wv,
    inv_t,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """``(H[rows] @ W[cols]^T) * inv_t`` as an fp32 ``[BLOCK_M, BLOCK_V]`` tile."""
    acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    ks = tl.arange(0, BLOCK_K)
    # int64 row offsets: N * H and V * H exceed 2**31 at production sizes.
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_hn
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wv
    for k0 in range(0, n_hidden, BLOCK_K):
        k = k0 + ks
        k_mask = k < n_hidden
        h = tl.load(h_rows + k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=col_mask[:, None] & k_mask[None, :], other=0.0)
        acc = _dot(h, tl.trans(w), acc, IEEE, UPCAST)
    return acc * inv_t


@triton.jit
def _forward_kernel(
    h_ptr,
    w_ptr,
    tgt_ptr,
    max_ptr,
    sum_exp_ptr,
    sum_exp_z_ptr,
    target_logit_ptr,
    n_tokens,
    n_vocab,
    n_hidden,
    stride_hn,
    stride_wv,
    inv_t,
    ENTROPY: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_tokens
    # Local target index; -1 (never matches a column) where another shard owns the target.
    tgt = tl.load(tgt_ptr + rows, mask=row_mask, other=-1)

    m = tl.full((BLOCK_M,), _NEG_BIG, dtype=tl.float32)
    s = tl.zeros((BLOCK_M,), dtype=tl.float32)
    sz = tl.zeros((BLOCK_M,), dtype=tl.float32)
    zt = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for v0 in range(0, n_vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_mask = cols < n_vocab
        z = _logit_tile(
            h_ptr, w_ptr, rows, cols, row_mask, col_mask, n_hidden, stride_hn, stride_wv,
            inv_t, BLOCK_M, BLOCK_V, BLOCK_K, IEEE, UPCAST,
        )  # fmt: skip
        # Raw target logit (before any shift), exactly the value the max is taken over, so
        # z_t - m <= 0 holds after the combine.
        zt += tl.sum(tl.where(cols[None, :] == tgt[:, None], z, 0.0), axis=1)
        m_new = tl.maximum(m, tl.max(tl.where(col_mask[None, :], z, float("-inf")), axis=1))
        shift = m - m_new  # <= 0
        alpha = tl.exp(shift)
        # Masked columns get z - m = 0 and e = 0 (not -inf and exp(-inf)): e * (z - m) must
        # be 0 there, and 0 * -inf would be NaN.
        zm = tl.where(col_mask[None, :], z - m_new[:, None], 0.0)
        e = tl.where(col_mask[None, :], tl.exp(zm), 0.0)
        if ENTROPY:
            # Re-base the old sum of e (z - m) on the new max (same identity as the TP
            # combine), then add this tile.
            sz = alpha * (sz + shift * s) + tl.sum(e * zm, axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        m = m_new

    tl.store(max_ptr + rows, m, mask=row_mask)
    tl.store(sum_exp_ptr + rows, s, mask=row_mask)
    tl.store(sum_exp_z_ptr + rows, sz, mask=row_mask)
    tl.store(target_logit_ptr + rows, zt, mask=row_mask)


@triton.jit
def _backward_kernel(
    h_ptr,
    w_ptr,
    tgt_ptr,
    max_ptr,
    lse_ptr,
    mean_zm_ptr,
    g_lp_ptr,
    g_ent_ptr,
    dh_ptr,
    dw_ptr,
    n_tokens,
    n_vocab,
    n_hidden,
    stride_hn,
    stride_wv,
    inv_t,
    n_splits,
    HAS_LP: tl.constexpr,
    HAS_ENT: tl.constexpr,
    NEED_DH: tl.constexpr,
    NEED_DW: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_tokens
    rows64 = rows.to(tl.int64)
    # This split's private [N, H] slice of the partial-dH buffer: no other program writes
    # these rows, so plain load/add/store accumulates them in a fixed order.
    dh_rows = dh_ptr + (split.to(tl.int64) * n_tokens + rows64)[:, None] * n_hidden
    m = tl.load(max_ptr + rows, mask=row_mask, other=0.0)
    lse = tl.load(lse_ptr + rows, mask=row_mask, other=0.0)
    for v0 in range(split * BLOCK_V, n_vocab, n_splits * BLOCK_V):
        _backward_tile(
            h_ptr, w_ptr, tgt_ptr, mean_zm_ptr, g_lp_ptr, g_ent_ptr, dh_rows, dw_ptr,
            rows, rows64, row_mask, m, lse, v0, n_vocab, n_hidden, stride_hn, stride_wv, inv_t,
            HAS_LP, HAS_ENT, NEED_DH, NEED_DW, IEEE, UPCAST, BLOCK_M, BLOCK_V, BLOCK_K,
        )  # fmt: skip


@triton.jit
def _backward_tile(
    h_ptr,
    w_ptr,
    tgt_ptr,
    mean_zm_ptr,
    g_lp_ptr,
    g_ent_ptr,
    dh_rows,
    dw_ptr,
    rows,
    rows64,
    row_mask,
    m,
    lse,
    v0,
    n_vocab,
    n_hidden,
    stride_hn,
    stride_wv,
    inv_t,
    HAS_LP: tl.constexpr,
    HAS_ENT: tl.constexpr,
    NEED_DH: tl.constexpr,
    NEED_DW: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One (token block, vocab block) tile of the backward: dz, then its dH and dW shares."""
    cols = v0 + tl.arange(0, BLOCK_V)
    col_mask = cols < n_vocab
    tile_mask = row_mask[:, None] & col_mask[None, :]
    z = _logit_tile(
        h_ptr, w_ptr, rows, cols, row_mask, col_mask, n_hidden, stride_hn, stride_wv,
        inv_t, BLOCK_M, BLOCK_V, BLOCK_K, IEEE, UPCAST,
    )  # fmt: skip
    zm = z - m[:, None]
    p = tl.exp(zm - lse[:, None])
    # dz = -p (g_lp + g_ent ((z - m) - E_p[z - m])) + g_lp [j = t]  (g already divided by T)
    coef = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    if HAS_ENT:
        g_ent = tl.load(g_ent_ptr + rows, mask=row_mask, other=0.0)
        mean_zm = tl.load(mean_zm_ptr + rows, mask=row_mask, other=0.0)
        coef += (zm - mean_zm[:, None]) * g_ent[:, None]
    if HAS_LP:
        g_lp = tl.load(g_lp_ptr + rows, mask=row_mask, other=0.0)
        coef += g_lp[:, None]
    dz = -p * coef
    if HAS_LP:
        tgt = tl.load(tgt_ptr + rows, mask=row_mask, other=-1)
        dz += tl.where(cols[None, :] == tgt[:, None], g_lp[:, None], 0.0)
    dz = tl.where(tile_mask, dz, 0.0)
    dz_in = dz.to(h_ptr.dtype.element_ty)

    ks = tl.arange(0, BLOCK_K)
    cols64 = cols.to(tl.int64)
    for k0 in range(0, n_hidden, BLOCK_K):
        k = k0 + ks
        k_mask = k < n_hidden
        if NEED_DH:
            w = tl.load(
                w_ptr + cols64[:, None] * stride_wv + k[None, :],
                mask=col_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            dh_mask = row_mask[:, None] & k_mask[None, :]
            dh_acc = tl.load(dh_rows + k[None, :], mask=dh_mask, other=0.0)
            dh_acc = _dot(dz_in, w, dh_acc, IEEE, UPCAST)
            tl.store(dh_rows + k[None, :], dh_acc, mask=dh_mask)
        if NEED_DW:
            h = tl.load(
                h_ptr + rows64[:, None] * stride_hn + k[None, :],
                mask=row_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            dw = _dot(tl.trans(dz_in), h, tl.zeros((BLOCK_V, BLOCK_K), tl.float32), IEEE, UPCAST)
            tl.atomic_add(
                dw_ptr + cols64[:, None] * n_hidden + k[None, :],
                dw,
                mask=col_mask[:, None] & k_mask[None, :],
            )


def _upcast_dots(hidden_NH: torch.Tensor) -> bool:
    """Feed bf16 dots fp32 operands: only on CPU (the interpreter), whose bf16 dot is wrong."""
    return hidden_NH.dtype == torch.bfloat16 and not hidden_NH.is_cuda


def _blocks(device: torch.device, blocks: tuple[int, int, int] | None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_V, BLOCK_K): GPU tiles, or large ones for the CPU interpreter.

    The interpreter runs each program in numpy, so fewer, larger programs are much faster.
    """
    if blocks is not None:
        return blocks
    if device.type == "cuda":
        return 64, 128, 64
    return 128, 256, 128


def _vocab_splits(
    device: torch.device, n_tokens: int, n_hidden: int, grid_m: int, grid_v: int
) -> int:
    """Vocab splits ``S`` of the backward grid ``(grid_m, S)`` (see the module docstring).

    Enough programs to keep every SM busy (~4 per SM), but at most ``grid_v`` (a split
    needs a vocab block) and a partial-dH buffer of at most 1 GiB beyond ``dH`` itself.
    The interpreter uses 2, so that the tests cover the split sum.
    """
    if device.type != "cuda":
        return max(1, min(2, grid_v))
    programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    by_memory = max(1, 2**30 // max(1, 4 * n_tokens * n_hidden))
    return max(1, min(grid_v, -(-programs // grid_m), by_memory))


class TritonLinearLogprob(torch.autograd.Function):
    """autograd.Function behind :func:`triton_linear_logprob` (see the module docstring).

    ``forward`` returns ``logprob_N`` or ``(logprob_N, entropy_N)``; not twice differentiable.
    """

    @staticmethod
    def forward(  # type: ignore[override]
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
            block_m, block_v, block_k = _blocks(hidden_NH.device, blocks)
            _forward_kernel[(triton.cdiv(n_tokens, block_m),)](
                hidden_NH, weight_VH, local_tgt_N,
                max_r_N, sum_exp_r_N, sum_exp_z_r_N, target_N,
                n_tokens, vocab_local, n_hidden,
                hidden_NH.stride(0), weight_VH.stride(0), 1.0 / temperature,
                ENTROPY=compute_entropy, IEEE=hidden_NH.dtype == torch.float32, UPCAST=_upcast_dots(hidden_NH),
                BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_K=block_k,
            )  # fmt: skip

        max_N, log_sum_exp_N, mean_zm_N, logprob_N = combine_shard_statistics(
            max_r_N, sum_exp_r_N, sum_exp_z_r_N, target_N, tp_group
        )
        ctx.save_for_backward(hidden_NH, weight_VH, local_tgt_N, max_N, log_sum_exp_N, mean_zm_N)
        ctx.temperature = temperature
        ctx.tp_group = tp_group
        ctx.compute_entropy = compute_entropy
        ctx.reduce_grad_hidden = reduce_grad_hidden
        ctx.blocks = blocks
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
            return (None,) * 9

        n_tokens, n_hidden = hidden_NH.shape
        vocab_local = weight_VH.shape[0]
        inv_t = 1.0 / ctx.temperature
        g_lp_N = None if grad_lp_N is None else grad_lp_N.float().mul(inv_t).contiguous()
        g_ent_N = None if grad_ent_N is None else grad_ent_N.float().mul(inv_t).contiguous()
        dev = hidden_NH.device
        block_m, block_v, block_k = _blocks(dev, ctx.blocks)
        grid_m, grid_v = triton.cdiv(n_tokens, block_m), triton.cdiv(vocab_local, block_v)
        splits = _vocab_splits(dev, n_tokens, n_hidden, grid_m, grid_v)
        # Accumulation targets: fp32 and zero-initialised (also the answer for a padding-only
        # shard or an empty batch, where no program runs). An unneeded gradient gets a
        # 1-row placeholder (the kernel never touches it).
        f32 = dict(dtype=torch.float32, device=dev)
        dh_SNH = torch.zeros(splits if need_dh else 1, n_tokens if need_dh else 1, n_hidden, **f32)
        dw_VH = torch.zeros(vocab_local if need_dw else 1, n_hidden, **f32)
        if vocab_local > 0 and n_tokens > 0:
            _backward_kernel[(grid_m, splits)](
                hidden_NH, weight_VH, local_tgt_N, max_N, log_sum_exp_N, mean_zm_N,
                g_lp_N if g_lp_N is not None else max_N,  # dummy pointer, never read
                g_ent_N if g_ent_N is not None else max_N,
                dh_SNH, dw_VH,
                n_tokens, vocab_local, n_hidden,
                hidden_NH.stride(0), weight_VH.stride(0), inv_t, splits,
                HAS_LP=g_lp_N is not None, HAS_ENT=g_ent_N is not None,
                NEED_DH=need_dh, NEED_DW=need_dw, IEEE=hidden_NH.dtype == torch.float32, UPCAST=_upcast_dots(hidden_NH),
                BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_K=block_k,
            )  # fmt: skip

        dh_out = dw_out = None
        if need_dh:
            # Fixed-order sum over the splits (a view, not a copy, when there is one).
            dh_NH = dh_SNH[0] if splits == 1 else dh_SNH.sum(dim=0)
            # The hidden input is replicated over the TP group: its gradient is the sum over
            # shards, unless the caller's own TP region op reduces it (see chunked.py).
            if ctx.reduce_grad_hidden:
                _all_reduce(dh_NH, dist.ReduceOp.SUM, ctx.tp_group)
            dh_out = dh_NH.to(hidden_NH.dtype)
        if need_dw:
            dw_out = dw_VH.to(weight_VH.dtype)
        return dh_out, dw_out, None, None, None, None, None, None, None


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
    )
    if compute_entropy:
        return out[0], out[1]
    return out, None
