"""The backend-neutral rollout generation interface (no Megatron or vLLM import here).

The controller and the workers talk to every engine through ``GenerationBackend``:
token ids in, token ids with their logprobs and finish reasons out, HF-named weights in
for the refit. Backends: ``megatron.inference.MegatronGenerationBackend`` (Megatron-Core
inference with a KV cache; the CPU default) and a vLLM one (GPU default). The sample and
sampling types are in ``shared/sampling.py``.

Conventions every backend follows:

* prompts and responses are token ids; the response never contains the prompt;
* ``max_tokens`` is the RESPONSE cap (Lmax of the overlong shaping), never prompt + response;
* a response that ends on a stop token contains that token as its last token
  (finish_reason "stop"); one that reached the cap has exactly ``max_tokens`` tokens
  (finish_reason "length");
* ``Sample.logprobs[i]`` is ``log softmax(logits / temperature)[token i]`` over the full
  vocabulary, i.e. the distribution the training step scores with, BEFORE top-k/top-p
  truncation (so it equals the policy's logprob at the same temperature whatever the
  truncation settings).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

# The types an engine returns live on the ground floor (shared/), where the Megatron
# engine (megatron/inference.py) imports them without importing this package.
from dapo_megatron.shared.sampling import Sample, SamplingParams

if TYPE_CHECKING:
    import torch

    from dapo_megatron.config.refit_transport import RefitTransport
    from dapo_megatron.refit.buckets import BucketLayout
    from dapo_megatron.refit.group import GroupAddress


@runtime_checkable
class GenerationBackend(Protocol):
    """A rollout engine. Methods are collective over the ranks of one engine (e.g. its TP
    group): all call them together with the same arguments."""

    def generate(
        self, prompts_token_ids: list[list[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        """Sample ``sampling.n`` responses per prompt.

        Returns ``out[i][j]``: sample j of prompt i (``len(out) == len(prompts_token_ids)``,
        ``len(out[i]) == sampling.n``).
        """
        ...

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights by full HF-named tensors (``export_hf_weights``)."""
        ...

    # The collective refit (dapo_megatron/refit/): an engine that is not the policy joins
    # the weight-update group and receives the policy's buckets in place.

    @property
    def num_weight_ranks(self) -> int:
        """Members this engine adds to a weight-update group (one per engine process)."""
        ...

    def join_weight_group(
        self, address: GroupAddress, rank_offset: int, transport: RefitTransport
    ) -> list[int]:
        """Every engine process joins ``address`` from rank ``rank_offset`` on (a
        rendezvous: all members join concurrently) for the run's ``transport``, which
        every later ``receive_weights`` uses; returns the ranks taken."""
        ...

    def attach_shared(self, handles: list[bytes]) -> None:
        """ipc transport: engine process i maps ``handles[i]`` (its policy rank's buffer)."""
        ...

    def receive_weights(self, layout: BucketLayout) -> list[dict[str, float]]:
        """Receive one refit's buckets in place through the joined transport;
        ``TransferStats.as_report()`` of each engine process."""
        ...

    def sleep(self) -> None:
        """Release what the engine can give back between rollouts (KV cache, weights)."""
        ...

    def wake(self) -> None:
        """Undo ``sleep`` before the next ``update_weights`` / ``generate``."""
        ...

    def shutdown(self) -> None:
        """Release everything; the backend cannot be used afterwards."""
        ...
