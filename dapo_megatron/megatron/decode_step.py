"""One decode token's forward on fixed buffers, replayed from a CUDA graph on a GPU: the
step of megatron/inference.py's decode loop that runs the model.

Why: eager Megatron-Core decoding launches a few thousand small kernels per token (about
3,800 torch ops for a 28-layer model), so on a GPU the host's launch time, ~25 ms a token,
and not the device's work, sets the pace. Megatron-Core 0.16.1 offers CUDA graphs for
static-batching inference only together with flash decoding
(``megatron/core/transformer/attention.py``, ``Attention.forward``: "CUDA graphs must use
flash decode with static batching!"), and flash decoding needs the flash-attn package
(``Attention.flash_decode`` calls ``flash_attn_with_kvcache``), which the local layer spec
on a machine without Transformer Engine does not have. So the engine captures the step
itself with ``torch.cuda.CUDAGraph``: a graph replays fixed kernels on fixed addresses, so
the step must not change shape or any Python value from one token to the next. It does
not: the token fed and the position are device tensors written in place between steps;
the new key/value land in the cache at that position (decode_mode._static_decode_step)
and the attention spans the whole cache with a key mask that hides the columns not yet
written. The CPU runs the very same step eagerly (no graph): tests check that two
consecutive steps run the same ops with the same arguments (what a graph replays) and that
the step reads nothing back to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from megatron.core.inference.contexts import StaticInferenceContext

from dapo_megatron.megatron.decode_mode import set_static_column

# (tokens [B, 1], positions [B, 1], key mask [B, 1, 1, K]) -> last-position logits [B, V].
ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DecodeOptions:
    """How the Megatron engine runs its decode loop (megatron/inference.py)."""

    check_every: int = 16
    """Tokens between two looks of the host at the rows' state (all done, enough prompts
    finished, rows to drop from the cache). Each look reads a device value back (one host
    sync); the tokens between run without any. A row that ends meanwhile keeps being
    decoded, its tokens past its end discarded: at most check_every - 1 wasted steps. A
    batch whose longest budget is under 8 x check_every looks every budget // 8 tokens."""
    static_cache: bool = True
    """Decode steps attend over the whole KV cache with a key mask (fixed shapes, so one
    CUDA graph fits every step) instead of the cache filled so far. Needs a core attention
    that applies an explicit mask; without one the growing step is used."""
    cuda_graphs: bool = True
    """Replay the static decode step from a CUDA graph (on a CUDA device, TP 1, a dense
    model, no routing replay; eager otherwise)."""
    compact_fraction: float | None = None
    """Drop the finished rows from the KV cache once this fraction of its rows is finished;
    None: 1/8 eager, 1/2 graphed (each compaction means a new capture there)."""

    def __post_init__(self) -> None:
        if self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}")
        if self.compact_fraction is not None and not 0 < self.compact_fraction <= 1:
            raise ValueError(f"compact_fraction must be in (0, 1], got {self.compact_fraction}")


class StaticDecodeStep:
    """The forward of one decode token on fixed buffers (module docstring).

    Call it with the sampled tokens [B] of the rows: they are fed at the current cache
    column, the column is unmasked, the forward runs (graph replay, or eagerly), the
    column advances. The returned logits are the step's own buffer when graphed: read them
    before the next call.
    """

    def __init__(
        self,
        forward: ForwardFn,
        context: StaticInferenceContext,
        column: int,
        key_mask_BK: torch.Tensor,
        *,
        graph_pool: Any = None,
    ) -> None:
        """Args:
        forward: the model's decode forward (engine's ``_forward`` without its offset).
        context: the batch's inference context, its cache filled up to ``column``.
        column: the cache position of the first token fed.
        key_mask_BK: [B, K] bool, True = hidden: padding, and every column >= ``column``.
            Updated in place (a view of it is the forward's mask).
        graph_pool: a ``torch.cuda.graph_pool_handle()`` to capture into; None: eager.
        """
        device = key_mask_BK.device
        batch = key_mask_BK.shape[0]
        self._forward = forward
        self._context = context
        self.column = torch.tensor([column], dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.positions = self.column.view(1, 1).expand(batch, 1)
        self.key_mask = key_mask_BK
        self._mask = key_mask_BK[:, None, None, :]
        self._pool = graph_pool
        self._graph: torch.cuda.CUDAGraph | None = None
        self._logits: torch.Tensor | None = None
        set_static_column(context, self.column)

    def __call__(self, tokens_B: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens_B`` at the current column; their next-token logits [B, V]."""
        self.tokens.copy_(tokens_B[:, None])
        self.key_mask.index_fill_(1, self.column, False)
        if self._pool is None:
            logits = self._run()
        else:
            if self._graph is None:
                self._capture()
            assert self._graph is not None and self._logits is not None
            self._graph.replay()
            logits = self._logits
        self.column += 1
        self._context.increment_sequence_len_offset(1)  # compaction copies what is filled
        return logits

    def _run(self) -> torch.Tensor:
        return self._forward(self.tokens, self.positions, self._mask)

    def _capture(self) -> None:
        """Capture the step once. The forward is idempotent for fixed inputs (it writes the
        same key/value at the same column), so the eager warm-up, which lets lazy
        initialisation (cuBLAS workspaces, caches) happen outside the capture, changes
        nothing that the replay does not write again."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._logits = self._run()
        self._graph = graph

    def close(self) -> None:
        """Back to the growing step; the graph's memory returns to its pool."""
        set_static_column(self._context, None)
        self._graph = None
        self._logits = None
