"""The routed experts of a Qwen3-MoE model between HF tensors and Megatron-Core's shards.

HF names (what ``save_pretrained`` writes and ``from_pretrained`` reads; transformers 5
holds the experts stacked in memory, ``gate_up_proj [E, 2F, h]`` / ``down_proj [E, h, F]``,
but converts to and from these names at the file boundary, so the files are the contract):
``model.layers.{l}.mlp.experts.{e}.gate_proj.weight`` and ``up_proj`` ``[F, h]``,
``down_proj`` ``[h, F]`` (F: moe_ffn_hidden_size). The router, ``mlp.gate.weight`` <->
``mlp.router.weight`` ``[E, h]``, is an ordinary replicated tensor: ``hf_weights.py`` maps
it with the rest of the layer.

Megatron (``expert_model_parallel_size`` ep, expert TP = TP): EP rank p holds experts
``[p * E / ep, (p + 1) * E / ep)`` of every layer of its pipeline stage, at local index
``j = e - p * E / ep``; each expert is split over the expert-TP group like a dense SwiGLU
MLP: ``linear_fc1`` is ``[gate shard; up shard]`` ``[2F / tp, h]``, ``linear_fc2`` the
column shard ``[h, F / tp]``. Parameter names: ``mlp.experts.local_experts.{j}.linear_fc1
.weight`` (SequentialMLP: the local spec, and TE without grouped GEMM) or
``mlp.experts.linear_fc1.weight{j}`` (TEGroupedMLP, TE's grouped GEMM).

Import reads only this rank's experts and only their TP rows/columns. Export gathers one
local expert slot per layer at a time over the expert-TP and EP groups (``ep`` experts in
flight, whatever the model's size), after every non-expert tensor; all ranks iterate the
same names in the same order (``expert_specs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from dapo_megatron.config.model_arch import ModelArch, MoeArch
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.device import collectives

_PARTS = ("gate_proj", "up_proj", "down_proj")


class TensorSource(Protocol):
    """Reads a slice of a full HF tensor (``hf_weights``: lazily from safetensors files, or
    from tensors in memory)."""

    def slice(
        self, name: str, rows: slice = slice(None), cols: slice | None = None
    ) -> torch.Tensor: ...


def hf_expert_names(layer: int, expert: int) -> tuple[str, str, str]:
    """HF names of expert ``expert`` of layer ``layer``: gate, up, down."""
    prefix = f"model.layers.{layer}.mlp.experts.{expert}."
    return tuple(f"{prefix}{part}.weight" for part in _PARTS)  # type: ignore[return-value]


def _moe(arch: ModelArch) -> MoeArch:
    if arch.moe is None:
        raise ValueError(f"{arch.family} is a dense model: it has no experts")
    return arch.moe


def _hf_shapes(arch: ModelArch) -> tuple[tuple[int, int], ...]:
    f, h = _moe(arch).moe_ffn_hidden_size, arch.hidden_size
    return ((f, h), (f, h), (h, f))


@dataclass(frozen=True)
class _Layout:
    """This rank's place in the expert grid (requires ``initialize_parallel``)."""

    per_rank: int
    """Experts of a layer on one EP rank (E / ep)."""
    ep_rank: int
    """Rank in the expert-parallel group."""
    tp: int
    """Expert tensor-parallel size."""
    tp_rank: int
    """Rank in the expert tensor-parallel group."""
    layers: range
    """Global layers of this pipeline stage."""

    @classmethod
    def of_this_rank(cls, arch: ModelArch, dims: ParallelDims) -> _Layout:
        moe = _moe(arch)
        if moe.num_experts % dims.ep or moe.moe_ffn_hidden_size % dims.tp:
            raise ValueError(
                f"{moe.num_experts} experts of width {moe.moe_ffn_hidden_size} do not split "
                f"over EP {dims.ep} x TP {dims.tp}"
            )
        per_stage = arch.num_layers // dims.pp
        stage = parallel_state.get_pipeline_model_parallel_rank()
        return cls(
            per_rank=moe.num_experts // dims.ep,
            ep_rank=parallel_state.get_expert_model_parallel_rank(),
            tp=parallel_state.get_expert_tensor_parallel_world_size(),
            tp_rank=parallel_state.get_expert_tensor_parallel_rank(),
            layers=range(stage * per_stage, (stage + 1) * per_stage),
        )

    def local_index(self, expert: int) -> int | None:
        """The local index of a global expert on this rank, None if another rank's."""
        j = expert - self.ep_rank * self.per_rank
        return j if 0 <= j < self.per_rank else None


def _param_names(
    params: dict[str, torch.nn.Parameter], local_layer: int, j: int
) -> tuple[str, str]:
    """(fc1, fc2) names of local expert ``j`` of a stage's layer, SequentialMLP or TE grouped."""
    prefix = f"decoder.layers.{local_layer}.mlp.experts."
    for fc1, fc2 in (
        (
            f"{prefix}local_experts.{j}.linear_fc1.weight",
            f"{prefix}local_experts.{j}.linear_fc2.weight",
        ),
        (f"{prefix}linear_fc1.weight{j}", f"{prefix}linear_fc2.weight{j}"),
    ):
        if fc1 in params and fc2 in params:
            return fc1, fc2
    raise KeyError(f"the model has no local expert {j} in layer {local_layer} ({prefix}...)")


def _copy(param: torch.nn.Parameter, shard: torch.Tensor, name: str, hf: str) -> None:
    if tuple(shard.shape) != tuple(param.shape):
        raise ValueError(
            f"{name}: {hf} gives a shard of shape {tuple(shard.shape)}, the model expects "
            f"{tuple(param.shape)}; does the architecture match the checkpoint?"
        )
    param.copy_(shard)


def _fill_expert(
    source: TensorSource,
    params: dict[str, torch.nn.Parameter],
    layout: _Layout,
    arch: ModelArch,
    layer: int,
    expert: int,
) -> tuple[str, str]:
    """Copy this rank's expert-TP shard of one local expert; returns (fc1, fc2) names."""
    j = layout.local_index(expert)
    assert j is not None
    fc1, fc2 = _param_names(params, layer - layout.layers.start, j)
    gate, up, down = hf_expert_names(layer, expert)
    width = _moe(arch).moe_ffn_hidden_size // layout.tp
    rows = slice(layout.tp_rank * width, (layout.tp_rank + 1) * width)
    _copy(params[fc1], torch.cat([source.slice(gate, rows), source.slice(up, rows)]), fc1, gate)
    _copy(params[fc2], source.slice(down, slice(None), rows), fc2, down)
    return fc1, fc2


@torch.no_grad()
def load_expert_shards(
    source: TensorSource,
    params: dict[str, torch.nn.Parameter],
    arch: ModelArch,
    dims: ParallelDims,
) -> set[str]:
    """Fill this rank's experts (its stage's layers, its EP share, its TP shard) from
    ``source``; returns the names of the parameters filled."""
    layout = _Layout.of_this_rank(arch, dims)
    loaded: set[str] = set()
    first = layout.ep_rank * layout.per_rank
    for layer in layout.layers:
        for expert in range(first, first + layout.per_rank):
            loaded.update(_fill_expert(source, params, layout, arch, layer, expert))
    return loaded


class ExpertTensorSink:
    """Takes full HF expert tensors in any order and fills this rank's experts (the refit
    of an engine's model copy, ``hf_weights.load_hf_tensors``): an expert's gate and up
    tensors are held until both arrived, then dropped; other ranks' experts are skipped."""

    def __init__(
        self, params: dict[str, torch.nn.Parameter], arch: ModelArch, dims: ParallelDims
    ) -> None:
        self._params = params
        self._arch = arch
        self._layout = _Layout.of_this_rank(arch, dims)
        shapes = _hf_shapes(arch)
        self._where: dict[str, tuple[int, int, tuple[int, int]]] = {
            name: (layer, expert, shape)
            for layer in range(arch.num_layers)
            for expert in range(_moe(arch).num_experts)
            for name, shape in zip(hf_expert_names(layer, expert), shapes, strict=True)
        }
        self._pending: dict[str, torch.Tensor] = {}
        self.loaded: set[str] = set()
        """Names of the parameters filled so far."""

    def expected_shape(self, name: str) -> tuple[int, int] | None:
        """The full shape of HF expert tensor ``name``; None if it names no expert."""
        where = self._where.get(name)
        return None if where is None else where[2]

    @torch.no_grad()
    def take(self, name: str, tensor: torch.Tensor) -> None:
        """Use expert tensor ``name`` (``expected_shape`` not None, shape checked by the
        caller) if this rank holds a shard of it."""
        layer, expert, _ = self._where[name]
        if layer not in self._layout.layers or self._layout.local_index(expert) is None:
            return
        self._pending[name] = tensor
        names = hf_expert_names(layer, expert)
        if all(part in self._pending for part in names):
            self.loaded.update(
                _fill_expert(
                    _PendingTensors(self._pending),
                    self._params,
                    self._layout,
                    self._arch,
                    layer,
                    expert,
                )
            )
            for part in names:
                del self._pending[part]


class _PendingTensors:
    """``TensorSource`` over full tensors in memory."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def slice(
        self, name: str, rows: slice = slice(None), cols: slice | None = None
    ) -> torch.Tensor:
        tensor = self._tensors[name]
        return tensor[rows] if cols is None else tensor[rows, cols]


def _export_order(arch: ModelArch, dims: ParallelDims) -> Iterator[tuple[int, int, list[int]]]:
    """(layer, local slot j, the global experts gathered for it, by EP rank)."""
    per_rank = _moe(arch).num_experts // dims.ep
    for layer in range(arch.num_layers):
        for j in range(per_rank):
            yield layer, j, [p * per_rank + j for p in range(dims.ep)]


def expert_specs(arch: ModelArch, dims: ParallelDims) -> list[tuple[str, tuple[int, ...]]]:
    """``(hf_name, full shape)`` of every expert tensor ``export_experts`` yields, in order."""
    shapes = _hf_shapes(arch)
    return [
        (name, shape)
        for layer, _, experts in _export_order(arch, dims)
        for expert in experts
        for name, shape in zip(hf_expert_names(layer, expert), shapes, strict=True)
    ]


def _gather_expert_tp(
    fc1: torch.Tensor, fc2: torch.Tensor, tp: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's full fc1 ``[tp * 2F/tp, h]`` (TP-concatenated) and fc2 ``[h, F]``."""
    if tp == 1:
        return fc1.detach().contiguous(), fc2.detach().contiguous()
    group = parallel_state.get_expert_tensor_parallel_group()
    full1 = fc1.new_empty((tp * fc1.shape[0], fc1.shape[1]))
    collectives.all_gather_into_tensor(full1, fc1.detach().contiguous(), group=group)
    shards = [torch.empty_like(fc2) for _ in range(tp)]
    collectives.all_gather(shards, fc2.detach().contiguous(), group=group)
    return full1, torch.cat(shards, dim=1)


@torch.no_grad()
def export_experts(
    model_params: dict[str, torch.nn.Parameter], arch: ModelArch, dims: ParallelDims
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor)`` of every expert, on every rank, in ``expert_specs``
    order (collective over the expert-TP, EP and pipeline groups: all ranks iterate to the
    end together). Per step one local slot of one layer is gathered: ``ep`` experts."""
    moe = _moe(arch)
    layout = _Layout.of_this_rank(arch, dims)
    sample = next(iter(model_params.values()))
    f, h = moe.moe_ffn_hidden_size, arch.hidden_size
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    ep_group = parallel_state.get_expert_model_parallel_group()
    per_stage = arch.num_layers // dims.pp
    for layer, j, experts in _export_order(arch, dims):
        owner = layer // per_stage
        fc1s = sample.new_empty((dims.ep, 2 * f, h))
        fc2s = sample.new_empty((dims.ep, h, f))
        if layer in layout.layers:
            fc1_name, fc2_name = _param_names(model_params, layer - layout.layers.start, j)
            fc1, fc2 = _gather_expert_tp(model_params[fc1_name], model_params[fc2_name], layout.tp)
            if dims.ep == 1:
                fc1s[0], fc2s[0] = fc1, fc2
            else:
                collectives.all_gather_into_tensor(fc1s.view(-1, h), fc1, group=ep_group)
                collectives.all_gather_into_tensor(fc2s.view(-1, f), fc2, group=ep_group)
        if dims.pp > 1:
            src = dist.get_global_rank(pp_group, owner)
            collectives.broadcast(fc1s, src=src, group=pp_group)
            collectives.broadcast(fc2s, src=src, group=pp_group)
        # fc1 of each expert is TP-concatenated [tp, 2, F/tp, h]: gate halves, then up.
        halves = fc1s.view(dims.ep, layout.tp, 2, f // layout.tp, h)
        for p, expert in enumerate(experts):
            gate, up, down = hf_expert_names(layer, expert)
            yield gate, halves[p, :, 0].reshape(f, h)
            yield up, halves[p, :, 1].reshape(f, h)
            yield down, fc2s[p].clone()
