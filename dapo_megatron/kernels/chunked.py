"""Chunked, vocab-parallel token logprobs (and entropy) without materialising ``[N, V]`` logits.

The naive path (``logits = h @ W^T`` in fp32, ``log_softmax``, ``gather``) keeps 2-4 fp32
``[N, V]`` tensors alive for backward: at 20k tokens x 131k vocab that is ~10 GiB per copy.
This module computes the same quantities a chunk of tokens at a time and saves only O(N)
statistics; its backward recomputes each logit chunk (one extra ``chunk x V x H`` GEMM per
chunk, i.e. 4 GEMMs instead of 3) so that at most two ``[chunk, V_local]`` buffers exist at
any time.

Vocab parallelism (Megatron's ``ColumnParallelLinear`` output layer): each rank of
``tp_group`` holds rows ``[vocab_start, vocab_start + V_local)`` of the output weight and the
full (replicated) hidden states. Per chunk every rank computes local statistics relative to
its LOCAL max ``m_r``; all chunks are then combined with just two collectives for the whole
call (an all-reduce MAX of the ``[N]`` local maxima, then one all-reduce SUM of a ``[3, N]``
stack rescaled by ``exp(m_r - m)``), instead of two per chunk.

Numerics:
  * Logits are computed in fp32 (fp64 when the inputs are fp64, so that gradcheck works),
    whatever the input dtype; low-precision inputs are upcast chunk by chunk (the weight once
    per call: a transient fp32 copy of this rank's shard).
  * Everything is kept relative to the max (``z - m``), so logits of magnitude 1e4 neither
    overflow nor lose the entropy to cancellation (``lse - sum p z`` would subtract two
    numbers of size 1e4).
  * ``logprob <= 0`` and ``entropy >= 0`` hold by construction: the target logit and the max
    are the same fp32 numbers, so ``z_t - m <= 0``, and the rescaled sum of exponentials
    contains ``exp(0) = 1`` from the shard owning the max, so ``log s >= 0`` (and
    ``E_p[z - m] <= 0``). A positive logprob poisons importance ratios downstream (a peer's
    fused kernel produced them at 150k vocab), so the outputs are clamped as well, as a
    guard for future edits; the backward uses the exact derivative regardless of the clamp.

The caller passes the hidden states that every TP rank holds in full (gather them first with
sequence parallelism) and must NOT also route them through Megatron's
``copy_to_tensor_model_parallel_region``: this function already all-reduces ``dH``.
"""

from __future__ import annotations

from typing import Any, TypedDict

import torch
import torch.distributed as dist

from dapo_megatron.device import collectives

# Budget for one [chunk, V_local] logits buffer when the caller gives no chunk size. Forward
# and backward each hold at most two such buffers.
DEFAULT_CHUNK_BYTES = 2**28


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """The dtype logits and statistics are computed in: fp64 for fp64 inputs, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_chunk_size(vocab_local: int, dtype: torch.dtype) -> int:
    """Tokens per chunk so that one chunk of logits takes about ``DEFAULT_CHUNK_BYTES``."""
    itemsize = torch.empty((), dtype=compute_dtype_for(dtype)).element_size()
    return max(1, DEFAULT_CHUNK_BYTES // (itemsize * max(1, vocab_local)))


class _TensorOptions(TypedDict):
    """The ``dtype``/``device`` keywords of ``torch.empty(n, **options)`` and friends."""

    dtype: torch.dtype
    device: torch.device


# op: the ReduceOp.SUM/MAX/... constants, whose type is ReduceOp.RedOpType, not ReduceOp.
def _all_reduce(tensor: torch.Tensor, op: dist.ReduceOp.RedOpType, group: Any) -> None:
    if group is not None and dist.get_world_size(group) > 1:
        collectives.all_reduce(tensor, op=op, group=group)


def _local_targets(
    targets_N: torch.Tensor, vocab_start: int, vocab_local: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(index into this shard clamped to a valid row, mask of targets owned by this shard)."""
    local_N = targets_N - vocab_start
    owned_N = (local_N >= 0) & (local_N < vocab_local)
    return local_N.clamp(0, vocab_local - 1), owned_N


def combine_shard_statistics(
    max_r_N: torch.Tensor,
    sum_exp_r_N: torch.Tensor,
    sum_exp_z_r_N: torch.Tensor,
    target_N: torch.Tensor,
    tp_group: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Combine per-shard statistics over ``tp_group`` (two collectives for the whole call).

    Args:
        max_r_N: this shard's max logit ``m_r``.
        sum_exp_r_N: ``sum_v exp(z_v - m_r)`` over this shard.
        sum_exp_z_r_N: ``sum_v exp(z_v - m_r) (z_v - m_r)`` (zeros when no entropy).
        target_N: the target logit where this shard owns the target, else 0.
        tp_group: process group sharding the vocab, or None.

    Returns:
        ``(max_N, log_sum_exp_N, mean_zm_N, logprob_N)``: the global max ``m``,
        ``log sum_v exp(z_v - m)`` (so ``lse = m + log_sum_exp``), ``E_p[z - m]`` and the
        clamped (``<= 0``) target logprob.
    """
    # Combine shards: with m = max_r m_r and a_r = exp(m_r - m),
    #   s        = sum_r a_r s_r
    #   sum e(z-m) (over all shards, z - m = (z - m_r) + (m_r - m))
    #            = sum_r a_r (sum_exp_z_r + (m_r - m) s_r)
    max_N = max_r_N.clone()
    _all_reduce(max_N, dist.ReduceOp.MAX, tp_group)
    shift_N = max_r_N - max_N
    scale_N = torch.exp(shift_N)
    combined = torch.stack(
        [sum_exp_r_N * scale_N, (sum_exp_z_r_N + shift_N * sum_exp_r_N) * scale_N, target_N]
    )
    _all_reduce(combined, dist.ReduceOp.SUM, tp_group)
    sum_exp_N, sum_exp_z_N, target_N = combined
    log_sum_exp_N = torch.log(sum_exp_N)  # lse = m + log_sum_exp
    logprob_N = ((target_N - max_N) - log_sum_exp_N).clamp_(max=0.0)
    # E_p[z - m]; entropy = lse - E_p[z] = log_sum_exp - E_p[z - m].
    mean_zm_N = sum_exp_z_N / sum_exp_N
    return max_N, log_sum_exp_N, mean_zm_N, logprob_N


class ChunkedLinearLogprob(torch.autograd.Function):
    """autograd.Function behind :func:`chunked_linear_logprob` (see the module docstring).

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
        chunk_size: int,
        reduce_grad_hidden: bool,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        n_tokens, vocab_local = hidden_NH.shape[0], weight_VH.shape[0]
        cdtype = compute_dtype_for(hidden_NH.dtype)
        weight_c = weight_VH.to(cdtype)  # no copy when already in the compute dtype
        local_idx_N, owned_N = _local_targets(targets_N, vocab_start, vocab_local)
        inv_t = 1.0 / temperature

        stat = _TensorOptions(dtype=cdtype, device=hidden_NH.device)
        max_r_N = torch.empty(n_tokens, **stat)  # this shard's max logit m_r
        sum_exp_r_N = torch.empty(n_tokens, **stat)  # sum_v exp(z_v - m_r)
        sum_exp_z_r_N = torch.zeros(n_tokens, **stat)  # sum_v exp(z_v - m_r) (z_v - m_r)
        target_N = torch.empty(n_tokens, **stat)  # z_target, 0 when another shard owns it

        if vocab_local == 0:
            # A shard holding only vocabulary padding (sliced off by the caller) contributes
            # nothing; a very negative but finite max keeps the combine step free of inf*0.
            max_r_N.fill_(torch.finfo(cdtype).min / 2)
            sum_exp_r_N.zero_()
            target_N.zero_()
        for lo in range(0, n_tokens if vocab_local else 0, chunk_size):
            hi = min(lo + chunk_size, n_tokens)
            z = hidden_NH[lo:hi].to(cdtype) @ weight_c.T
            z.mul_(inv_t)
            # Read the target logit before shifting: the raw value, summed with exact zeros
            # from the other shards, reaches the combine step unrounded.
            z_t = z.gather(1, local_idx_N[lo:hi, None]).squeeze(1)
            target_N[lo:hi] = torch.where(owned_N[lo:hi], z_t, 0.0)
            m_r = z.amax(dim=1)
            max_r_N[lo:hi] = m_r
            z.sub_(m_r[:, None])
            e = torch.exp(z)
            sum_exp_r_N[lo:hi] = e.sum(dim=1)
            if compute_entropy:
                sum_exp_z_r_N[lo:hi] = e.mul_(z).sum(dim=1)
            del z, e

        max_N, log_sum_exp_N, mean_zm_N, logprob_N = combine_shard_statistics(
            max_r_N, sum_exp_r_N, sum_exp_z_r_N, target_N, tp_group
        )

        ctx.save_for_backward(hidden_NH, weight_VH, targets_N, max_N, log_sum_exp_N, mean_zm_N)
        ctx.temperature = temperature
        ctx.vocab_start = vocab_start
        ctx.tp_group = tp_group
        ctx.chunk_size = chunk_size
        ctx.compute_entropy = compute_entropy
        ctx.reduce_grad_hidden = reduce_grad_hidden
        ctx.set_materialize_grads(False)  # None grads let backward skip unused terms
        if not compute_entropy:
            return logprob_N
        entropy_N = (log_sum_exp_N - mean_zm_N).clamp_(min=0.0)
        return logprob_N, entropy_N

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        # Derivation, per row, with z the logits (already divided by T), p = softmax(z),
        # lse = log sum_v exp z_v, S = sum_v p_v z_v:
        #   logprob = z_t - lse             => d logprob / dz_j = [j = t] - p_j
        #   d p_i / d z_j = p_i ([i = j] - p_j)
        #   entropy = lse - S
        #   dS / dz_j = p_j + sum_i z_i p_i ([i = j] - p_j) = p_j + p_j z_j - p_j S
        #                                   => d entropy / dz_j = p_j - dS/dz_j = -p_j (z_j - S)
        # so dz_j = g_lp ([j = t] - p_j) - g_ent p_j (z_j - S)
        #         = -p_j (g_lp + g_ent (z_j - S)) + g_lp [j = t].
        # z = h W^T / T, hence dH = (dz / T) W and dW = (dz / T)^T H. The 1/T is folded into
        # g_lp and g_ent (dz is linear in them), and z_j - S = (z_j - m) - E_p[z - m].
        hidden_NH, weight_VH, targets_N, max_N, log_sum_exp_N, mean_zm_N = ctx.saved_tensors
        grad_lp_N = grads[0]
        grad_ent_N = grads[1] if ctx.compute_entropy else None
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_lp_N is None and grad_ent_N is None) or not (need_dh or need_dw):
            return (None,) * 9

        n_tokens, vocab_local = hidden_NH.shape[0], weight_VH.shape[0]
        cdtype = compute_dtype_for(hidden_NH.dtype)
        weight_c = weight_VH.to(cdtype)
        local_idx_N, owned_N = _local_targets(targets_N, ctx.vocab_start, vocab_local)
        inv_t = 1.0 / ctx.temperature
        g_lp_N = None if grad_lp_N is None else grad_lp_N.to(cdtype) * inv_t
        g_ent_N = None if grad_ent_N is None else grad_ent_N.to(cdtype) * inv_t

        # dH is kept in the compute dtype until after the all-reduce; dW accumulates over
        # chunks, so it needs the compute dtype too (bf16 accumulation would drift).
        dh_NH = dw_VH = None
        if need_dh:
            # zeros, not empty: a padding-only shard (vocab_local == 0) runs no chunk.
            dh_NH = torch.zeros(hidden_NH.shape, dtype=cdtype, device=hidden_NH.device)
        if need_dw:
            dw_VH = torch.zeros(weight_VH.shape, dtype=cdtype, device=weight_VH.device)

        for lo in range(0, n_tokens if vocab_local else 0, ctx.chunk_size):
            hi = min(lo + ctx.chunk_size, n_tokens)
            h_c = hidden_NH[lo:hi].to(cdtype)
            zm = h_c @ weight_c.T
            zm.mul_(inv_t).sub_(max_N[lo:hi, None])  # z - m
            p = zm.sub(log_sum_exp_N[lo:hi, None]).exp_()  # exp(z - lse)
            if g_ent_N is not None:
                coef = zm.sub_(mean_zm_N[lo:hi, None]).mul_(g_ent_N[lo:hi, None])
                if g_lp_N is not None:
                    coef.add_(g_lp_N[lo:hi, None])
                dz = p.mul_(coef).neg_()
            else:
                assert g_lp_N is not None  # the early return above: not both gradients None
                dz = p.mul_(g_lp_N[lo:hi, None]).neg_()
            del zm
            if g_lp_N is not None:
                # The one-hot term; rows whose target lives on another shard add 0 (a
                # masked scatter rather than nonzero(), which would sync a GPU per chunk).
                onehot_c = torch.where(owned_N[lo:hi], g_lp_N[lo:hi], 0.0)
                dz.scatter_add_(1, local_idx_N[lo:hi, None], onehot_c[:, None])
            if dh_NH is not None:
                torch.mm(dz, weight_c, out=dh_NH[lo:hi])
            if dw_VH is not None:
                dw_VH.addmm_(dz.T, h_c)
            del dz, p

        if dh_NH is not None:
            # Every rank's hidden input is a replica, so its gradient is the sum over shards;
            # a caller whose own TP region op already reduces (Megatron's sequence-parallel
            # gather reduce-scatters in backward) asks for the local part only.
            if ctx.reduce_grad_hidden:
                _all_reduce(dh_NH, dist.ReduceOp.SUM, ctx.tp_group)
            dh_NH = dh_NH.to(hidden_NH.dtype)
        if dw_VH is not None:
            dw_VH = dw_VH.to(weight_VH.dtype)
        return dh_NH, dw_VH, None, None, None, None, None, None, None


def chunked_linear_logprob(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    targets_N: torch.Tensor,
    *,
    temperature: float,
    vocab_start: int,
    tp_group: Any,
    compute_entropy: bool,
    chunk_size: int,
    reduce_grad_hidden: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked logprob/entropy; inputs are assumed valid (see ``dispatch.linear_logprob``).

    Args:
        hidden_NH: ``[N, H]`` hidden states, replicated on every rank of ``tp_group``.
        weight_VH: ``[V_local, H]`` this rank's vocab shard, same dtype as ``hidden_NH``.
        targets_N: ``[N]`` int64 GLOBAL token ids.
        temperature: logits are ``h W^T / temperature``.
        vocab_start: global id of ``weight_VH[0]``.
        tp_group: process group sharding the vocab, or None for a single process.
        compute_entropy: also return the entropy.
        chunk_size: tokens per chunk.
        reduce_grad_hidden: all-reduce the hidden-state gradient over ``tp_group`` (False
            when the caller's own TP region op reduces it, e.g. a sequence-parallel gather).

    Returns:
        ``(logprob_N, entropy_N or None)`` in fp32 (fp64 for fp64 inputs).
    """
    # torch's autograd.Function.apply is unannotated.
    out = ChunkedLinearLogprob.apply(  # type: ignore[no-untyped-call]
        hidden_NH,
        weight_VH,
        targets_N,
        temperature,
        vocab_start,
        tp_group,
        compute_entropy,
        chunk_size,
        reduce_grad_hidden,
    )
    if compute_entropy:
        return out[0], out[1]
    return out, None
