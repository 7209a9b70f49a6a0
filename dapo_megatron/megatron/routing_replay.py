"""Rollout routing replay (R3): the trainer routes each token to the experts the engine chose.

A MoE router's top-k is a discontinuous function of its logits: the rollout engine (KV-cache
decoding, other batch shapes, other kernels) and the trainer's full forward can pick
different experts for the same token when two logits are close, and then the two policies
differ by more than rounding (the train/rollout logprob mismatch). With
``policy.moe.routing_replay`` the model is built with Megatron's ``moe_enable_routing_replay``
(one ``RouterReplay`` per router, megatron/core/transformer/moe/router_replay.py) and:

* the Megatron engine runs ``generate`` with every router in RECORD and keeps, per sample,
  the top-k experts of every token it fed to the model (``RoutingLog``): the prompt and
  every response token but the last, which no forward reads. ``Sample.routed_experts``
  ``[prompt + response - 1, layers, k]``, uint8 (int16 beyond 256 experts);
* ``PolicyBatch.routed_experts`` carries them token-aligned ``[B, S, layers, k]``; a token
  no engine forward read (a row's last token, padding) holds zeros, which route it to
  expert 0 only: its output reaches no loss (causal attention; packed segments are
  separate), and no token is ever dropped (no expert capacity);
* each micro-batch's routing is put in the ROUTER's token order (``padded_router_order``,
  ``packed_router_order``): the router flattens the local hidden states ``[s, b]``
  s-major, after the context-parallel split of the sequence (done before the model here)
  and the sequence-parallel scatter over TP (contiguous chunks of ``s``);
* the policy's passes (old logprobs, the KL reference's, train) run with the routers in
  REPLAY_FORWARD (``replaying``) and set each micro-batch's targets before its forward;
  a batch without routing (SFT, the startup checks) routes as usual. A full-recompute backward re-runs the router
  with the same targets, which is right as long as every backward follows its own
  forward, i.e. without pipeline parallelism (validation refuses PP > 1 with full
  recompute; Megatron's REPLAY_BACKWARD queue would need the schedule to switch actions).

Megatron's class keeps a process-wide list of instances; this module never uses it (an
engine copy, the KL reference and the policy in one process have routers of their own):
it finds each model's routers by walking the model (``layer_routers``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import torch
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from megatron.core.transformer.transformer_config import TransformerConfig

from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.data.packing import PackLayout
from dapo_megatron.megatron.context_parallel import split_for_context_parallel


def routed_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer dtype that holds every expert index."""
    return torch.uint8 if num_experts <= 256 else torch.int16


def layer_routers(model: torch.nn.Module) -> dict[int, RouterReplay]:
    """This model's replay instances by 0-based global layer (every Qwen3-MoE layer is
    sparse, so layer l's router is row l of a routing tensor); empty without replay."""
    out = {}
    for module in model.modules():
        if isinstance(module, TopKRouter) and module.router_replay is not None:
            assert module.layer_number is not None, "routers are numbered by their layer"
            out[module.layer_number - 1] = module.router_replay
    return out


def _set_action(routers: Sequence[RouterReplay], action: RouterReplayAction | None) -> None:
    for replay in routers:
        replay.clear_indices()
        if action is None:
            replay.clear_router_replay_action()
        else:
            replay.set_router_replay_action(action)


# ---------------------------------------------------------------------------------------
# Engine: record


class RoutingLog:
    """The routing of one decoded batch: ``[B, P + steps, layers, k]`` in the engine's
    left-padded coordinates (row b's prompt ends at column P - 1, its response token i is
    fed at column P + i)."""

    def __init__(self, routers: dict[int, RouterReplay], log: torch.Tensor, prompt_len: int):
        self._routers = [routers[layer] for layer in sorted(routers)]
        self._log = log
        self._prompt_len = prompt_len

    def prefill(self) -> None:
        """Record the prompt forward: the router saw ``[P, B]`` flattened s-major."""
        batch, p = self._log.shape[0], self._prompt_len
        routed = self._recorded().view(p, batch, *self._log.shape[2:])
        self._log[:, :p] = routed.transpose(0, 1)

    def step(self, rows: torch.Tensor, column: int) -> None:
        """Record one decode forward of the cache rows ``rows`` (batch rows) at ``column``."""
        self._log[rows, column] = self._recorded()

    def sample(self, row: int, prompt_len: int, response_len: int) -> torch.Tensor:
        """Row ``row``'s ``[prompt_len + response_len - 1, layers, k]`` on the host: its
        prompt (after its left padding) and every response token but the last."""
        start, end = self._prompt_len - prompt_len, self._prompt_len + response_len - 1
        return self._log[row, start:end].cpu().clone()

    def _recorded(self) -> torch.Tensor:
        """``[tokens, layers, k]`` of the last forward, in the log's dtype."""
        indices = [replay.get_recorded_indices() for replay in self._routers]
        assert all(i is not None for i in indices), "every router recorded this forward"
        return torch.stack(indices, dim=1).to(self._log.dtype)


class RoutingRecorder:
    """Records the routing of an engine's model (one whose routers have replay)."""

    def __init__(self, routers: dict[int, RouterReplay], num_experts: int, topk: int) -> None:
        self._routers = routers
        self._dtype = routed_dtype(num_experts)
        self._topk = topk

    @classmethod
    def of(cls, model: torch.nn.Module) -> RoutingRecorder | None:
        """A recorder for ``model``; None when it was built without routing replay."""
        routers = layer_routers(model)
        if not routers:
            return None
        config = cast(TransformerConfig, model.config)
        return cls(routers, config.num_moe_experts or 0, config.moe_router_topk)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Every router in RECORD for the duration (a colocated policy's routers too: their
        action is cleared afterwards)."""
        routers = list(self._routers.values())
        _set_action(routers, RouterReplayAction.RECORD)
        try:
            yield
        finally:
            _set_action(routers, None)

    def new_log(
        self, batch: int, prompt_len: int, columns: int, device: torch.device
    ) -> RoutingLog:
        """An empty log for ``batch`` rows, a padded prompt of ``prompt_len`` and
        ``columns`` positions in all."""
        shape = (batch, columns, len(self._routers), self._topk)
        log = torch.zeros(shape, dtype=self._dtype, device=device)
        return RoutingLog(self._routers, log, prompt_len)


# ---------------------------------------------------------------------------------------
# Trainer: replay


def _sequence_parallel_chunk(
    tokens_first: torch.Tensor, dims: ParallelDims, tp_rank: int
) -> torch.Tensor:
    """This TP rank's contiguous chunk of dim 0 under sequence parallelism."""
    if not dims.sequence_parallel or dims.tp == 1:
        return tokens_first
    return tokens_first.chunk(dims.tp, dim=0)[tp_rank]


def padded_router_order(
    routed_BSLK: torch.Tensor, dims: ParallelDims, *, cp_rank: int, tp_rank: int
) -> torch.Tensor:
    """A padded micro-batch's ``[b, S, layers, k]`` routing as this rank's router sees its
    tokens: ``[S_local * b, layers, k]`` (CP split of S, transpose to ``[s, b]``, SP chunk
    of s, flattened s-major)."""
    local = split_for_context_parallel(routed_BSLK, seq_dim=1, cp_rank=cp_rank, cp_size=dims.cp)
    tokens_first = _sequence_parallel_chunk(local.transpose(0, 1), dims, tp_rank)
    return tokens_first.reshape(-1, *routed_BSLK.shape[2:]).contiguous()


def packed_router_order(
    layout: PackLayout, routed_BSLK: torch.Tensor, dims: ParallelDims, *, tp_rank: int
) -> torch.Tensor:
    """A pack's routing (``pack_tokens`` for ``[B, S, layers, k]``, then this CP rank's
    ``local_order`` and the SP chunk): ``[T_local / tp, layers, k]``."""
    row, column, position = layout.token_sources
    packed = routed_BSLK.new_zeros((layout.total, *routed_BSLK.shape[2:]))
    packed[position] = routed_BSLK[row, column]
    return _sequence_parallel_chunk(packed[layout.local_order()], dims, tp_rank).contiguous()


@contextlib.contextmanager
def replaying(
    model_chunks: Sequence[torch.nn.Module], active: bool
) -> Iterator[Callable[[torch.nn.Module, torch.Tensor | None], None]]:
    """Routers in REPLAY_FORWARD for one pass (``active``: its micro-batches carry routing);
    yields ``set_targets(model_chunk, routing)``, to call before each micro-batch's
    forward. Targets and actions are cleared afterwards."""
    chunks = [layer_routers(chunk) for chunk in model_chunks] if active else []
    routers = [replay for chunk in chunks for replay in chunk.values()]
    if active and not routers:
        raise ValueError(
            "the batch carries routed experts but the model was built without routing "
            "replay (policy.moe.routing_replay)"
        )
    by_chunk = {id(chunk): found for chunk, found in zip(model_chunks, chunks, strict=False)}

    def set_targets(model: torch.nn.Module, routing: torch.Tensor | None) -> None:
        if routing is None:
            return
        for layer, replay in by_chunk[id(model)].items():
            replay.clear_indices()  # one target at a time (no REPLAY_BACKWARD queue)
            replay.set_target_indices(routing[:, layer].long())

    _set_action(routers, RouterReplayAction.REPLAY_FORWARD)
    try:
        yield set_targets
    finally:
        _set_action(routers, None)
