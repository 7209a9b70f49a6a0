"""Run Megatron-Core's TP/SP/PP paths on a CUDA-less machine (gloo backend).

Megatron-Core is written for GPUs: it allocates on ``torch.cuda.current_device()`` or on
``device="cuda"``, keeps its model-parallel RNG states in the CUDA generator and
synchronises CUDA before point-to-point sends. None of that has a meaning on a CPU-only
torch build, where every ``torch.cuda`` call raises "Torch not compiled with CUDA enabled".

``apply_cpu_compat()`` installs the few patches below, each documented with the Megatron
code path that breaks without it. It does nothing when CUDA is available (the GPU path
runs unpatched Megatron) and is idempotent. It is the only place in the package that
patches torch or Megatron for the CPU; the one patch that applies on every device, a
vectorised THD RoPE that computes the same numbers faster, is ``rope_thd.py``. Devices are rewritten only inside the Megatron functions that
need it (``_CPU_DEVICE_ENTRY_POINTS``), not globally, so that the rest of the process
keeps torch's normal semantics and pays no overhead. Those functions are replaced in
their modules: reach them through Megatron's own lookups (``get_forward_backward_func``),
or import them by name only after ``apply_cpu_compat()`` (``initialize_parallel`` calls it).

Covered: model build, forward/backward (local spec, TP, SP, PP schedules, the rotary
slicing of context parallelism, whose attention is ``context_parallel.py``; packed THD
sequences need no patch here: with ``packed_seq`` the rotary embedding skips the CP
slicing, and the unfused THD RoPE (``apply_rope_fusion`` is off) is plain torch, replaced
by ``rope_thd.py`` for speed only), the RNG tracker, Megatron's DDP (grad buffers, grad sync) and optimizers (fp32 and mixed precision,
the distributed optimizer, grad clipping), whose classes run every method under the mode
(``_CPU_DEVICE_CLASSES``), and the mixture-of-experts layer (router, SequentialMLP experts,
the allgather and alltoall token dispatchers over gloo: ``_patch_moe``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from dapo_megatron.device import collectives

_applied = False


def apply_cpu_compat() -> bool:
    """Patch torch.cuda and Megatron-Core for CPU execution; returns True if patches are active.

    Safe to call many times and from every entry point that touches Megatron (parallel
    initialisation and model build call it). A no-op (returns False) when CUDA is available.
    """
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    _patch_current_device()
    _patch_synchronize()
    _patch_cuda_rng()
    _patch_megatron_rng_tracker()
    for module_name, attribute in _CPU_DEVICE_ENTRY_POINTS:
        _run_under_cpu_devices(module_name, attribute)
    for module_name, class_name in _CPU_DEVICE_CLASSES:
        _run_class_under_cpu_devices(module_name, class_name)
    _patch_moe()
    _applied = True
    return True


def _patch_current_device() -> None:
    """``torch.cuda.current_device()`` returns the CPU device.

    Megatron allocates with ``device=torch.cuda.current_device()`` in the rotary embedding
    (``RotaryEmbedding.__init__``/``get_emb`` moves ``inv_freq`` there on the first
    forward), in attention and GPTModel buffers, and in the pipeline point-to-point shape
    exchange (``p2p_communication._communicate_shapes``/``_communicate``). Returning a
    ``torch.device("cpu")`` (rather than an index, which torch reads as ``cuda:<index>``)
    makes all of those plain CPU allocations.
    """
    # A device where torch's returns an index, on purpose (above).
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]


def _patch_synchronize() -> None:
    """``torch.cuda.synchronize()`` is a no-op.

    ``p2p_communication._communicate`` synchronises CUDA after batched isend/irecv so that
    a race in NCCL cannot corrupt the received tensors; gloo's CPU ops have completed when
    ``wait()`` returns, so there is nothing to wait for.
    """
    torch.cuda.synchronize = lambda device=None: None


def _patch_cuda_rng() -> None:
    """Map the CUDA RNG functions onto the CPU default generator.

    ``tensor_parallel.model_parallel_cuda_manual_seed`` (needed even at world size 1: the
    model's weight init and attention dropout fork the tracker's 'model-parallel-rng'
    state) calls ``torch.cuda.manual_seed`` and ``torch.cuda.get_rng_state``. On a CPU
    build the first is silently queued forever and the second raises. Mapping them to the
    generator that CPU ops actually draw from keeps the tracker's semantics: inside
    ``fork()`` random ops see the per-TP-rank seed, outside they see the data-parallel one.
    ``torch.cuda.manual_seed_all`` is deliberately left alone: ``torch.manual_seed`` calls
    it, so routing it to ``torch.manual_seed`` would recurse forever.
    """
    generator = torch.default_generator

    def manual_seed(seed: int) -> None:
        generator.manual_seed(int(seed))

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return generator.get_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        generator.set_state(new_state)

    torch.cuda.manual_seed = manual_seed
    torch.cuda.get_rng_state = get_rng_state
    torch.cuda.random.get_rng_state = get_rng_state
    torch.cuda.set_rng_state = set_rng_state
    torch.cuda.random.set_rng_state = set_rng_state


def _patch_megatron_rng_tracker() -> None:
    """Megatron's private CUDA RNG helpers use the CPU default generator.

    ``CudaRNGStatesTracker.add/fork`` save and restore states through
    ``tensor_parallel.random._get_cuda_rng_state/_set_cuda_rng_state``. The setter goes
    through ``torch.cuda._lazy_call``, which on a CPU build only queues the callback: the
    fork would silently keep drawing from the wrong state. The tracker looks these names
    up in its module at call time, so replacing the module attributes is enough.
    """
    from megatron.core.tensor_parallel import random as mpu_random

    generator = torch.default_generator

    def get_state(
        device: Any = "cuda", clone: bool = False, graph_safe: bool = False
    ) -> torch.Tensor:
        return generator.get_state()

    def set_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
        generator.set_state(new_state)

    mpu_random._get_cuda_rng_state = get_state
    mpu_random._set_cuda_rng_state = set_state


def _patch_moe() -> None:
    """Megatron-Core's MoE layer without Transformer Engine and without CUDA streams.

    * ``moe_utils.RouterGatingLinearFunction`` (the router's logits, ``router_gating_linear``)
      tests ``te_general_gemm is not None`` to choose TE's GEMM over ``torch.mm``; the name
      is only bound when TE imports, so without TE the test raises NameError instead of
      taking the torch branch it was written for. Binding it to None selects that branch.
    * ``MoEAlltoAllTokenDispatcher.__init__`` creates a side ``torch.cuda.Stream()`` for its
      device-to-host copies of the split sizes, and ``_maybe_dtoh_and_synchronize`` orders
      them with ``torch.cuda.current_stream()`` / ``torch.cuda.stream()`` and an event. On
      the CPU the split sizes are host tensors already (``maybe_move_tensor_to_cpu`` leaves
      them alone) and gloo's collectives are synchronous, so both run with host stand-ins
      for the stream calls (``_host_streams``): the same code with nothing to order.
    * ``moe_utils.maybe_move_tensor_to_cpu`` returns the split sizes of the alltoall
      dispatcher as NumPy arrays (``as_numpy=True``), which ``all_to_all_single`` takes as
      its split lists, but only for a CUDA tensor: a host tensor comes back as a tensor,
      which the collective refuses. The replacement converts host tensors too; the token
      dispatcher imported the function by name, so its copy is the one replaced.
    """
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    upstream = moe_utils.maybe_move_tensor_to_cpu

    @functools.wraps(upstream)
    def move_to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return upstream(tensor, as_numpy=as_numpy, record_stream=record_stream)

    token_dispatcher.maybe_move_tensor_to_cpu = move_to_host
    _patch_uneven_sequence_parallel_collectives()


def _patch_uneven_sequence_parallel_collectives() -> None:
    """Uneven all-gather and reduce-scatter along dim 0 over gloo.

    Under TP (with SP) the alltoall dispatcher gathers the tokens routed to this EP rank's
    experts over the TP group and reduce-scatters their outputs back, with a different
    count per TP rank (``tensor_parallel.mappings._gather_along_first_dim`` with
    ``output_split_sizes``, ``_reduce_scatter_along_first_dim`` with ``input_split_sizes``):
    a list all-gather / reduce-scatter of unequal tensors, which NCCL runs and gloo
    refuses. Those two branches become an equal-size all-gather of rows padded to the
    largest count, and an all-reduce of the whole input from which this rank keeps its
    rows: the same results for more traffic. Equal splits keep Megatron's code.
    """
    from megatron.core.tensor_parallel import mappings

    gather, reduce_scatter = (
        mappings._gather_along_first_dim,
        mappings._reduce_scatter_along_first_dim,
    )

    @functools.wraps(gather)
    def gather_uneven(
        input_: torch.Tensor,
        group: Any,
        output_split_sizes: list[int] | None = None,
        use_global_buffer: bool = False,
    ) -> torch.Tensor:
        if output_split_sizes is None or group.size() == 1:
            gathered: torch.Tensor = gather(input_, group, output_split_sizes, use_global_buffer)
            return gathered
        longest = max(output_split_sizes)
        padded = input_.new_zeros((longest, *input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        rows = [torch.empty_like(padded) for _ in output_split_sizes]
        collectives.all_gather(rows, padded, group=group)
        return torch.cat([r[:n] for r, n in zip(rows, output_split_sizes, strict=True)])

    @functools.wraps(reduce_scatter)
    def reduce_scatter_uneven(
        input_: torch.Tensor,
        group: Any,
        input_split_sizes: list[int] | None = None,
        use_global_buffer: bool = False,
    ) -> torch.Tensor:
        if input_split_sizes is None or group.size() == 1:
            reduced: torch.Tensor = reduce_scatter(
                input_, group, input_split_sizes, use_global_buffer
            )
            return reduced
        total = input_.contiguous().clone()
        collectives.all_reduce(total, group=group)
        start = sum(input_split_sizes[: group.rank()])
        return total[start : start + input_split_sizes[group.rank()]].clone()

    mappings._gather_along_first_dim = gather_uneven
    mappings._reduce_scatter_along_first_dim = reduce_scatter_uneven
    for method in ("__init__", "_maybe_dtoh_and_synchronize"):
        _run_with_host_streams(
            "megatron.core.transformer.moe.token_dispatcher",
            f"MoEAlltoAllTokenDispatcher.{method}",
        )


class _HostEvent:
    """A completed event: host work is done when the call that recorded it returns."""

    def synchronize(self) -> None:
        return None


class _HostStream:
    """A CUDA stream's interface with nothing to order (host work runs in program order)."""

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _HostEvent:
        return _HostEvent()


_HOST_CURRENT_STREAM = _HostStream()


@contextlib.contextmanager
def _host_streams() -> Iterator[None]:
    """``torch.cuda.Stream``, ``current_stream`` and ``stream`` as host stand-ins while the
    block runs (a CPU build raises on each); restored afterwards, so nothing else sees them."""
    saved = torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream
    torch.cuda.Stream = _HostStream  # type: ignore[misc,assignment]
    torch.cuda.current_stream = lambda device=None: _HOST_CURRENT_STREAM  # type: ignore[assignment,return-value]
    torch.cuda.stream = lambda stream: contextlib.nullcontext()  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream = saved  # type: ignore[misc]


def _run_with_host_streams(module_name: str, attribute: str) -> None:
    """Replace module.Class.method by a wrapper that runs it under ``_host_streams``."""
    cls_name, name = attribute.split(".")
    owner = getattr(importlib.import_module(module_name), cls_name)
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _host_streams():
            return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # A bare index means cuda:<index> to torch; bool is an int but never a device.
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaDevicesOnCpu(TorchFunctionMode):
    """Rewrites CUDA device arguments to CPU and drops pinning, for the torch calls under it.

    Covers ``device=`` keywords (``torch.zeros(..., device="cuda")``), ``Tensor.to("cuda")``,
    ``Tensor.cuda()`` and ``pin_memory=True`` (pinning needs a CUDA driver). ``Tensor.type()``
    reports the CUDA type name ("torch.cuda.FloatTensor"): the optimizers accept only
    parameters whose type string says CUDA, and the tensors really are the CPU equivalents.
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        # Every torch call of a model forward under a schedule comes through here: the
        # common case (no device, no pinning, not one of the three methods) returns first.
        if func in _REWRITTEN_METHODS:
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name.replace("torch.", "torch.cuda.", 1) if ".cuda." not in name else name
            if func is torch.Tensor.to:
                args = tuple(
                    torch.device("cpu")
                    if isinstance(a, (str, torch.device)) and _is_cuda_device(a)
                    else a
                    for a in args
                )
        if not kwargs:
            return func(*args)
        if _is_cuda_device(kwargs.get("device")) or kwargs.get("pin_memory"):
            kwargs = dict(kwargs)
            if _is_cuda_device(kwargs.get("device")):
                kwargs["device"] = torch.device("cpu")
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
        return func(*args, **kwargs)


_REWRITTEN_METHODS = frozenset({torch.Tensor.cuda, torch.Tensor.type, torch.Tensor.to})


# (module, attribute) of the Megatron functions that allocate on "cuda" by name; each runs
# under _CudaDevicesOnCpu. Why each one is needed:
_CPU_DEVICE_ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    # The causal mask of the local (non-TE) core attention is built with
    # torch.ones(sq, sq, device="cuda") on every forward (FusedScaleMaskSoftmax).
    ("megatron.core.fusions.fused_softmax", "get_default_causal_mask"),
    # Tied embeddings with PP > 1: the last stage's output weight copy is moved with
    # weight.data.cuda() before the all-reduce that syncs it with the first stage.
    (
        "megatron.core.models.common.language_module.language_module",
        "LanguageModule.setup_embeddings_and_output_layer",
    ),
    # The pipeline schedules count tokens in torch.zeros([], device="cuda").
    ("megatron.core.pipeline_parallel.schedules", "forward_backward_no_pipelining"),
    (
        "megatron.core.pipeline_parallel.schedules",
        "forward_backward_pipelining_without_interleaving",
    ),
    ("megatron.core.pipeline_parallel.schedules", "forward_backward_pipelining_with_interleaving"),
    # Context parallelism: RotaryEmbedding.forward slices the rotary angles for this CP
    # rank with get_pos_emb_on_this_cp_rank, which builds its chunk index with
    # torch.tensor(..., pin_memory=True).cuda(). rotary_pos_embedding imported the
    # function by name, so its copy is patched as well as the one in rope_utils.
    ("megatron.core.models.common.embeddings.rope_utils", "get_pos_emb_on_this_cp_rank"),
    (
        "megatron.core.models.common.embeddings.rotary_pos_embedding",
        "get_pos_emb_on_this_cp_rank",
    ),
)


# (module, class) whose every method runs under _CudaDevicesOnCpu: their constructors and
# steps allocate scalars and buffers on "cuda" throughout (loss scale, found-inf flags,
# grad-norm buffers, the contiguous grad buffers of DDP) and check parameter type strings.
_CPU_DEVICE_CLASSES: tuple[tuple[str, str], ...] = (
    ("megatron.core.distributed.distributed_data_parallel", "DistributedDataParallel"),
    ("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBuffer"),
    ("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBucketGroup"),
    ("megatron.core.optimizer.optimizer", "MegatronOptimizer"),
    ("megatron.core.optimizer.optimizer", "MixedPrecisionOptimizer"),
    ("megatron.core.optimizer.optimizer", "Float16OptimizerWithFloat16Params"),
    ("megatron.core.optimizer.optimizer", "FP32Optimizer"),
    ("megatron.core.optimizer.optimizer", "ChainedOptimizer"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer"),
)


def _run_class_under_cpu_devices(module_name: str, class_name: str) -> None:
    """Wrap every function defined on the class itself (not inherited ones: their owner is
    wrapped separately, and wrapping twice would only nest the mode)."""
    cls = getattr(importlib.import_module(module_name), class_name)
    for name, value in list(vars(cls).items()):
        if (
            callable(value)
            and not isinstance(value, type)
            and not name.startswith("__")
            or name == "__init__"
        ):
            _run_under_cpu_devices(module_name, f"{class_name}.{name}")


def _run_under_cpu_devices(module_name: str, attribute: str) -> None:
    """Replace module.attribute (a function or Class.method) by a wrapper under the mode."""
    owner: Any = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    # A static/class method must stay one: wrapped as a plain function it would be bound
    # to the instance and receive it as an extra first argument (e.g. the optimizers'
    # static _extract_common_per_param_step, called as self._extract...(state_dict)).
    raw = vars(owner).get(name) if isinstance(owner, type) else None
    descriptor = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    original = (
        raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else getattr(owner, name)
    )

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _CudaDevicesOnCpu():
            return original(*args, **kwargs)

    setattr(owner, name, descriptor(wrapper) if descriptor else wrapper)
