"""The one entry point for token logprobs from hidden states: validation + implementation choice.

The Megatron policy's logprob pass and train step call :func:`linear_logprob`; the
implementations behind it compute the same numbers:

  ``"reference"``  materialised logits (:mod:`.reference`): single process, tests and debugging;
  ``"chunked"``    memory-lean autograd.Function (:mod:`.chunked`), vocab-parallel;
  ``"triton"``     fused Triton kernels (:mod:`.triton_logprob`), vocab-parallel; fp16/bf16/fp32
                   CUDA tensors (CPU tensors only under ``TRITON_INTERPRET=1``, for tests);
  ``"auto"``       ``"triton"`` for fp16/bf16 CUDA tensors when triton imports, and for fp32
                   CUDA tensors only on architectures in :data:`FP32_TRITON_ARCHS`; else
                   ``"chunked"`` (CPU, fp64, fp32 elsewhere, or ``DAPO_NO_TRITON=1``).

fp32 runs the kernels' IEEE fp32 dots on the CUDA cores. ``"auto"`` sends fp32 to them only
where a compiled fp32 configuration does not spill registers (:data:`FP32_TRITON_ARCHS`;
tests/kernels/test_compile.py keeps it in step with the compiled table: with 32 x 64 tiles
none spills on sm_80 or sm_90), elsewhere to the chunked torch path.

:mod:`.triton_logprob` is imported lazily, on first use: Triton decides at ``@triton.jit``
time whether kernels run compiled or interpreted, so importing this package must not define
them before a test has set ``TRITON_INTERPRET``.

Target ids are range-checked without a host sync. Reading ``min``/``max`` of the targets back
to the host on every call would stall the CPU until the GPU has caught up, once per
micro-batch and pass; so the readable ``ValueError`` is raised where the check is free (CPU
targets) or asked for (``DAPO_SYNC_CHECKS=1``, for debugging), and on an accelerator the
check is a device-side assertion (``torch._assert_async``): the launch queue keeps flowing,
and a bad id still stops the run, as a device-side assert at the next synchronisation
(which leaves the CUDA context unusable; rerun with ``DAPO_SYNC_CHECKS=1`` to see which id).
An out-of-range id is a bug upstream (a tokenizer and model that disagree), not a state to
recover from, and without any check it would silently give a wrong logprob.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Literal

import torch
import torch.distributed as dist

from dapo_megatron.kernels.chunked import (
    chunked_linear_logprob,
    compute_dtype_for,
    default_chunk_size,
)
from dapo_megatron.kernels.reference import linear_logprob_reference

SYNC_CHECKS_ENV = "DAPO_SYNC_CHECKS"
"""Set to 1 to range-check target ids on accelerators with a host sync (module docstring)."""

NO_TRITON_ENV = "DAPO_NO_TRITON"
"""Set to 1 and ``"auto"`` never picks the Triton kernels (logprob and PG loss): the torch
paths run instead. For a device where the compiled kernels fail (bench/gpu_run.py sets it
for its runs when its check of the kernels failed); an explicit ``impl="triton"`` stays."""


def triton_auto_allowed() -> bool:
    """Whether ``"auto"`` may pick the Triton kernels (:data:`NO_TRITON_ENV` unset or 0)."""
    return os.environ.get(NO_TRITON_ENV, "0") in ("", "0")


LogprobImpl = Literal["auto", "chunked", "reference", "triton"]
LOGPROB_IMPLS: tuple[str, ...] = ("auto", "chunked", "reference", "triton")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# GPU architectures (compute capability major) where a compiled fp32 configuration of the
# Triton kernels runs without spilling; see the module docstring.
FP32_TRITON_ARCHS: frozenset[int] = frozenset({8, 9})


def triton_takes_dtype(dtype: torch.dtype, capability_major: int) -> bool:
    """Whether ``impl="auto"`` runs the Triton kernels for ``dtype`` inputs on a GPU of this
    compute capability major version."""
    if dtype == torch.float32:
        return capability_major in FP32_TRITON_ARCHS
    return dtype in (torch.float16, torch.bfloat16)


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package imports (it is absent or broken on some CPU installs)."""
    try:
        import triton  # noqa: F401
    except Exception:  # an install without a driver can fail with more than ImportError
        return False
    return True


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _resolve_impl(impl: str, hidden_NH: torch.Tensor) -> str:
    """The implementation ``impl="auto"`` stands for with these inputs."""
    if impl != "auto":
        return impl
    if hidden_NH.is_cuda and triton_available() and triton_auto_allowed():
        major = torch.cuda.get_device_capability(hidden_NH.device)[0]
        if triton_takes_dtype(hidden_NH.dtype, major):
            return "triton"
    return "chunked"


def _validate(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    targets_N: torch.Tensor,
    temperature: float,
    vocab_start: int,
    tp_group: Any,
    chunk_size: int | None,
    impl: str,
    vocab_size: int | None,
) -> None:
    """Raise ValueError naming the first bad argument and its value."""
    if impl not in LOGPROB_IMPLS:
        raise ValueError(f"impl must be one of {LOGPROB_IMPLS}, got {impl!r}")
    if hidden_NH.dim() != 2:
        raise ValueError(f"hidden_NH must be 2-D [N, H], got shape {tuple(hidden_NH.shape)}")
    if weight_VH.dim() != 2 or weight_VH.shape[1] != hidden_NH.shape[1]:
        raise ValueError(
            f"weight_VH must be [V_local, H={hidden_NH.shape[1]}], got shape "
            f"{tuple(weight_VH.shape)}"
        )
    if weight_VH.shape[0] == 0:
        raise ValueError("weight_VH has no vocabulary rows (shape[0] == 0)")
    if targets_N.shape != hidden_NH.shape[:1]:
        raise ValueError(
            f"targets_N must have shape [N={hidden_NH.shape[0]}], got {tuple(targets_N.shape)}"
        )
    if hidden_NH.dtype not in _FLOAT_DTYPES or weight_VH.dtype != hidden_NH.dtype:
        raise ValueError(
            f"hidden_NH and weight_VH must share a float dtype, got hidden_NH.dtype="
            f"{hidden_NH.dtype}, weight_VH.dtype={weight_VH.dtype}"
        )
    if targets_N.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"targets_N must be int32 or int64, got dtype {targets_N.dtype}")
    if not hidden_NH.device == weight_VH.device == targets_N.device:
        raise ValueError(
            f"hidden_NH, weight_VH and targets_N must be on one device, got "
            f"{hidden_NH.device}, {weight_VH.device}, {targets_N.device}"
        )
    if not (isinstance(temperature, (int, float)) and 0.0 < temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    tp_size = 1 if tp_group is None else dist.get_world_size(tp_group)
    vocab_global = weight_VH.shape[0] * tp_size
    if vocab_size is not None and not 0 < vocab_size <= vocab_global:
        raise ValueError(f"vocab_size={vocab_size} must be in (0, {vocab_global}] (padded rows)")
    if not 0 <= vocab_start <= vocab_global - weight_VH.shape[0]:
        raise ValueError(
            f"vocab_start={vocab_start} puts the shard of {weight_VH.shape[0]} rows outside "
            f"the global vocabulary [0, {vocab_global}) (tp size {tp_size})"
        )
    if impl == "triton":
        if hidden_NH.dtype not in _TRITON_DTYPES:
            raise ValueError(
                f"impl='triton' takes fp16/bf16/fp32 inputs, got {hidden_NH.dtype} "
                "(use impl='chunked' for float64)"
            )
        if not triton_available():
            raise ValueError("impl='triton' needs the triton package, which does not import")
        if not hidden_NH.is_cuda and not _triton_interpreted():
            raise ValueError(
                f"impl='triton' needs CUDA tensors (got {hidden_NH.device}); CPU tensors "
                "run only under TRITON_INTERPRET=1"
            )
    if impl == "reference" and tp_size > 1:
        raise ValueError(f"impl='reference' is single-process, got a tp_group of size {tp_size}")
    _check_targets(targets_N, vocab_global if vocab_size is None else vocab_size)


def _sync_checks() -> bool:
    return os.environ.get(SYNC_CHECKS_ENV, "0") not in ("", "0")


def _check_targets(targets_N: torch.Tensor, limit: int) -> None:
    """Every target id in ``[0, limit)``: exact and readable on the host, an asynchronous
    device-side assertion on an accelerator (module docstring)."""
    if targets_N.numel() == 0:
        return
    hint = "(mask ignored positions, e.g. -100, to a valid id before calling)"
    if targets_N.device.type == "cpu" or _sync_checks():
        lo, hi = int(targets_N.min()), int(targets_N.max())
        if lo < 0 or hi >= limit:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"targets_N holds token id {bad}, outside the vocabulary [0, {limit}) {hint}"
            )
        return
    in_range = ((targets_N >= 0) & (targets_N < limit)).all()
    torch._assert_async(in_range, f"targets_N holds a token id outside [0, {limit}) {hint}")


def linear_logprob(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    targets_N: torch.Tensor,
    *,
    temperature: float = 1.0,
    vocab_start: int = 0,
    tp_group: Any = None,
    compute_entropy: bool = False,
    chunk_size: int | None = None,
    impl: LogprobImpl = "auto",
    reduce_grad_hidden: bool = True,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token ``log softmax(h W^T / T)[target]`` (and entropy) over a vocab-parallel weight.

    Args:
        hidden_NH: ``[N, H]`` final hidden states (bf16/fp16/fp32/fp64), the full tensor on
            every rank of ``tp_group`` (gather sequence-parallel activations first).
        weight_VH: ``[V_local, H]`` this rank's rows of the output layer, same dtype; global
            vocabulary ids ``[vocab_start, vocab_start + V_local)``. V_global is
            ``V_local * tp size`` (Megatron pads the vocabulary evenly).
        targets_N: ``[N]`` int32/int64 GLOBAL token ids, all in ``[0, V_global)``.
        temperature: logits are divided by it; > 0.
        vocab_start: global id of ``weight_VH[0]``.
        tp_group: process group over which the vocabulary is split; None = single process.
        compute_entropy: also return the entropy of each row's distribution.
        chunk_size: tokens per chunk (chunked path only); None = about 256 MiB of logits per
            chunk.
        impl: ``"auto"``, ``"chunked"``, ``"triton"`` or ``"reference"`` (see the module
            docstring).
        reduce_grad_hidden: all-reduce the gradient of ``hidden_NH`` over ``tp_group`` (the
            input is a replica); False when the caller's TP region op reduces it instead.
        vocab_size: number of real vocabulary entries when the weight carries padding rows
            (Megatron pads to a multiple of 128 * TP); rows at global ids >= vocab_size are
            left out of the softmax (their gradient is zero). None: every row is real.

    Returns:
        ``(logprob_N, entropy_N or None)``, fp32 (fp64 for fp64 inputs), differentiable
        w.r.t. ``hidden_NH`` and ``weight_VH``. ``logprob_N <= 0`` and ``entropy_N >= 0``.

    Raises:
        ValueError: a shape, dtype, device, temperature, chunk size, vocab range or target id
            is invalid.
    """
    _validate(
        hidden_NH,
        weight_VH,
        targets_N,
        temperature,
        vocab_start,
        tp_group,
        chunk_size,
        impl,
        vocab_size,
    )
    targets_N = targets_N.long()
    if vocab_size is not None:
        # Slicing (rather than masking logits) keeps padding out of every chunk's GEMM; a
        # shard may end up with no rows, which the chunked path handles.
        weight_VH = weight_VH[: max(0, min(weight_VH.shape[0], vocab_size - vocab_start))]
    if impl == "reference":
        # Upcast like the chunked path does, so both compute the same numbers in the same
        # output dtype and callers can switch implementations freely.
        cdtype = compute_dtype_for(hidden_NH.dtype)
        return linear_logprob_reference(
            hidden_NH.to(cdtype),
            weight_VH.to(cdtype),
            targets_N,
            temperature=temperature,
            compute_entropy=compute_entropy,
        )
    if _resolve_impl(impl, hidden_NH) == "triton":
        from dapo_megatron.kernels.triton_logprob import triton_linear_logprob

        return triton_linear_logprob(
            hidden_NH,
            weight_VH,
            targets_N,
            temperature=float(temperature),
            vocab_start=vocab_start,
            tp_group=tp_group,
            compute_entropy=compute_entropy,
            reduce_grad_hidden=reduce_grad_hidden,
        )
    if chunk_size is None:
        chunk_size = default_chunk_size(weight_VH.shape[0], hidden_NH.dtype)
    return chunked_linear_logprob(
        hidden_NH,
        weight_VH,
        targets_N,
        temperature=float(temperature),
        vocab_start=vocab_start,
        tp_group=tp_group,
        compute_entropy=compute_entropy,
        chunk_size=chunk_size,
        reduce_grad_hidden=reduce_grad_hidden,
    )
