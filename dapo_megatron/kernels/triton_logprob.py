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

Tiles, warps and stages are per target (``_FWD_TILES``, ``_DZ_TILES``, ``_MATMUL_TILES``:
the first candidate is launched); :func:`compile_specs` lists every launch for the
ahead-of-time compile check (tests/kernels/test_compile.py: registers, spills, tensor-core
instructions, shared memory on sm_90 and sm_80).

Supported inputs: fp16 / bf16 / fp32 (fp64 stays on the chunked path, which gradchecks).
fp32 inputs use IEEE fp32 dots (not TF32) so they match the chunked path to ~1e-6;
low-precision inputs feed the tensor cores in their own dtype, and ``dz`` is rounded to
that dtype for the two backward GEMMs (the usual fused-kernel trade-off; the statistics and
all accumulation stay fp32).

The kernels use only ops the Triton interpreter (``TRITON_INTERPRET=1``) supports, so the
CPU test suite checks them against the float64 reference.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from dapo_megatron.kernels.compile_check import KernelSpec

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
def _grouped_tile(pid, grid_m, grid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid`` on a ``grid_m x grid_n`` tile grid, visited GROUP_M
    rows at a time: the programs resident together cover a GROUP_M-row band of a few columns,
    so their row and column operand panels are shared in L2."""
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = tl.minimum(grid_m - first_m, GROUP_M)
    in_group = pid % per_group
    return first_m + in_group % rows_in_group, in_group // rows_in_group


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
    vocab_per_split,
    n_splits,
    inv_t,
    ENTROPY: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Program (token block, vocab split): the split's contiguous vocab range, partial
    # statistics to row `split` of the [S, N] outputs (combined over splits in torch).
    pid_m, split = _grouped_tile(tl.program_id(0), tl.cdiv(n_tokens, BLOCK_M), n_splits, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_tokens
    # Local target index; -1 (never matches a column) where another shard owns the target.
    tgt = tl.load(tgt_ptr + rows, mask=row_mask, other=-1)

    m = tl.full((BLOCK_M,), _NEG_BIG, dtype=tl.float32)
    s = tl.zeros((BLOCK_M,), dtype=tl.float32)
    sz = tl.zeros((BLOCK_M,), dtype=tl.float32)
    zt = tl.zeros((BLOCK_M,), dtype=tl.float32)
    v_start = split * vocab_per_split
    v_stop = tl.minimum(n_vocab, v_start + vocab_per_split)
    for v0 in range(v_start, v_stop, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_mask = cols < v_stop
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

    out = split.to(tl.int64) * n_tokens + rows
    tl.store(max_ptr + out, m, mask=row_mask)
    tl.store(sum_exp_ptr + out, s, mask=row_mask)
    tl.store(sum_exp_z_ptr + out, sz, mask=row_mask)
    tl.store(target_logit_ptr + out, zt, mask=row_mask)


@triton.jit
def _dlogits_kernel(
    h_ptr,
    w_ptr,
    tgt_ptr,
    max_ptr,
    lse_ptr,
    mean_zm_ptr,
    g_lp_ptr,
    g_ent_ptr,
    dz_ptr,
    n_tokens,
    n_vocab,
    n_hidden,
    stride_hn,
    stride_wv,
    stride_dz,
    v_base,
    inv_t,
    HAS_LP: tl.constexpr,
    HAS_ENT: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """``dz`` of one (token block, vocab block) tile of a vocab chunk, stored in the input
    dtype: the logit tile is recomputed (``w_ptr`` points at the chunk's first row, global
    local-shard column = ``v_base`` + chunk column)."""
    pid_m, pid_v = _grouped_tile(
        tl.program_id(0), tl.cdiv(n_tokens, BLOCK_M), tl.cdiv(n_vocab, BLOCK_V), GROUP_M
    )
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    row_mask = rows < n_tokens
    col_mask = cols < n_vocab
    z = _logit_tile(
        h_ptr, w_ptr, rows, cols, row_mask, col_mask, n_hidden, stride_hn, stride_wv,
        inv_t, BLOCK_M, BLOCK_V, BLOCK_K, IEEE, UPCAST,
    )  # fmt: skip
    m = tl.load(max_ptr + rows, mask=row_mask, other=0.0)
    lse = tl.load(lse_ptr + rows, mask=row_mask, other=0.0)
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
        tgt = tl.load(tgt_ptr + rows, mask=row_mask, other=-1) - v_base
        dz += tl.where(cols[None, :] == tgt[:, None], g_lp[:, None], 0.0)
    tile_mask = row_mask[:, None] & col_mask[None, :]
    dz_ptrs = dz_ptr + rows.to(tl.int64)[:, None] * stride_dz + cols[None, :]
    tl.store(dz_ptrs, dz.to(dz_ptr.dtype.element_ty), mask=tile_mask)


@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    ACCUMULATE: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """``C[M, N] (+)= A[M, K] @ B[K, N]`` with an fp32 accumulator, one program per C tile
    (each output element is summed by one program in a fixed order: deterministic)."""
    pid_m, pid_n = _grouped_tile(
        tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M
    )
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    n_mask = rn < N
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am
    b_cols = b_ptr + rn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_mask = k < K
        k64 = k.to(tl.int64)
        a = tl.load(
            a_rows + k64[None, :] * stride_ak, mask=m_mask[:, None] & k_mask[None, :], other=0.0
        )
        b = tl.load(
            b_cols + k64[:, None] * stride_bk, mask=k_mask[:, None] & n_mask[None, :], other=0.0
        )
        acc = _dot(a, b, acc, IEEE, UPCAST)
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    c_mask = m_mask[:, None] & n_mask[None, :]
    if ACCUMULATE:
        acc += tl.load(c_ptrs, mask=c_mask, other=0.0).to(tl.float32)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


# ---------------------------------------------------------------------------------------
# Launch configurations: one table for the launches and the compile check.


@dataclass(frozen=True)
class Tiles:
    """Tile shape and launch settings of one kernel launch."""

    block_m: int
    block_n: int
    """BLOCK_V for the logit kernels, BLOCK_N for the matmul."""
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


# Per compute-capability major version: candidates, the first is launched. The others are
# compile-checked alternatives for a tile sweep on a GPU.
# sm_90: 128-row tiles over 8 warps (two warpgroups of wgmma m64); sm_80: mma.sync tiles sized
# to stay under 255 registers with the softmax epilogue live. fp32 (IEEE fp32 dots run on the
# CUDA cores) uses small tiles; whether it is dispatched at all: dispatch.FP32_TRITON_ARCHS.
_FWD_TILES: dict[tuple[int, str], tuple[Tiles, ...]] = {
    # 128 x 128 spills on sm_90 here (z, z - m and exp(z - m) live at once next to the
    # loop-carried statistics); 128 x 64 over two warpgroups does not.
    (9, "bf16"): (Tiles(128, 64, 64, 8, 8, 3), Tiles(64, 64, 64, 8, 4, 3)),
    (8, "bf16"): (Tiles(128, 64, 32, 8, 8, 3), Tiles(64, 64, 32, 8, 4, 4)),
    (9, "fp32"): (Tiles(32, 64, 32, 8, 4, 2),),
    (8, "fp32"): (Tiles(32, 64, 32, 8, 4, 2),),
}
_DZ_TILES: dict[tuple[int, str], tuple[Tiles, ...]] = {
    (9, "bf16"): (Tiles(128, 128, 64, 8, 8, 3), Tiles(64, 128, 64, 8, 4, 4)),
    (8, "bf16"): (Tiles(128, 64, 32, 8, 4, 4), Tiles(64, 128, 32, 8, 4, 4)),
    (9, "fp32"): (Tiles(32, 64, 32, 8, 4, 2),),
    (8, "fp32"): (Tiles(32, 64, 32, 8, 4, 2),),
}
_MATMUL_TILES: dict[tuple[int, str], tuple[Tiles, ...]] = {
    # dH's fp32 accumulate epilogue holds a second [BM, BN] fp32 tile: 128 x 256 spills.
    (9, "bf16"): (Tiles(128, 128, 64, 8, 8, 4), Tiles(128, 256, 64, 8, 8, 3)),
    (8, "bf16"): (Tiles(128, 128, 32, 8, 8, 3), Tiles(64, 128, 32, 8, 4, 4)),
    (9, "fp32"): (Tiles(32, 64, 32, 8, 4, 2),),
    (8, "fp32"): (Tiles(32, 64, 32, 8, 4, 2),),
}
_TABLES = {"fwd": _FWD_TILES, "dz": _DZ_TILES, "matmul": _MATMUL_TILES}
# Interpreter tiles: each program runs in numpy, so fewer, larger programs are much faster.
_INTERPRETER_TILES = Tiles(128, 256, 128, 8)
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# dz chunk of at most this many bytes per backward GEMM pass.
DZ_CHUNK_BYTES = 2**30
# Chunk widths are multiples of this (every candidate BLOCK_V divides it; 16-divisible strides).
_CHUNK_MULTIPLE = 256


def _table_key(arch: int, dtype_name: str) -> tuple[int, str]:
    return (9 if arch >= 90 else 8, "fp32" if dtype_name == "fp32" else "bf16")


def kernel_tiles(kind: str, arch: int, dtype_name: str) -> tuple[Tiles, ...]:
    """Candidate tiles of ``kind`` (``"fwd"``, ``"dz"``, ``"matmul"``) on sm_``arch``; the
    first is launched."""
    return _TABLES[kind][_table_key(arch, dtype_name)]


def _launch_tiles(device: torch.device, dtype: torch.dtype, kind: str, blocks: Any) -> Tiles:
    """The tiles a launch uses: an explicit ``blocks`` override (tests), the interpreter's,
    or the first candidate for the device's architecture."""
    if blocks is not None:
        bm, bn, bk = blocks
        return Tiles(bm, bn, bk, 2)
    if device.type != "cuda":
        return _INTERPRETER_TILES
    major, minor = torch.cuda.get_device_capability(device)
    return kernel_tiles(kind, 10 * major + minor, _DTYPE_NAMES[dtype])[0]


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def forward_splits(n_sm: int, grid_m: int, grid_v: int, group_m: int, cuda: bool) -> int:
    """Vocab splits ``S`` of the forward grid ``grid_m x S``.

    The first wave (~one program per SM) should be a GROUP_M x S band of tiles: the band's
    hidden-state panels stay in L2 while it streams S vocab ranges. More splits also fill the
    GPU when there are few token blocks. The interpreter uses 2 (the tests cover the combine).
    """
    if not cuda:
        return max(1, min(2, grid_v))
    by_band = -(-n_sm // min(group_m, grid_m))
    return max(1, min(grid_v, by_band))


def _int_type(value: int) -> str:
    return "i32" if -(2**31) <= value < 2**31 else "i64"


def _spec(label: str, kernel: str, arch: int, dtype: str, values: dict, consts: dict,
          tiles: Tiles, production: bool) -> KernelSpec:  # fmt: skip
    """A compile spec from launch values, specialised as a launch would be: pointer (type
    string) 16-byte aligned, ints == 1 constexpr, ints % 16 == 0 divisible."""
    args: dict[str, str] = {}
    constexprs = dict(consts)
    divisible = []
    for name, value in values.items():
        if isinstance(value, str):
            args[name] = value
            divisible.append(name)
        elif isinstance(value, bool):
            constexprs[name] = value
        elif isinstance(value, int):
            if value == 1:
                constexprs[name] = 1
                continue
            args[name] = _int_type(value)
            if value % 16 == 0:
                divisible.append(name)
        else:
            args[name] = "fp32"
    return KernelSpec(
        label=label, module=__name__, kernel=kernel, arch=arch, dtype=dtype, args=args,
        constexprs=constexprs, divisible=tuple(divisible), num_warps=tiles.num_warps,
        num_stages=tiles.num_stages, production=production,
    )  # fmt: skip


# The production shape of the compile specs: Qwen2.5-7B/-14B-like, one vocab chunk at TP1.
_SPEC_N, _SPEC_H, _SPEC_V = 16384, 4096, 152064


def compile_specs(arch: int) -> list[KernelSpec]:
    """Every launch of :class:`TritonLinearLogprob` on sm_``arch`` (see :mod:`.compile_check`):
    forward (with / without entropy), dz (lp grad / lp + entropy grads) and the two GEMMs,
    for every candidate tile in bf16 and fp32. ``production`` marks the bf16 launch tiles."""
    n, h, v = _SPEC_N, _SPEC_H, _SPEC_V
    specs = []
    for dt in ("bf16", "fp32"):
        ieee = dt == "fp32"
        ptr = f"*{dt}"
        for i, t in enumerate(kernel_tiles("fwd", arch, dt)):
            prod = dt == "bf16" and i == 0
            tag = "" if i == 0 else f"/alt{i}"
            grid_m, grid_v = -(-n // t.block_m), -(-v // t.block_n)
            splits = forward_splits(132, grid_m, grid_v, t.group_m, True)
            per_split = -(-grid_v // splits) * t.block_n
            tiles = dict(BLOCK_M=t.block_m, BLOCK_V=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m)
            fwd_vals = dict(
                h_ptr=ptr, w_ptr=ptr, tgt_ptr="*i32", max_ptr="*fp32", sum_exp_ptr="*fp32",
                sum_exp_z_ptr="*fp32", target_logit_ptr="*fp32", n_tokens=n, n_vocab=v,
                n_hidden=h, stride_hn=h, stride_wv=h, vocab_per_split=per_split,
                n_splits=splits, inv_t=1.0,
            )  # fmt: skip
            for ent in (False, True):
                consts = dict(ENTROPY=ent, IEEE=ieee, UPCAST=False, **tiles)
                label = f"logprob_fwd[{'ent' if ent else 'lp'}]{tag}"
                specs.append(_spec(label, "_forward_kernel", arch, dt, fwd_vals, consts, t, prod))
        for i, t in enumerate(kernel_tiles("dz", arch, dt)):
            prod = dt == "bf16" and i == 0
            tag = "" if i == 0 else f"/alt{i}"
            tiles = dict(BLOCK_M=t.block_m, BLOCK_V=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m)
            chunk = dz_chunk_columns(n, v, 2 if dt == "bf16" else 4, _CHUNK_MULTIPLE)
            dz_vals = dict(
                h_ptr=ptr, w_ptr=ptr, tgt_ptr="*i32", max_ptr="*fp32", lse_ptr="*fp32",
                mean_zm_ptr="*fp32", g_lp_ptr="*fp32", g_ent_ptr="*fp32", dz_ptr=ptr,
                n_tokens=n, n_vocab=chunk, n_hidden=h, stride_hn=h, stride_wv=h,
                stride_dz=chunk, v_base=chunk, inv_t=1.0,
            )  # fmt: skip
            for ent in (False, True):
                consts = dict(HAS_LP=True, HAS_ENT=ent, IEEE=ieee, UPCAST=False, **tiles)
                label = f"logprob_dz[{'lp+ent' if ent else 'lp'}]{tag}"
                specs.append(_spec(label, "_dlogits_kernel", arch, dt, dz_vals, consts, t, prod))
        for i, t in enumerate(kernel_tiles("matmul", arch, dt)):
            prod = dt == "bf16" and i == 0
            tag = "" if i == 0 else f"/alt{i}"
            chunk = dz_chunk_columns(n, v, 2 if dt == "bf16" else 4, _CHUNK_MULTIPLE)
            tiles = dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m)
            consts = dict(IEEE=ieee, UPCAST=False, **tiles)
            # dW[chunk] = dz^T @ H (A = dz transposed: unit stride along M), in the weight dtype.
            dw_vals = dict(
                a_ptr=ptr, b_ptr=ptr, c_ptr=ptr, M=chunk, N=h, K=n, stride_am=1,
                stride_ak=chunk, stride_bk=h, stride_bn=1, stride_cm=h,
            )  # fmt: skip
            # dH (fp32) += dz @ W[chunk].
            dh_vals = dict(
                a_ptr=ptr, b_ptr=ptr, c_ptr="*fp32", M=n, N=h, K=chunk, stride_am=chunk,
                stride_ak=1, stride_bk=h, stride_bn=1, stride_cm=h,
            )  # fmt: skip
            for name, vals, accumulate in (("dW", dw_vals, False), ("dH", dh_vals, True)):
                specs.append(
                    _spec(
                        f"logprob_{name}{tag}",
                        "_matmul_kernel",
                        arch,
                        dt,
                        vals,
                        dict(consts, ACCUMULATE=accumulate),
                        t,
                        prod,
                    )
                )
    return specs


def dz_chunk_columns(n_tokens: int, vocab_local: int, elem_bytes: int, multiple: int) -> int:
    """Vocab columns per backward chunk: the ``[N, chunk]`` dz buffer within DZ_CHUNK_BYTES,
    a multiple of ``multiple`` (the tile width), chunks of about equal size."""
    most = max(multiple, DZ_CHUNK_BYTES // max(1, n_tokens * elem_bytes) // multiple * multiple)
    n_chunks = -(-vocab_local // most)
    per_chunk = -(-vocab_local // n_chunks)
    return min(most, -(-per_chunk // multiple) * multiple)


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
    t = _launch_tiles(a_MK.device, a_MK.dtype, "matmul", blocks)
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
    chunk = vocab_chunk or dz_chunk_columns(n_tokens, vocab_local, elem, _CHUNK_MULTIPLE)
    chunk = min(chunk, vocab_local)
    dz_NC = torch.empty(n_tokens, chunk, dtype=hidden_NH.dtype, device=hidden_NH.device)
    t = _launch_tiles(hidden_NH.device, hidden_NH.dtype, "dz", blocks)
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
            t = _launch_tiles(dev, hidden_NH.dtype, "fwd", blocks)
            grid_m, grid_v = triton.cdiv(n_tokens, t.block_m), triton.cdiv(vocab_local, t.block_n)
            splits = forward_splits(_sm_count(dev), grid_m, grid_v, t.group_m, dev.type == "cuda")
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
