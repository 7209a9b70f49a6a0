"""Code that vLLM loads by qualified name inside its engine: logprobs and weight refit.

Both classes are handed to vLLM as qualified-name strings, so its engine-core and worker
processes (if any) import them from here. This module imports vllm at import time; only
``vllm_backend`` imports it, lazily, after checking that vllm is installed.

``FullVocabLogprobs`` (logits processor). ``GenerationBackend`` promises
``Sample.logprobs[i] = log_softmax(logits / T)[token]`` over the full vocabulary, BEFORE
top-k/top-p truncation. None of vLLM's ``logprobs_mode`` values gives that by itself:

* ``raw_logprobs`` (vLLM's default) ignores the temperature (correct only at T = 1);
* ``processed_logprobs`` is computed after top-k/top-p, i.e. renormalised over the kept
  tokens (correct only without truncation; top_k=1 even gives 0.0 for every token).

``processed_logits`` returns, for the sampled token, the value of the logits the sampler
drew from: after temperature scaling and after top-k/top-p masking (masking sets dropped
entries to -inf but never changes a kept one, and the sampled token is always kept).
vLLM applies argmax-invariant processors between those two steps; this one subtracts the
row's logsumexp there, turning the scaled logits into ``log_softmax(logits / T)`` over the
whole vocabulary. A per-row constant shift changes neither top-k, nor top-p (it works on
softmax probabilities), nor the draw (softmax / Gumbel-max), so sampling is untouched and
the value vLLM reports for the sampled token is exactly the contract's logprob. vLLM runs
the processor on its random-sampling path only: the backend never sends a temperature
below vLLM's greedy threshold (1e-5) and expresses greedy as top_k=1.

All of this is vLLM's V1 model runner (vllm/v1/sample/sampler.py; on CUDA its top-k/top-p
step falls back from FlashInfer to the native path whenever a processed logprobs mode is
on, so the reported value is the same). The backend pins V1 on every platform
(``vllm_backend.configure_runner_environment``): Model Runner V2, vLLM 0.32's default on
CUDA, accepts only subclasses of its own ``LogitsProcessor`` and applies them before the
temperature (vllm/v1/worker/gpu/sample/sampler.py), where subtracting the logsumexp would
give ``log_softmax(logits) / T``; and its ``processed_logprobs`` too are taken after
top-k/top-p.

``WeightRefitExtension`` (worker extension), two refit paths:

* the collective refit (the default): each engine worker (every TP rank) joins a
  weight-update group (``refit.group``: NCCL on GPU, gloo on CPU) and receives the
  policy's buckets straight into vLLM's in-place ``reload_weights`` through a streaming
  iterator (``refit.receiver.EngineReceiver``, the same as the Megatron engine's);
  nothing crosses ``collective_rpc`` but the group address and the bucket layout (plain
  lists);
* the object-store fallback (``generation.refit_transport=object_store``): when the engine runs in other processes,
``collective_rpc`` arguments cross process boundaries through vLLM's msgpack encoding, and
in vLLM 0.32 tensors do not survive it into the worker processes (they arrive as raw
memoryviews, which its worker broadcast then fails to pickle). Plain bytes do, so
``serialise_weights`` turns each tensor into (name, dtype, shape, bytes) and the extension
rebuilds the tensors in each worker and streams them into vLLM's ``reload_weights``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from dapo_megatron.refit.receiver import EngineReceiver

RELOAD_ITERATOR = "dapo_reload_weights"
"""``collective_rpc`` method: in-process object-store refit from an iterator (kwarg
``weights_iterator``)."""
RELOAD_SERIALISED = "dapo_reload_serialised_weights"
"""``collective_rpc`` method of ``WeightRefitExtension``: the object-store fallback refit."""
JOIN_WEIGHT_GROUP = "dapo_join_weight_group"
"""``collective_rpc`` method: every engine worker joins the weight-update group."""
ATTACH_SHARED = "dapo_attach_shared"
"""``collective_rpc`` method: map the exporters' shared bucket buffers (handle transport)."""
RECEIVE_WEIGHTS = "dapo_receive_weights"
"""``collective_rpc`` method: receive one refit's buckets into the model in place."""
LEAVE_WEIGHT_GROUP = "dapo_leave_weight_group"
"""``collective_rpc`` method: drop the weight-update group."""

SerialisedTensor = tuple[str, str, list[int], bytes]
"""(HF name, torch dtype name without "torch.", shape, raw little-endian bytes)."""


# vllm is an optional extra; where it is absent (CI's mypy) LogitsProcessor is Any.
class FullVocabLogprobs(LogitsProcessor):  # type: ignore[misc,unused-ignore]
    """Replace each row of temperature-scaled logits by its log-softmax (module doc).

    Stateless: it applies to every row of every batch, which is harmless for any request,
    since a per-row shift changes no sampling outcome.
    """

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        """vLLM's constructor signature; the processor needs none of it."""

    def is_argmax_invariant(self) -> bool:
        """True: vLLM then applies it after the temperature and before top-k/top-p."""
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """No per-request state to track."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [B, V]`` (fp32, already divided by T) -> their log-softmax, in place.

        In place so that no second [B, V] tensor is allocated on every decode step.
        """
        return logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))


def serialise_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> list[SerialisedTensor]:
    """HF-named tensors as msgpack/pickle-safe tuples (one host copy of every tensor)."""
    out = []
    for name, tensor in weights:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes()  # via uint8: numpy has no bfloat16
        out.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), data))
    return out


def deserialise_weights(payload: Iterable[SerialisedTensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Inverse of ``serialise_weights``, one tensor at a time."""
    for name, dtype, shape, data in payload:
        # bytearray: torch.frombuffer wants a writable buffer (it warns on bytes).
        flat = torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype))
        yield name, flat.reshape(shape)


def _shared_parameters(model: torch.nn.Module) -> list[list[tuple[torch.nn.Module, str]]]:
    """Groups of (module, parameter name) that hold the very same Parameter object: tied
    weights, e.g. a tied ``lm_head`` and ``embed_tokens``; first in module order first."""
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((module, name))
    return [group for group in owners.values() if len(group) > 1]


def _reload_keeping_ties(worker: object, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """vLLM's in-place ``reload_weights``, then each tied parameter's other users refreshed.

    vLLM 0.32's layerwise reload (model_loader/reload/layerwise.py) loads and post-processes
    each layer that receives weights. A tied ``lm_head`` receives none (the checkpoint has no
    lm_head.weight; its Parameter is embed_tokens') and is never post-processed, so on CPU,
    where post-processing packs the weight into a oneDNN/sgl GEMM handle
    (layers/vocab_parallel_embedding.py -> layers/utils.py dispatch_cpu_unquantized_gemm),
    the head kept multiplying with the OLD packed weights: after a refit the logprobs of a
    tied tiny Qwen2 were off by up to 0.84 at TP1 and TP2, while every parameter compared
    equal. Re-pointing each tie at the loaded owner and re-running the other modules'
    ``process_weights_after_loading`` fixes it (a no-op for unquantized layers on GPU).
    """
    model = worker.model_runner.model  # type: ignore[attr-defined]
    ties = _shared_parameters(model)
    worker.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]
    for (owner, owner_name), *others in ties:
        loaded = owner._parameters[owner_name]
        for module, name in others:
            module._parameters[name] = loaded
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
    _repack_experts(model)


def _repack_experts(model: torch.nn.Module) -> None:
    """Re-run the expert kernel's weight preparation that a weight update skips (MoE).

    vLLM 0.32's unquantized MoE method (fused_moe/unquantized_fused_moe_method.py,
    ``_setup_kernel``) converts reloaded expert weights to the kernel's format on every
    load, but calls the experts class's own ``process_weights_after_loading`` only on the
    first (``is_weight_update``). For the base class that is a no-op; the CPU experts
    (fused_moe/experts/cpu_moe.py ``CPUUnquantizedExperts``) prepack there, so after a
    refit they multiplied with raw weights laid out as packed ones: logprobs of a tiny
    Qwen3-MoE were off by up to 7. Here the prepack is redone in place (the kernel keeps
    the same storage, which the next layerwise reload writes into again). On CUDA the
    backend pins the Triton experts (``vllm_backend.engine_arguments``), whose preparation
    is the base no-op; any other class that prepares weights is refused rather than
    served stale.
    """
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEExperts

    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is None:
            continue
        prepare = type(experts).process_weights_after_loading
        if prepare is FusedMoEExperts.process_weights_after_loading:
            continue  # nothing to redo: the conversion already ran on this update
        isa = getattr(experts, "isa", None)
        config = getattr(experts, "moe_config", None)
        padded = (
            isa is not None
            and config is not None
            and (
                experts._padded_intermediate_size(config) != config.intermediate_size_per_partition
            )
        )
        if isa is None or padded or getattr(experts, "_use_zentorch", False):
            raise NotImplementedError(
                f"vLLM's {type(experts).__name__} MoE kernel prepares its weights after "
                "loading and skips that on a weight update; a refit would serve stale "
                "experts. Supported: the Triton experts (CUDA) and the CPU experts"
            )
        from vllm import _custom_ops

        for name in ("w13_weight", "w2_weight"):
            weight = getattr(module, name)
            weight.data.copy_(_custom_ops.cpu_prepack_moe_weight(weight.data, isa))


class WeightRefitExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); see the module doc."""

    def dapo_reload_weights(self, weights_iterator: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Object-store refit of an in-process engine: stream ``weights_iterator`` in place."""
        _reload_keeping_ties(self, weights_iterator)

    def dapo_reload_serialised_weights(self, payload: list[SerialisedTensor]) -> None:
        """Reload the weights of ``serialise_weights`` in place (vLLM's reload_weights)."""
        _reload_keeping_ties(self, deserialise_weights(payload))

    def dapo_join_weight_group(
        self,
        host: str,
        port: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        rank_offset: int,
        transport: str,
    ) -> int:
        """Join the weight-update group as rank ``rank_offset + this worker's engine rank``.

        Returns the rank taken. The worker's engine rank is vLLM's global rank of the
        worker inside its engine (the TP rank for a TP-only engine).
        """
        from dapo_megatron.refit.group import GroupAddress

        rank = rank_offset + int(self.rank)  # type: ignore[attr-defined]
        address = GroupAddress(host, int(port), int(world_size), backend, float(timeout_s))  # type: ignore[arg-type]
        self._dapo_receiver().join(address, rank, transport)
        return rank

    def _dapo_receiver(self) -> EngineReceiver:
        """This worker's end of the refit, kept for the worker's life (its refit count
        drives the fault hook of the restart tests)."""
        from dapo_megatron.refit.receiver import EngineReceiver

        receiver = getattr(self, "_dapo_refit_receiver", None)
        if receiver is None:
            receiver = EngineReceiver(self.device)  # type: ignore[attr-defined]
            self._dapo_refit_receiver: EngineReceiver = receiver
        return receiver

    def dapo_attach_shared(self, handles: list[bytes]) -> None:
        """Map this worker's exporter buffer (ipc transport): ``handles[engine rank]``."""
        self._dapo_receiver().attach(handles[int(self.rank)])  # type: ignore[attr-defined]

    def dapo_receive_weights(self, layout_wire: list[Any]) -> dict[str, float]:
        """Receive every bucket of the layout through the joined transport and load it in
        place; returns transfer stats."""
        from dapo_megatron.refit.buckets import BucketLayout
        from dapo_megatron.refit.stats import TransferStats

        receiver = self._dapo_receiver()
        stats = TransferStats()
        layout = BucketLayout.from_wire(layout_wire)
        _reload_keeping_ties(self, receiver.receive(layout, stats))
        receiver.check_complete(layout, stats)
        return stats.as_report()

    def dapo_leave_weight_group(self) -> None:
        self._dapo_receiver().close()
