"""Counting the places where code would wait for a CUDA device, while it runs on a CPU.

On a GPU the host queues kernels and runs ahead; it stops and waits (a host sync) whenever
it needs a value the device computes: ``.item()``, ``int()``/``bool()`` of a tensor,
``.tolist()``/``.cpu()``, and ops whose output size depends on data (``nonzero``,
``masked_select``, indexing with a boolean mask, ``unique``, ``repeat_interleave`` without
an output size). On a CPU none of these wait, so a test cannot see them by timing;
``HostSyncCounter`` sees them by the op itself: it records, under a torch dispatch mode,
every aten op of that list, and counts the explicit CUDA waits (``torch.cuda.synchronize``,
``Event.synchronize``, ``Stream.synchronize``) by patching them for its duration.
Used by the decode-loop tests and bench/generation.py (host syncs per decoded token).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
# Ops that read a device value on the host, or size their output by device data.
_SYNC_OPS = {
    _aten._local_scalar_dense.default: "item",
    _aten.nonzero.default: "nonzero",
    _aten.masked_select.default: "masked_select",
    _aten.unique_dim.default: "unique",
    _aten._unique2.default: "unique",
    _aten.unique_consecutive.default: "unique",
    _aten.repeat_interleave.Tensor: "repeat_interleave",
}
# Indexing ops that turn a boolean mask into indices (a nonzero) before they run.
_INDEX_OPS = (_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default)
_CUDA_WAITS: tuple[tuple[Any, str], ...] = (
    (torch.cuda, "synchronize"),
    (torch.cuda.Event, "synchronize"),
    (torch.cuda.Stream, "synchronize"),
)


def _bool_indexed(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool
        for i in indices or ()
        if i is not None
    )


class HostSyncCounter(TorchDispatchMode):
    """``with HostSyncCounter() as syncs:`` ... then ``syncs.total`` and ``syncs.by_kind``.

    ``.tolist()`` and ``.cpu()`` are counted too (they copy device data to the host without
    an aten op that a CPU tensor would show). ``ops`` counts every aten op run: what a host
    launches, one kernel or more each on a GPU."""

    # TorchDispatchMode's __init__, __enter__ and __exit__ are unannotated in torch.
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.ops = 0
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def total(self) -> int:
        """Host syncs seen so far."""
        return sum(self.by_kind.values())

    def _count(self, kind: str) -> None:
        self.by_kind[kind] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        kind = _SYNC_OPS.get(func)
        if kind is None and func in _INDEX_OPS and _bool_indexed(args):
            kind = "boolean index"
        if kind is not None:
            self._count(kind)
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> HostSyncCounter:
        def counting(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*a: Any, **k: Any) -> Any:
                self._count(kind)
                return original(*a, **k)

            return wrapper

        patches: list[tuple[Any, str]] = [
            *_CUDA_WAITS,
            (torch.Tensor, "tolist"),
            (torch.Tensor, "cpu"),
        ]
        for owner, name in patches:
            original = getattr(owner, name)
            self._saved.append((owner, name, original))
            setattr(owner, name, counting(f"{getattr(owner, '__name__', owner)}.{name}", original))
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
