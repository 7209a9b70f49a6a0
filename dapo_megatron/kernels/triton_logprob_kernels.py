"""The Triton kernels of the fused logprob (triton_logprob.py) and their launch configurations.

Here: the ``@triton.jit`` functions (forward statistics, backward dz, the GEMM of the two
backward products), the tile tables the launches read per target (``kernel_tiles``: the
first candidate is launched) with the grid and chunk sizing, and ``compile_specs``, which
describes every launch for the ahead-of-time compile check (compile_check.py,
tests/kernels/test_compile.py). What the kernels compute, and the numerics, are in
triton_logprob.py's docstring; that module launches them from its autograd function.

The kernels keep their leading underscore although triton_logprob.py imports them: the
compile check finds a module's launched kernels by their ``_<name>_kernel`` names.

The kernels use only ops the Triton interpreter (``TRITON_INTERPRET=1``) supports, so the
CPU test suite checks them against the float64 reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from dapo_megatron.kernels.compile_check import KernelSpec
from dapo_megatron.kernels.triton_interpret import patch_interpreter

patch_interpreter()  # Triton 3.6's interpreter with NumPy >= 2.4 (triton_interpret.py)

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
CHUNK_MULTIPLE = 256


def _table_key(arch: int, dtype_name: str) -> tuple[int, str]:
    return (9 if arch >= 90 else 8, "fp32" if dtype_name == "fp32" else "bf16")


def kernel_tiles(kind: str, arch: int, dtype_name: str) -> tuple[Tiles, ...]:
    """Candidate tiles of ``kind`` (``"fwd"``, ``"dz"``, ``"matmul"``) on sm_``arch``; the
    first is launched."""
    return _TABLES[kind][_table_key(arch, dtype_name)]


def launch_tiles(device: torch.device, dtype: torch.dtype, kind: str, blocks: Any) -> Tiles:
    """The tiles a launch uses: an explicit ``blocks`` override (tests), the interpreter's,
    or the first candidate for the device's architecture."""
    if blocks is not None:
        bm, bn, bk = blocks
        return Tiles(bm, bn, bk, 2)
    if device.type != "cuda":
        return _INTERPRETER_TILES
    major, minor = torch.cuda.get_device_capability(device)
    return kernel_tiles(kind, 10 * major + minor, _DTYPE_NAMES[dtype])[0]


def sm_count(device: torch.device) -> int:
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
            chunk = dz_chunk_columns(n, v, 2 if dt == "bf16" else 4, CHUNK_MULTIPLE)
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
            chunk = dz_chunk_columns(n, v, 2 if dt == "bf16" else 4, CHUNK_MULTIPLE)
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
