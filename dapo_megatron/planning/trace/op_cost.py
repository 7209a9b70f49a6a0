"""FLOPs and bytes of every aten op a piece of code runs: the traced step's compute cost.

``OpCostMode`` is a TorchDispatchMode. While it is active, every aten op that reaches the
dispatcher (forward, and backward on autograd's threads, which inherit the mode) is
recorded into a ``roofline.OpCosts`` as (op, FLOPs, bytes read + written), and
``OpCosts.roofline_s(card)`` prices them for the step-time estimate (step_time.py
``TracedRank``)::

    with fake_cuda(...) as fake:            # the tracer's FakeTensorMode, entered first
        ...
        with OpCostMode() as costs:         # entered inside it: it sees every op first
            forward_backward(...)
        costs.ops                           # the OpCosts
        costs.ops.roofline_s(COMPUTE_CARDS["H100 SXM"])

It reads only shapes, dtypes and op arguments, never data, so it works on FakeTensors
and on real tensors alike. Enter it inside the tracer's FakeTensorMode (after it), as
above: it then sees each op before the fake mode runs it (tests/unit/planning/
trace/test_op_cost.py checks that order, and real CPU tensors).

What counts:
* FLOPs: torch.utils.flop_counter's registered formulas (mm, addmm, bmm, baddbmm,
  convolutions, the SDPA/flash/efficient attention kernels and their backwards), plus the
  CPU flash-attention kernel and its backward; attention run with ``is_causal`` is halved
  (torch's formulas count the full square; flash skips the masked half). Other ops count
  0 FLOPs: elementwise and reductions are bound by their bytes on any GPU.
* Bytes: every tensor argument's and output's numel x element size (one level of tensor
  lists, e.g. cat's, foreach's). A destination that is only written (copy_, fill_,
  zero_) is not counted as read. Broadcast (expanded, stride-0) inputs count their
  logical size: an over-count for the few ops that take them.
* Skipped: views and metadata-only ops (their outputs alias their input: no traffic),
  allocations without a write (empty, empty_strided), ops whose results are all empty
  (zero-size tensors: nothing computed; an in-place op returning nothing still counts),
  and collectives (c10d namespaces: the step-time model prices communication itself).

A stand-in for a GPU kernel that computes nothing (the tracer's TE/flash stand-ins
allocate their outputs with zeros) declares what the kernel costs instead: inside
``kernel(name, flops, nbytes)`` the ops the stand-in runs are not recorded and the kernel is
recorded once, in every active mode (``causal_attention_flops`` gives flash's FLOPs over
packed sequences). Without it a stand-in shows as its allocations' bytes and no FLOPs.

Per op the work is a cached per-overload lookup and a walk of its arguments (~1e5 ops of
a traced step: seconds at most).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from dapo_megatron.planning.roofline import OpCosts

aten = torch.ops.aten

_SKIPPED_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd", "prim"})
"""Collectives (priced by the step-time model) and prims (device queries)."""

_NO_TRAFFIC = frozenset(
    {
        # Aliases the schema does not mark as views (a reshape of a fresh result).
        aten._unsafe_view.default,
        aten._reshape_alias.default,
        aten.alias.default,
        aten.lift_fresh.default,
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
        aten.resize_.default,
        aten.set_.source_Storage_storage_offset,
        aten._local_scalar_dense.default,
        aten.is_same_size.default,
        aten.sym_size.int,
        aten.sym_stride.int,
        aten.sym_numel.default,
        aten.sym_storage_offset.default,
        aten.is_contiguous.default,
        aten.is_contiguous.memory_format,
        aten.is_strides_like_format.default,
        aten.is_non_overlapping_and_dense.default,
        aten.size.default,
        aten.stride.default,
        aten.numel.default,
        aten.dim.default,
        aten.storage_offset.default,
    }
)
"""Allocations and metadata queries: no memory traffic."""

_WRITE_ONLY_DEST = frozenset(
    {aten.copy_.default, aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default}
)
"""Ops whose first argument is overwritten without being read."""


def _cpu_flash_flop(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query.shape, key.shape, value.shape))


def _cpu_flash_backward_flop(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any
) -> int:
    return int(sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape))


_EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flop,
}
"""The CPU flash kernels (not in torch's registry), called with tensors: (q, k, v, ...) and
(grad_out, q, k, v, ...)."""


@dataclass(frozen=True)
class _Plan:
    """How one op overload is recorded (computed once per overload)."""

    skip: bool
    """Not recorded."""
    name: str
    """The overload's name, as OpCosts keys it."""
    formula: Callable[..., int] | None
    """FLOPs from (*args, **kwargs, out_val=out) (torch's registry) or from the tensors."""
    torch_formula: bool
    """``formula`` is torch's (takes out_val)."""
    causal_index: int | None
    """Position of an ``is_causal`` argument, when the op has one."""
    dest_write_only: bool
    """The first argument is written, not read."""


def _plan(func: Any) -> _Plan:
    name = str(func)
    skip = (
        not isinstance(func, torch._ops.OpOverload)
        or func.namespace in _SKIPPED_NAMESPACES
        or func in _NO_TRAFFIC
        or func.is_view
    )
    packet = getattr(func, "_overloadpacket", None)
    formula: Callable[..., int] | None = None
    torch_formula = False
    if packet in flop_registry:
        formula, torch_formula = flop_registry[packet], True
    elif packet in _EXTRA_FORMULAS:
        formula = _EXTRA_FORMULAS[packet]
    causal = None
    if formula is not None:
        names = [a.name for a in func._schema.arguments]
        causal = names.index("is_causal") if "is_causal" in names else None
    return _Plan(skip, name, formula, torch_formula, causal, func in _WRITE_ONLY_DEST)


def _tensor_bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return int(x.numel()) * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(int(t.numel()) * t.element_size() for t in x if isinstance(t, torch.Tensor))
    return 0


def _returns_tensors(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return True
    return isinstance(out, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in out)


def _is_causal(plan: _Plan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if plan.causal_index is None:
        return False
    if "is_causal" in kwargs:
        return bool(kwargs["is_causal"])
    return len(args) > plan.causal_index and bool(args[plan.causal_index])


class OpCostMode(TorchDispatchMode):
    """Records each aten op's FLOPs and bytes into ``self.ops`` while active (module
    docstring). ``with OpCostMode() as mode:`` yields the mode; read ``mode.ops`` after."""

    # TorchDispatchMode's __init__, __enter__ and __exit__ are unannotated in torch.
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops = OpCosts()
        """Every recorded op, as (name, FLOPs, bytes) -> count."""
        self._plans: dict[Any, _Plan] = {}
        self._inside_kernel = 0

    def __enter__(self) -> OpCostMode:
        _ACTIVE.append(self)
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        _ACTIVE.remove(self)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._inside_kernel:
            return out
        plan = self._plans.get(func)
        if plan is None:
            plan = self._plans[func] = _plan(func)
        if plan.skip:
            return out
        nbytes = _tensor_bytes(out)
        if nbytes == 0 and _returns_tensors(out):
            return out  # an empty result: nothing computed
        for i, a in enumerate(args):
            if i == 0 and plan.dest_write_only:
                continue
            nbytes += _tensor_bytes(a)
        for v in kwargs.values():
            nbytes += _tensor_bytes(v)
        flops = 0
        if plan.formula is not None:
            if plan.torch_formula:
                flops = int(plan.formula(*args, **kwargs, out_val=out))
            else:
                flops = int(plan.formula(*args, **kwargs))
            if _is_causal(plan, args, kwargs):
                flops //= 2
        if nbytes or flops:
            self.ops.add(plan.name, flops, nbytes)
        return out


_ACTIVE: list[OpCostMode] = []
"""Modes entered and not yet exited (``kernel`` records into each)."""


@contextlib.contextmanager
def kernel(name: str, flops: int, nbytes: int) -> Iterator[None]:
    """Inside a stand-in for a GPU kernel: record (name, flops, nbytes) once in every active
    OpCostMode, and none of the ops the stand-in runs (module docstring). A no-op when no
    mode is active."""
    modes = list(_ACTIVE)
    for mode in modes:
        mode.ops.add(name, flops, nbytes)
        mode._inside_kernel += 1
    try:
        yield
    finally:
        for mode in modes:
            mode._inside_kernel -= 1


def causal_attention_flops(seq_lens: Sequence[int], heads: int, head_dim: int, cp: int = 1) -> int:
    """Forward FLOPs of causal flash attention over packed sequences on one rank of `heads`
    query heads: per sequence QK^T and PV, 2 s^2 d each, halved by the causal mask (the
    masked blocks are skipped), so 2 s^2 heads d; CP ranks share each sequence's
    queries. Backward: 2.5x (S recomputed, dP, dV, dQ, dK)."""
    return sum(2 * s * s * heads * head_dim for s in seq_lens) // cp
