"""Every collective this package issues, with each tensor on the device its group serves.

Why one module: a process group serves the devices of its backend, and the two backends
we run on disagree. NCCL takes CUDA tensors only; gloo takes CPU tensors (and, for a few
operations, CUDA ones by staging them through the host). Megatron builds its TP, PP, CP and
DP groups with the default backend, so on a GPU run they are NCCL groups, while the CPU
twin in CI runs them on gloo, which accepts whatever it is handed: a CPU tensor sent to an
NCCL group passes every CPU test and fails on the first GPU run. So no code outside this
module (and ``refit/``, whose groups it builds itself) calls a ``torch.distributed``
collective; ``tests/unit/device/test_collectives.py`` holds that as a static guard.

Placement rule (``device_types``, ``device_for``):

* the backend is read with ``dist.get_backend(group)``: ``"nccl"`` serves CUDA,
  ``"gloo"`` serves CPU (gloo's CUDA support covers only some operations, so we never rely
  on it); a group created with several ``"device:backend"`` pairs (``"cpu:gloo,cuda:nccl"``)
  serves each listed device (a ``cuda:gloo`` pair counts as CPU-only, as above); other
  named backends serve what torch's ``Backend.backend_capability`` table says; a group
  initialised without a backend (``"undefined"``, resolved lazily by torch) serves the
  machine's accelerator, or CPU without one;
* a tensor already on a device type its group serves, and contiguous, is used as it is
  (the hot path: no copy, no host sync);
* otherwise it is copied to ``device_for(group)`` (CPU when the group serves CPU; else the
  group's bound CUDA device, ``init_process_group(device_id=...)``, or
  ``torch.cuda.current_device()``), the collective runs on the copy, and an output is
  copied back into the caller's tensor, so the in-place contract of ``torch.distributed``
  holds on every backend (a non-contiguous tensor is handled the same way, so its
  reduction is never lost in a temporary).

Object collectives (``broadcast_object_list``, ``all_gather_object``, ``gather_object``)
and ``barrier`` pickle into tensors that torch places itself: for an NCCL group on
``torch.cuda.current_device()``. That device must be this rank's GPU
(``torch.cuda.set_device(local_rank)`` before the first collective, as
``megatron/distributed.py`` does), or every rank would talk on GPU 0. The wrappers run
those calls with the group's device made current and hand ``barrier`` its device id.

The wrappers never skip the collective for a group of one rank: callers that want to skip
it test the size themselves, and ``self_check`` relies on the real call being made.

``reduce_values`` reduces a small dict of scalars (metric sums, flags) in ONE collective:
the values are stacked into one tensor, on the group's device (pass a gloo group, e.g.
Megatron's ``parallel_state.get_data_parallel_group_gloo()``, to keep host scalars on the
host; pass the NCCL group to keep device scalars on the device).

This module imports only torch: ``kernels/`` uses it and must not import Megatron.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

Group = Any
"""A ``torch.distributed.ProcessGroup`` or None (the default group)."""

ReduceOp = dist.ReduceOp.RedOpType
"""The type of ``dist.ReduceOp.SUM`` / ``MAX`` / ``MIN`` (a ``RedOpType``)."""

SUM = dist.ReduceOp.SUM
MAX = dist.ReduceOp.MAX
MIN = dist.ReduceOp.MIN


# ---------------------------------------------------------------------------------------
# Which device a group serves


def backend_name(group: Group = None) -> str:
    """The group's backend string as torch stored it, lower case (``"nccl"``, ``"gloo"``,
    ``"cpu:gloo,cuda:nccl"``, ``"undefined"``, ...)."""
    return str(dist.get_backend(group)).lower()


def _accelerator_type() -> str:
    """The machine's accelerator type (``"cuda"``), or ``"cpu"`` without one."""
    if torch.cuda.is_available():
        return "cuda"
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator is not None else None
    return "cpu" if current is None else str(current.type)


def _served_by(device: str, backend: str) -> bool:
    """Whether we let ``backend`` carry tensors of ``device`` (gloo: CPU only)."""
    return device == "cpu" if backend == "gloo" else True


def device_types(group: Group = None) -> tuple[str, ...]:
    """The device types whose tensors ``group`` takes as they are (module docstring)."""
    name = backend_name(group)
    if ":" in name:  # "cpu:gloo,cuda:nccl": one backend per device type
        pairs = [pair.split(":", 1) for pair in name.split(",") if pair]
        served = tuple(dev.strip() for dev, be in pairs if _served_by(dev.strip(), be.strip()))
        return served or ("cpu",)
    if name == "gloo":
        return ("cpu",)
    if name == "undefined":
        return (_accelerator_type(),)
    capability = dist.Backend.backend_capability.get(name)
    return tuple(capability) if capability else ("cpu", "cuda")


def _bound_device(group: Group) -> torch.device | None:
    """The CUDA device the group (or the default group) was bound to at creation, if any."""
    pg = group if group is not None else dist.group.WORLD
    bound = getattr(pg, "bound_device_id", None)
    return bound if isinstance(bound, torch.device) and bound.type == "cuda" else None


def _cuda_device(group: Group) -> torch.device:
    bound = _bound_device(group)
    if bound is not None and bound.index is not None:
        return bound
    return torch.device("cuda", torch.cuda.current_device())


def device_for(group: Group = None) -> torch.device:
    """Where a tensor must be for ``group``'s collectives when its own device is not served.

    CPU when the group serves CPU (host data needs no copy; torch's object collectives
    choose the same way), else this rank's CUDA device for CUDA groups, else the first
    device type the backend serves.
    """
    types = device_types(group)
    if "cpu" in types:
        return torch.device("cpu")
    if "cuda" in types:
        return _cuda_device(group)
    return torch.device(types[0])


def _move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The copy a collective runs on (a seam: tests replace it to fake a CUDA device)."""
    return tensor.to(device)


def _placed(tensor: torch.Tensor, group: Group) -> torch.Tensor:
    """``tensor`` itself when the group serves it as it is, else a contiguous copy there."""
    if tensor.device.type in device_types(group) and tensor.is_contiguous():
        return tensor
    target = tensor.device if tensor.device.type in device_types(group) else device_for(group)
    return _move(tensor, target).contiguous()


def _copy_back(caller: torch.Tensor, placed: torch.Tensor) -> None:
    if placed is not caller:
        caller.copy_(placed)


def _not_member(group: Group) -> bool:
    """A rank outside ``group``: torch's collectives return at once, so do ours."""
    return group is not None and group is dist.GroupMember.NON_GROUP_MEMBER


@contextlib.contextmanager
def _on_group_device(group: Group) -> Iterator[torch.device]:
    """Make the group's device current while torch allocates its own buffers (object
    collectives, barrier) on ``torch.cuda.current_device()``."""
    device = device_for(group)
    if device.type == "cuda":
        with torch.cuda.device(device):
            yield device
    else:
        yield device


# ---------------------------------------------------------------------------------------
# Tensor collectives (synchronous; in place on the caller's tensors, as in torch)


def all_reduce(tensor: torch.Tensor, op: ReduceOp = SUM, group: Group = None) -> torch.Tensor:
    """``dist.all_reduce`` on the group's device; the result lands in ``tensor``."""
    if _not_member(group):
        return tensor
    placed = _placed(tensor, group)
    dist.all_reduce(placed, op=op, group=group)
    _copy_back(tensor, placed)
    return tensor


def broadcast(tensor: torch.Tensor, src: int, group: Group = None) -> torch.Tensor:
    """``dist.broadcast`` from GLOBAL rank ``src``; the result lands in ``tensor``."""
    if _not_member(group):
        return tensor
    placed = _placed(tensor, group)
    dist.broadcast(placed, src=src, group=group)
    _copy_back(tensor, placed)
    return tensor


def all_gather(
    tensor_list: Sequence[torch.Tensor], tensor: torch.Tensor, group: Group = None
) -> None:
    """``dist.all_gather``: rank ``r``'s ``tensor`` lands in ``tensor_list[r]``."""
    if _not_member(group):
        return
    outputs = [_placed(t, group) for t in tensor_list]
    dist.all_gather(outputs, _placed(tensor, group), group=group)
    for caller, placed in zip(tensor_list, outputs, strict=True):
        _copy_back(caller, placed)


def all_gather_into_tensor(
    output: torch.Tensor, tensor: torch.Tensor, group: Group = None
) -> torch.Tensor:
    """``dist.all_gather_into_tensor``: the ranks' ``tensor`` concatenated along dim 0."""
    if _not_member(group):
        return output
    placed = _placed(output, group)
    # torch 2.13 renamed it all_gather_single (the old name warns); older torch lacks it.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(placed, _placed(tensor, group), group=group)
    _copy_back(output, placed)
    return output


def reduce_values(
    values: Mapping[str, torch.Tensor | float],
    op: ReduceOp = SUM,
    group: Group = None,
    *,
    dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:
    """Reduce a small dict of scalars over ``group`` in one collective.

    The values (0-d or 1-element tensors, or numbers) are stacked into one ``dtype`` tensor:
    on the device of the first tensor value the group serves, else on ``device_for(group)``
    (each number or unserved tensor is copied there once). Returns 0-d tensors on that
    device, same keys and order; nothing is read back to the host.
    """
    if not values:
        return {}
    served = device_types(group)
    home = next(
        (
            v.device
            for v in values.values()
            if isinstance(v, torch.Tensor) and v.device.type in served
        ),
        device_for(group),
    )
    numbers = [float(v) for v in values.values() if not isinstance(v, torch.Tensor)]
    # The numbers travel together: one copy for all of them.
    host = iter(_move(torch.tensor(numbers, dtype=dtype), home).unbind()) if numbers else iter(())
    parts = [
        _move(v.detach().reshape(()).to(dtype), home) if isinstance(v, torch.Tensor) else next(host)
        for v in values.values()
    ]
    stacked = torch.stack(parts)
    all_reduce(stacked, op=op, group=group)
    return dict(zip(values, stacked.unbind(), strict=True))


# ---------------------------------------------------------------------------------------
# Object collectives and barrier (pickled through tensors torch places itself)


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Group = None) -> None:
    """``dist.broadcast_object_list`` from GLOBAL rank ``src``, in place."""
    if _not_member(group):
        return
    with _on_group_device(group) as device:
        dist.broadcast_object_list(object_list, src=src, group=group, device=device)


def all_gather_object(object_list: list[Any], obj: Any, group: Group = None) -> None:
    """``dist.all_gather_object``: rank ``r``'s ``obj`` lands in ``object_list[r]``."""
    if _not_member(group):
        return
    with _on_group_device(group):
        dist.all_gather_object(object_list, obj, group=group)


def gather_object(
    obj: Any, object_gather_list: list[Any] | None, dst: int = 0, group: Group = None
) -> None:
    """``dist.gather_object`` to GLOBAL rank ``dst`` (whose list receives every object)."""
    if _not_member(group):
        return
    with _on_group_device(group):
        dist.gather_object(obj, object_gather_list, dst=dst, group=group)


def barrier(group: Group = None) -> None:
    """``dist.barrier``; an NCCL group is told its device (torch would otherwise guess)."""
    if _not_member(group):
        return
    with _on_group_device(group) as device:
        if device.type == "cuda":
            dist.barrier(group=group, device_ids=[device.index])
        else:
            dist.barrier(group=group)


# ---------------------------------------------------------------------------------------
# A check of every wrapper on a real one-rank group (CI on gloo; the GPU script on NCCL)


def _expect(name: str, ok: bool, detail: object) -> bool:
    if not ok:
        raise AssertionError(f"collectives.self_check: {name} failed: {detail}")
    return True


def self_check(device: str) -> dict[str, Any]:
    """Run every wrapper with CPU input tensors on the initialised one-rank default group.

    Args:
        device: the device type the default group must serve (``"cuda"`` for NCCL,
            ``"cpu"`` for gloo); checked against ``device_for``.

    Returns:
        name -> True (or the values seen) for each check; the collectives really run (the
        wrappers do not skip a group of one), so on NCCL a CPU tensor that reached the
        backend unmoved would raise.

    Raises:
        AssertionError: a result differs from what a one-rank group must give.
        RuntimeError: the default group is not initialised or has more than one rank.
    """
    if not dist.is_initialized() or dist.get_world_size() != 1:
        raise RuntimeError("self_check needs an initialised default group of one rank")
    results: dict[str, Any] = {"backend": backend_name(), "device_for": str(device_for())}
    _expect("device_for", device_for().type == device, results)

    values = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64)
    for name, op in (("all_reduce_sum", SUM), ("all_reduce_max", MAX), ("all_reduce_min", MIN)):
        out = values.clone()
        returned = all_reduce(out, op=op)
        ok = returned is out and out.device.type == "cpu" and torch.equal(out, values)
        results[name] = _expect(name, ok, out)

    strided = torch.arange(12, dtype=torch.float32).view(3, 4).t()  # not contiguous
    expected = strided.clone()
    all_reduce(strided)
    results["all_reduce_noncontiguous"] = _expect(
        "all_reduce_noncontiguous", torch.equal(strided, expected), strided
    )

    sent = torch.arange(6, dtype=torch.int64).view(2, 3)
    target = torch.full_like(sent, -1)
    broadcast(target.copy_(sent), src=0)
    results["broadcast"] = _expect("broadcast", torch.equal(target, sent), target)

    parts = [torch.full_like(sent, -1)]
    all_gather(parts, sent)
    results["all_gather"] = _expect("all_gather", torch.equal(parts[0], sent), parts)

    full = torch.full((2, 3), float("nan"))
    all_gather_into_tensor(full, sent.float())
    results["all_gather_into_tensor"] = _expect(
        "all_gather_into_tensor", torch.equal(full, sent.float()), full
    )

    reduced = reduce_values({"a": 2.5, "b": torch.tensor(7.0), "c": torch.tensor([-1.0])}, SUM)
    seen = {k: float(v) for k, v in reduced.items()}
    results["reduce_values"] = seen
    _expect("reduce_values", seen == {"a": 2.5, "b": 7.0, "c": -1.0}, seen)

    if device != "cpu":  # a tensor already on the served device is used as it is
        on_device = values.to(device)
        pointer = on_device.data_ptr()
        all_reduce(on_device)
        same = on_device.data_ptr() == pointer and torch.equal(on_device.cpu(), values)
        results["all_reduce_on_device"] = _expect("all_reduce_on_device", same, on_device)

    holder: list[Any] = [{"step": 3, "name": "x"}]
    broadcast_object_list(holder, src=0)
    results["broadcast_object_list"] = _expect(
        "broadcast_object_list", holder == [{"step": 3, "name": "x"}], holder
    )
    everyone: list[Any] = [None]
    all_gather_object(everyone, ("rank", 0))
    results["all_gather_object"] = _expect("all_gather_object", everyone == [("rank", 0)], everyone)
    shares: list[Any] = [None]
    gather_object({"n": math.pi}, shares, dst=0)
    results["gather_object"] = _expect("gather_object", shares == [{"n": math.pi}], shares)
    barrier()
    results["barrier"] = True
    return results
