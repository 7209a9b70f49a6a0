"""A fake CUDA device for one process: Megatron's GPU code path on a CPU-only torch build.

Used only by the memory tracer (``python -m dapo_megatron.megatron.fake_trace``), in a process
of its own started with the C++ shim LD_PRELOADed (planning/trace/shim.py says why). Inside
``fake_cuda()``:

- every tensor bound for the GPU (a factory call with ``device="cuda"``, ``.to("cuda")`` or
  ``.cuda()`` of a host tensor) becomes a FakeTensor on ``cuda:0``: shapes, dtypes and
  storages, no data; ops on them run torch's meta/fake kernels, so the bytes a GPU would
  allocate are allocated as fake storages (``memory.py`` counts them);
- host tensors stay real, so the host-side work of a step (packing rows into micro-batches,
  the loss normaliser on the batch) runs for real, as on a GPU;
- ``torch.cuda`` answers as one device of the card's size (capability 9.0: the Hopper
  decisions are taken), and its RNG/stream/synchronize calls do nothing;
- a read of a fake value into Python (``.item()``, ``bool()``, ``float()``) returns 0 of its
  type: the few places that read one (the non-finite-gradient check, grad-norm metrics) take
  their "all is well" branch, which is the branch a healthy GPU step takes.

``nn.Module.to``/``.cuda`` on fake parameters cannot swap tensors (FakeTensors hold weakrefs,
torch/nn/modules/module.py ``_apply``); ``_apply`` installs new Parameters instead, keeping
the attributes Megatron sets on them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

CUDA = torch.device("cuda", 0)
HOPPER = (9, 0)
"""Compute capability the fake device reports (H100/H200): kernels choose by it."""

_FACTORIES = {
    torch.empty,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.arange,
    torch.tensor,
    torch.as_tensor,
    torch.randn,
    torch.rand,
    torch.randint,
    torch.empty_strided,
    torch.eye,
    torch.linspace,
}
_SCALAR_READS: dict[Callable[..., Any], Callable[[torch.Tensor], Any]] = {
    torch.Tensor.item: lambda t: False if t.dtype == torch.bool else 0,
    torch.Tensor.tolist: lambda t: torch.zeros(t.shape, dtype=t.dtype).tolist(),
    torch.Tensor.__bool__: lambda t: False,
    torch.Tensor.__float__: lambda t: 0.0,
    torch.Tensor.__int__: lambda t: 0,
    torch.Tensor.__index__: lambda t: 0,
}


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True  # torch.cuda.current_device() passed as a device
    return torch.device(device).type == "cuda"


def _target_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The device of a ``.to(...)`` call, if it names one."""
    if "device" in kwargs:
        return kwargs["device"]
    for a in args:
        if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
            return a
        if isinstance(a, torch.Tensor):
            return a.device
    return None


class _FakeCuda(TorchFunctionMode):
    """Routes GPU-bound tensors into the fake mode; see the module docstring."""

    def __init__(self, fake: FakeTensorMode) -> None:
        super().__init__()
        self.fake = fake

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _SCALAR_READS and args and isinstance(args[0], FakeTensor):
            return _SCALAR_READS[func](args[0])
        if func in _FACTORIES and _is_cuda(kwargs.get("device")):
            if func in (torch.tensor, torch.as_tensor):
                # Built from Python data: made on the host, then moved (a CUDA build does
                # the same copy; fake mode has no device path for it).
                host = func(*args, **dict(kwargs, device="cpu"))
                with self.fake:
                    return self.fake.from_tensor(host).to(CUDA)
            kwargs = dict(kwargs, device=CUDA)
            with self.fake:
                return func(*args, **kwargs)
        if func in (torch.Tensor.to, torch.Tensor.cuda) and args:
            t = args[0]
            target = CUDA if func is torch.Tensor.cuda else _target_device(args[1:], kwargs)
            if not isinstance(t, FakeTensor) and _is_cuda(target):
                fake_t = self.fake.from_tensor(t)
                rest: list[Any] = [
                    CUDA if _is_cuda(a) and not isinstance(a, torch.Tensor) else a for a in args[1:]
                ]
                kw: dict[str, Any] = {k: (CUDA if k == "device" else v) for k, v in kwargs.items()}
                with self.fake:
                    if func is torch.Tensor.cuda:
                        return fake_t.to(CUDA, non_blocking=kw.get("non_blocking", False))
                    return fake_t.to(*rest, **kw)
        if any(isinstance(a, FakeTensor) for a in tree_flatten((args, kwargs))[0]):
            # Composite ops create tensors in C++ (a scalar operand's tensor, say) before
            # any FakeTensor dispatch: the mode must be active for them to be fake too.
            with self.fake:
                return func(*args, **kwargs)
        return func(*args, **kwargs)


_Apply = Callable[..., torch.nn.Module]
"""``nn.Module._apply``'s signature: (module, fn, recurse=True) -> module."""


def _fake_safe_apply(original: _Apply) -> _Apply:
    """``nn.Module._apply`` that replaces fake parameters instead of swapping them."""

    @functools.wraps(original)
    def _apply(
        self: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> torch.nn.Module:
        if recurse:
            for child in self.children():
                child._apply(fn)
        for name, param in list(self._parameters.items()):
            if param is None:
                continue
            applied = fn(param)
            if applied is param:
                continue
            new = torch.nn.Parameter(applied, requires_grad=param.requires_grad)
            # Megatron's per-parameter flags (tensor_model_parallel, sequence_parallel,
            # allreduce, shared, ...) live in the Parameter's __dict__.
            for key, value in vars(param).items():
                if not key.startswith("_") and key not in vars(new):
                    setattr(new, key, value)
            self._parameters[name] = new
        for name, buf in list(self._buffers.items()):
            if buf is not None:
                self._buffers[name] = fn(buf)
        return self

    return _apply


class _CudaStub:
    """What ``torch.cuda`` answers inside the fake device."""

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes

    def patches(self) -> dict[str, Any]:
        total = self.total_bytes

        class _Props:
            name = "fake-cuda (memory tracer)"
            total_memory = total
            major, minor = HOPPER
            multi_processor_count = 132

        class _Event:
            def __init__(self, *a: Any, **k: Any) -> None: ...

            def record(self, *a: Any, **k: Any) -> None: ...

            def synchronize(self) -> None: ...

            def wait(self, *a: Any, **k: Any) -> None: ...

            def query(self) -> bool:
                return True

            def elapsed_time(self, other: Any) -> float:
                return 0.0

        class _Stream:
            def __init__(self, *a: Any, **k: Any) -> None:
                self.device = CUDA

            def wait_stream(self, *a: Any) -> None: ...

            def wait_event(self, *a: Any) -> None: ...

            def record_event(self, event: Any = None) -> _Event:
                return event or _Event()

            def synchronize(self) -> None: ...

            def __enter__(self) -> _Stream:
                return self

            def __exit__(self, *a: Any) -> None: ...

        stream = _Stream()
        # Megatron's RNG tracker forks CUDA generator states (tensor_parallel/random.py):
        # a host generator stands in; the values never matter to memory.
        generator = torch.Generator()
        return {
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "_lazy_init": lambda: None,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "set_device": lambda d: None,
            "synchronize": lambda *a, **k: None,
            "get_device_capability": lambda *a, **k: HOPPER,
            "get_device_properties": lambda *a, **k: _Props(),
            "get_device_name": lambda *a, **k: _Props.name,
            "mem_get_info": lambda *a, **k: (total, total),
            "memory_allocated": lambda *a, **k: 0,
            "max_memory_allocated": lambda *a, **k: 0,
            "memory_reserved": lambda *a, **k: 0,
            "empty_cache": lambda: None,
            "reset_peak_memory_stats": lambda *a, **k: None,
            "manual_seed": lambda seed: None,
            "manual_seed_all": lambda seed: None,
            "get_rng_state": lambda *a, **k: generator.get_state(),
            "set_rng_state": lambda *a, **k: None,
            "default_generators": (generator,),
            "current_stream": lambda *a, **k: stream,
            "default_stream": lambda *a, **k: stream,
            "Stream": _Stream,
            "Event": _Event,
            "stream": lambda s=None: contextlib.nullcontext(),
            "nvtx": _Nvtx,
        }


class _Nvtx:
    @staticmethod
    def range_push(*a: Any, **k: Any) -> None: ...

    @staticmethod
    def range_pop(*a: Any, **k: Any) -> None: ...

    @staticmethod
    @contextlib.contextmanager
    def range(*a: Any, **k: Any) -> Iterator[None]:
        yield


@contextlib.contextmanager
def patched(target: Any, values: dict[str, Any]) -> Iterator[None]:
    """Set attributes of ``target`` for the duration, then restore them."""
    missing = object()
    # A class keeps its own attribute objects (a staticmethod stays one when restored).
    saved = {
        k: vars(target).get(k, missing) if isinstance(target, type) else getattr(target, k, missing)
        for k in values
    }
    try:
        for k, v in values.items():
            setattr(target, k, v)
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                delattr(target, k)
            else:
                setattr(target, k, v)


@contextlib.contextmanager
def fake_cuda(total_bytes: int, *, real: bool = False) -> Iterator[FakeTensorMode | None]:
    """The fake device (module docstring) of ``total_bytes``; yields the FakeTensorMode.
    ``real``: the same device answers with real host tensors (yields None)."""
    values = _CudaStub(total_bytes).patches()
    if real:
        # As on the CPU twin (cpu_compat._patch_current_device): Megatron's allocations
        # with device=torch.cuda.current_device() land on the host, in backward too.
        values["current_device"] = lambda: torch.device("cpu")
    rng = ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all")
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(torch.cuda, values))
        stack.enter_context(patched(torch.cuda.random, {k: values[k] for k in rng}))
        if real:
            # The CPU twin's own rewriting of "cuda" to host tensors (cpu_compat.py),
            # here with torch.cuda answering as the GPU: the GPU code path on real data.
            # A torch function mode does not reach autograd's backward: the twin's entry
            # points that allocate there run under the mode themselves.
            from dapo_megatron.megatron import cpu_compat

            cpu_compat._patch_megatron_rng_tracker()
            for module_name, attribute in cpu_compat._CPU_DEVICE_ENTRY_POINTS:
                cpu_compat._run_under_cpu_devices(module_name, attribute)
            for module_name, class_name in cpu_compat._CPU_DEVICE_CLASSES:
                cpu_compat._run_class_under_cpu_devices(module_name, class_name)
            from dapo_megatron.megatron import packed_batches, policy_step

            cuda = {"compute_device": lambda: torch.device("cuda", 0)}  # rewritten to host
            stack.enter_context(patched(packed_batches, cuda))
            stack.enter_context(patched(policy_step, cuda))
            stack.enter_context(cpu_compat._CudaDevicesOnCpu())
            yield None
            return
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        stack.enter_context(
            patched(torch.nn.Module, {"_apply": _fake_safe_apply(torch.nn.Module._apply)})
        )
        stack.enter_context(_FakeCuda(fake))
        yield fake
