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

``WeightRefitExtension`` (worker extension). When the engine runs in other processes,
``collective_rpc`` arguments cross process boundaries through vLLM's msgpack encoding, and
in vLLM 0.32 tensors do not survive it into the worker processes (they arrive as raw
memoryviews, which its worker broadcast then fails to pickle). Plain bytes do, so
``serialise_weights`` turns each tensor into (name, dtype, shape, bytes) and the extension
rebuilds the tensors in each worker and streams them into vLLM's ``reload_weights``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

if TYPE_CHECKING:
    from vllm.config import VllmConfig

LOGITS_PROCESSOR = "dapo_megatron.generation.vllm_worker:FullVocabLogprobs"
"""The logits processor's qualified name for vLLM's ``logits_processors``."""
WORKER_EXTENSION = "dapo_megatron.generation.vllm_worker.WeightRefitExtension"
"""The worker extension's qualified name for vLLM's ``worker_extension_cls`` (dotted: vLLM
resolves it differently from logits processors)."""
RELOAD_SERIALISED = "dapo_reload_serialised_weights"
"""The ``collective_rpc`` method name of ``WeightRefitExtension``."""

SerialisedTensor = tuple[str, str, list[int], bytes]
"""(HF name, torch dtype name without "torch.", shape, raw little-endian bytes)."""


class FullVocabLogprobs(LogitsProcessor):
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


class WeightRefitExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); see the module doc."""

    def dapo_reload_serialised_weights(self, payload: list[SerialisedTensor]) -> None:
        """Reload the weights of ``serialise_weights`` in place (vLLM's reload_weights)."""
        self.reload_weights(weights_iterator=deserialise_weights(payload))  # type: ignore[attr-defined]
