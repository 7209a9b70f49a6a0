"""Hugging Face <-> Megatron-Core weights for the GPT model of model.py (Qwen2, Llama, Qwen3).

Import (``load_hf_checkpoint``) fills this rank's TP shard of this rank's pipeline stage
straight from the safetensors files: each tensor is opened lazily with ``safe_open`` and
only the rows/columns of this rank's shard are read, so no rank ever holds the full model.

``load_hf_tensors`` does the same from an iterable of in-memory ``(hf_name, full tensor)``
pairs, e.g. the export iterator of another model: the weight refit of a generation engine
that holds its own copy of the model.

Export (``export_hf_weights``) streams full HF-named tensors, one parameter at a time:
the owning stage all-gathers the TP shards, broadcasts the result over the pipeline group,
and every rank un-fuses it into HF tensors. All ranks must iterate to the end together
(the loop issues collectives); all see the same names in the same order. This iterator
feeds the generation engine's weight refit.

Megatron layouts handled here (np query heads, ng query groups, hn head dim, tp ranks):

* ``linear_qkv``: rows grouped per query group, ``[q heads of the group, k, v]``:
  ``[ng, np/ng + 2, hn, h]``; a TP rank holds ng/tp consecutive groups.
* ``linear_fc1`` (SwiGLU): each TP rank holds ``[gate shard; up shard]``, so the
  TP-concatenated tensor is ``[tp, 2, ffn/tp, h]``.
* column-parallel (qkv, fc1, embedding, output layer) split rows; row-parallel
  (``linear_proj``, ``linear_fc2``) split columns; norms are replicated.
* the q rows of ``linear_qkv`` and the columns of ``linear_proj`` are ``query_width`` =
  np x hn wide: the hidden size except where the head size is explicit (Qwen3).
* Qwen3's ``self_attn.q_norm`` / ``k_norm`` <-> ``self_attention.q_layernorm`` /
  ``k_layernorm`` (hn wide, replicated).
* embedding/output layer rows are padded to ``padded_vocab_size``; padding rows are zero
  on import and dropped on export.
* Qwen3-MoE: the router ``mlp.gate.weight`` <-> ``mlp.router.weight`` is replicated like a
  norm; the experts are ``hf_experts.py``'s (expert parallel), exported after every other
  tensor.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from safetensors import safe_open

from dapo_megatron.config.model_arch import ModelArch, padded_vocab_size
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.device import collectives
from dapo_megatron.megatron import hf_experts
from dapo_megatron.megatron.model import unwrap_model

# How a Megatron parameter is split over TP and fused from HF tensors.
REPLICATED, VOCAB, QKV, FC1, ROW = "replicated", "vocab", "qkv", "fc1", "row"


@dataclass(frozen=True)
class _Entry:
    """One Megatron parameter of one pipeline stage and the HF tensors it is made of."""

    megatron: tuple[str, ...]
    """Candidate names in the stage module: local spec first, Transformer Engine second."""
    hf: tuple[str, ...]
    """HF tensor names, in fusion order (q, k, v or gate, up)."""
    kind: str
    """REPLICATED, VOCAB, QKV, FC1 or ROW."""
    stage: int
    """Pipeline stage that owns the parameter."""
    full_shape: tuple[int, ...]
    """Shape after concatenating the TP shards (padded vocab rows included)."""
    export: bool = True
    """False for the last stage's copy of tied embeddings (exported once, from stage 0)."""


def _layer_entries(arch: ModelArch, layer: int, local: int, stage: int) -> list[_Entry]:
    h, f = arch.hidden_size, arch.ffn_hidden_size
    qkv_rows = (arch.num_attention_heads + 2 * arch.num_query_groups) * arch.head_dim
    hf = f"model.layers.{layer}."
    mg = f"decoder.layers.{local}."
    attn = [f"{hf}self_attn.{p}_proj" for p in "qkv"]
    entries = [
        _Entry(
            (f"{mg}input_layernorm.weight", f"{mg}self_attention.linear_qkv.layer_norm_weight"),
            (f"{hf}input_layernorm.weight",),
            REPLICATED,
            stage,
            (h,),
        ),
        _Entry(
            (f"{mg}self_attention.linear_qkv.weight",),
            tuple(f"{a}.weight" for a in attn),
            QKV,
            stage,
            (qkv_rows, h),
        ),
    ]
    if arch.add_qkv_bias:
        entries.append(
            _Entry(
                (f"{mg}self_attention.linear_qkv.bias",),
                tuple(f"{a}.bias" for a in attn),
                QKV,
                stage,
                (qkv_rows,),
            )
        )
    if arch.qk_layernorm:
        # Qwen3's per-head q/k RMSNorm: one head's width, shared by every head, so each TP
        # rank holds all of it. The local and TE specs use the same module names.
        entries += [
            _Entry(
                (f"{mg}self_attention.{mg_norm}.weight",),
                (f"{hf}self_attn.{hf_norm}.weight",),
                REPLICATED,
                stage,
                (arch.head_dim,),
            )
            for mg_norm, hf_norm in (("q_layernorm", "q_norm"), ("k_layernorm", "k_norm"))
        ]
    entries += [
        _Entry(
            (f"{mg}self_attention.linear_proj.weight",),
            (f"{hf}self_attn.o_proj.weight",),
            ROW,
            stage,
            (h, arch.query_width),
        ),
        _Entry(
            (f"{mg}pre_mlp_layernorm.weight", f"{mg}mlp.linear_fc1.layer_norm_weight"),
            (f"{hf}post_attention_layernorm.weight",),
            REPLICATED,
            stage,
            (h,),
        ),
    ]
    if arch.moe is not None:
        # The experts are hf_experts.py's; the router is replicated on every TP/EP rank.
        entries.append(
            _Entry(
                (f"{mg}mlp.router.weight",),
                (f"{hf}mlp.gate.weight",),
                REPLICATED,
                stage,
                (arch.moe.num_experts, h),
            )
        )
        return entries
    entries += [
        _Entry(
            (f"{mg}mlp.linear_fc1.weight",),
            (f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"),
            FC1,
            stage,
            (2 * f, h),
        ),
        _Entry((f"{mg}mlp.linear_fc2.weight",), (f"{hf}mlp.down_proj.weight",), ROW, stage, (h, f)),
    ]
    return entries


def _entries(arch: ModelArch, dims: ParallelDims) -> list[_Entry]:
    """Every parameter of the model, all stages, in HF order (embedding, layers, head)."""
    if arch.num_layers % dims.pp != 0:
        raise ValueError(f"num_layers {arch.num_layers} is not divisible by pp {dims.pp}")
    per_stage = arch.num_layers // dims.pp
    last = dims.pp - 1
    vocab_shape = (padded_vocab_size(arch.vocab_size, dims.tp), arch.hidden_size)
    entries = [
        _Entry(
            ("embedding.word_embeddings.weight",),
            ("model.embed_tokens.weight",),
            VOCAB,
            0,
            vocab_shape,
        )
    ]
    for layer in range(arch.num_layers):
        entries += _layer_entries(arch, layer, layer % per_stage, layer // per_stage)
    entries.append(
        _Entry(
            ("decoder.final_layernorm.weight",),
            ("model.norm.weight",),
            REPLICATED,
            last,
            (arch.hidden_size,),
        )
    )
    if not arch.tie_word_embeddings:
        entries.append(
            _Entry(("output_layer.weight",), ("lm_head.weight",), VOCAB, last, vocab_shape)
        )
    elif dims.pp > 1:
        # With PP, Megatron keeps a copy of the tied embedding as the last stage's output
        # layer (kept in sync by a gradient all-reduce); it is filled from embed_tokens.
        entries.append(
            _Entry(
                ("output_layer.weight",),
                ("model.embed_tokens.weight",),
                VOCAB,
                last,
                vocab_shape,
                export=False,
            )
        )
    return entries


def _resolve(entry: _Entry, params: dict[str, torch.nn.Parameter]) -> str:
    for name in entry.megatron:
        if name in params:
            return name
    raise KeyError(f"the model has none of {entry.megatron} (for HF {entry.hf[0]})")


class _LazyCheckpoint:
    """Reads slices of tensors from a directory of safetensors files without loading them."""

    def __init__(self, hf_dir: str | Path, stack: ExitStack) -> None:
        index = Path(hf_dir) / "model.safetensors.index.json"
        if index.is_file():
            # The index names the model's shards; other *.safetensors (adapters...) are
            # not part of it.
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({Path(hf_dir) / name for name in weight_map.values()})
        else:
            files = sorted(Path(hf_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {hf_dir}")
        self._handles = {}
        for path in files:
            handle = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            self._handles.update(dict.fromkeys(handle.keys(), handle))
        self._dir = hf_dir

    def slice(
        self, name: str, rows: slice = slice(None), cols: slice | None = None
    ) -> torch.Tensor:
        """``tensor[rows]`` or ``tensor[rows, cols]`` of HF tensor ``name``, read lazily."""
        if name not in self._handles:
            raise KeyError(f"tensor {name!r} is not in the checkpoint {self._dir}")
        lazy = self._handles[name].get_slice(name)
        part: torch.Tensor = lazy[rows] if cols is None else lazy[rows, cols]
        return part


class _InMemoryTensors:
    """``_LazyCheckpoint``'s slicing interface over full tensors already in memory."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def slice(
        self, name: str, rows: slice = slice(None), cols: slice | None = None
    ) -> torch.Tensor:
        """``tensor[rows]`` or ``tensor[rows, cols]`` (a view) of HF tensor ``name``."""
        tensor = self._tensors[name]
        return tensor[rows] if cols is None else tensor[rows, cols]


def _span(size: int, rank: int, world: int) -> slice:
    """This rank's equal share of ``size`` rows."""
    if size % world != 0:
        raise ValueError(f"dimension {size} is not divisible by tensor parallel size {world}")
    step = size // world
    return slice(rank * step, (rank + 1) * step)


def _read_shard(
    entry: _Entry, ckpt: _LazyCheckpoint | _InMemoryTensors, arch: ModelArch, rank: int, tp: int
) -> torch.Tensor:
    """This TP rank's shard of ``entry`` in Megatron layout, read from HF tensors."""
    if entry.kind == REPLICATED:
        return ckpt.slice(entry.hf[0])
    if entry.kind == ROW:
        return ckpt.slice(entry.hf[0], slice(None), _span(entry.full_shape[1], rank, tp))
    if entry.kind == FC1:
        rows = _span(arch.ffn_hidden_size, rank, tp)
        return torch.cat([ckpt.slice(name, rows) for name in entry.hf])
    if entry.kind == VOCAB:
        return _read_vocab_shard(entry, ckpt, arch, rank, tp)
    # QKV: this rank's query groups; q rows of a group are contiguous in HF's q_proj.
    hn, groups = arch.head_dim, _span(arch.num_query_groups, rank, tp)
    local_groups = groups.stop - groups.start
    q_per_group = arch.num_attention_heads // arch.num_query_groups
    q_name, k_name, v_name = entry.hf
    q = ckpt.slice(q_name, slice(groups.start * q_per_group * hn, groups.stop * q_per_group * hn))
    k = ckpt.slice(k_name, slice(groups.start * hn, groups.stop * hn))
    v = ckpt.slice(v_name, slice(groups.start * hn, groups.stop * hn))
    rest = q.shape[1:]
    fused = torch.cat(
        [
            q.reshape(local_groups, q_per_group * hn, *rest),
            k.reshape(local_groups, hn, *rest),
            v.reshape(local_groups, hn, *rest),
        ],
        dim=1,
    )
    return fused.reshape(-1, *rest)


def _read_vocab_shard(
    entry: _Entry, ckpt: _LazyCheckpoint | _InMemoryTensors, arch: ModelArch, rank: int, tp: int
) -> torch.Tensor:
    """Rows of the padded vocabulary on this rank: real rows from HF, then zero rows."""
    rows = _span(entry.full_shape[0], rank, tp)
    real_stop = min(rows.stop, arch.vocab_size)
    real = ckpt.slice(entry.hf[0], slice(rows.start, max(real_stop, rows.start)))
    padding = real.new_zeros(rows.stop - rows.start - real.shape[0], arch.hidden_size)
    return torch.cat([real, padding])


def _check_layer_offset(model: GPTModel, arch: ModelArch, dims: ParallelDims) -> None:
    """Our stage -> layer map must match the one Megatron built the model with."""
    per_stage = arch.num_layers // dims.pp
    offset = parallel_state.get_pipeline_model_parallel_rank() * per_stage
    built = [layer.layer_number - 1 for layer in model.decoder.layers]
    if built != list(range(offset, offset + per_stage)):
        raise ValueError(
            f"stage holds global layers {built}, expected {offset}..{offset + per_stage - 1}"
        )


@torch.no_grad()
def load_hf_checkpoint(
    model: torch.nn.Module, hf_dir: str | Path, arch: ModelArch, dims: ParallelDims
) -> None:
    """Copy an HF safetensors checkpoint (one or many shards) into this rank's model shard.

    Args:
        model: this rank's GPTModel stage from ``model.build_model(arch, dims, ...)``,
            possibly wrapped in DDP/Float16Module. Load before building the optimizer:
            mixed-precision optimizers copy their fp32 master weights at construction.
        hf_dir: directory with ``*.safetensors`` (e.g. written by ``save_pretrained``).
        arch: the checkpoint's architecture.
        dims: the layout the model was built with (requires ``initialize_parallel``).

    Raises:
        KeyError / ValueError: a tensor is missing from the checkpoint, has the wrong
            shape, or a model parameter has no HF source.
    """
    model = unwrap_model(model)
    _check_layer_offset(model, arch, dims)
    params = dict(model.named_parameters())
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    stage = parallel_state.get_pipeline_model_parallel_rank()
    loaded: set[str] = set()
    with ExitStack() as stack:
        ckpt = _LazyCheckpoint(hf_dir, stack)
        for entry in _entries(arch, dims):
            if entry.stage != stage:
                continue
            loaded.add(_copy_shard(entry, ckpt, params, arch, tp_rank, dims.tp, str(hf_dir)))
        if arch.moe is not None:
            loaded |= hf_experts.load_expert_shards(ckpt, params, arch, dims)
    missing = sorted(set(params) - loaded)
    if missing:
        raise KeyError(f"model parameters with no HF source: {missing}")


def _copy_shard(
    entry: _Entry,
    source: _LazyCheckpoint | _InMemoryTensors,
    params: dict[str, torch.nn.Parameter],
    arch: ModelArch,
    tp_rank: int,
    tp: int,
    origin: str,
) -> str:
    """Copy this TP rank's shard of ``entry`` from ``source``; returns the parameter name."""
    name = _resolve(entry, params)
    shard = _read_shard(entry, source, arch, tp_rank, tp)
    if tuple(shard.shape) != tuple(params[name].shape):
        raise ValueError(
            f"{name}: HF {entry.hf} give a shard of shape {tuple(shard.shape)}, the "
            f"model expects {tuple(params[name].shape)}; does arch match {origin}?"
        )
    params[name].copy_(shard)
    return name


def _hf_shapes(entry: _Entry, arch: ModelArch) -> list[tuple[int, ...]]:
    """Full shapes of the HF tensors of ``entry``, in ``entry.hf`` order."""
    rest = entry.full_shape[1:]
    if entry.kind == VOCAB:
        return [(arch.vocab_size, *rest)]
    if entry.kind == FC1:
        return [(arch.ffn_hidden_size, *rest)] * 2
    if entry.kind == QKV:
        kv = (arch.num_query_groups * arch.head_dim, *rest)
        return [(arch.query_width, *rest), kv, kv]
    return [entry.full_shape]


@torch.no_grad()
def load_hf_tensors(
    model: torch.nn.Module,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    arch: ModelArch,
    dims: ParallelDims,
) -> None:
    """Copy full HF-named tensors into this rank's model shard (the refit of a model copy).

    Each rank keeps only its TP shard of its pipeline stage: tensors of other stages are
    skipped, fused parameters (q/k/v, gate/up) are built as soon as all their HF parts have
    arrived, and a part is dropped once every parameter that needs it is filled, so with
    the export order (``export_hf_weights``) at most one fused group is held at a time.

    Args:
        model: this rank's GPTModel stage (possibly wrapped), built with ``arch`` and ``dims``.
        named_tensors: ``(hf_name, full tensor)`` pairs in any order, any dtype/device
            (copied into the parameters' dtype and device); all the model's weights must be
            among them. A tied model ignores an ``lm_head.weight`` (HF may store one).
        arch: the architecture of the model and of the tensors.
        dims: the layout the model was built with (requires ``initialize_parallel``).

    Raises:
        KeyError: a name is not an HF weight of ``arch``, or a parameter got no tensor.
        ValueError: a tensor has the wrong shape.
    """
    model = unwrap_model(model)
    _check_layer_offset(model, arch, dims)
    params = dict(model.named_parameters())
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    stage = parallel_state.get_pipeline_model_parallel_rank()
    entries = _entries(arch, dims)
    expected_shape = {
        name: shape
        for entry in entries
        for name, shape in zip(entry.hf, _hf_shapes(entry, arch), strict=True)
    }
    # HF name -> indices of this stage's entries that need it (tied PP: two entries).
    needed_by: dict[str, list[int]] = {}
    local = [entry for entry in entries if entry.stage == stage]
    for index, entry in enumerate(local):
        for name in entry.hf:
            needed_by.setdefault(name, []).append(index)
    pending: dict[str, torch.Tensor] = {}
    done: set[int] = set()
    loaded: set[str] = set()
    source = _InMemoryTensors(pending)
    experts = hf_experts.ExpertTensorSink(params, arch, dims) if arch.moe is not None else None
    for name, tensor in named_tensors:
        expert_shape = experts.expected_shape(name) if experts is not None else None
        if experts is not None and expert_shape is not None:
            if tuple(tensor.shape) != expert_shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {expert_shape}")
            experts.take(name, tensor)
            continue
        if name not in expected_shape:
            if name == "lm_head.weight" and arch.tie_word_embeddings:
                continue
            raise KeyError(f"{name!r} is not a weight of this {arch.family} architecture")
        if tuple(tensor.shape) != expected_shape[name]:
            raise ValueError(
                f"{name}: shape {tuple(tensor.shape)}, expected {expected_shape[name]}"
            )
        if name not in needed_by:
            continue  # another pipeline stage's weight
        pending[name] = tensor
        for index in needed_by[name]:
            entry = local[index]
            if index not in done and all(part in pending for part in entry.hf):
                loaded.add(
                    _copy_shard(entry, source, params, arch, tp_rank, dims.tp, "the given tensors")
                )
                done.add(index)
        for part in [p for p in pending if all(i in done for i in needed_by[p])]:
            del pending[part]
    if experts is not None:
        loaded |= experts.loaded
    missing = sorted(set(params) - loaded)
    if missing:
        absent = sorted(
            {n for i, e in enumerate(local) if i not in done for n in e.hf} - set(pending)
        )
        raise KeyError(
            f"model parameters with no HF tensor: {missing} (missing HF tensors: {absent})"
        )


def _gather_tp(local: torch.Tensor, kind: str, group: dist.ProcessGroup, tp: int) -> torch.Tensor:
    """Concatenate the TP shards of a parameter (a fresh tensor, never the parameter)."""
    if kind == REPLICATED or tp == 1:
        return local.detach().clone()
    local = local.detach().contiguous()
    if kind != ROW:
        # Shards concatenate along dim 0: gather straight into the result, so the export
        # holds one full copy of the parameter, not the shards and their concatenation.
        full = local.new_empty((tp * local.shape[0], *local.shape[1:]))
        collectives.all_gather_into_tensor(full, local, group=group)
        return full
    shards = [torch.empty_like(local) for _ in range(tp)]
    collectives.all_gather(shards, local, group=group)
    return torch.cat(shards, dim=1)


def _unfuse(
    entry: _Entry, full: torch.Tensor, arch: ModelArch, tp: int
) -> list[tuple[str, torch.Tensor]]:
    """Split a TP-concatenated Megatron tensor back into its HF tensors."""
    if entry.kind == VOCAB:
        # A view: ``full`` is already a fresh tensor, and the padding rows are its tail.
        return [(entry.hf[0], full[: arch.vocab_size])]
    if entry.kind == FC1:
        halves = full.view(tp, 2, arch.ffn_hidden_size // tp, *full.shape[1:])
        return [
            (name, halves[:, i].reshape(arch.ffn_hidden_size, *full.shape[1:]))
            for i, name in enumerate(entry.hf)
        ]
    if entry.kind == QKV:
        ng, hn = arch.num_query_groups, arch.head_dim
        q_per_group = arch.num_attention_heads // ng
        rest = full.shape[1:]
        grouped = full.view(ng, q_per_group + 2, hn, *rest)
        q = grouped[:, :q_per_group].reshape(ng * q_per_group * hn, *rest)
        k = grouped[:, q_per_group].reshape(ng * hn, *rest)
        v = grouped[:, q_per_group + 1].reshape(ng * hn, *rest)
        return list(zip(entry.hf, (q, k, v), strict=True))
    return [(entry.hf[0], full)]


def hf_weight_specs(arch: ModelArch, dims: ParallelDims) -> list[tuple[str, tuple[int, ...]]]:
    """``(hf_name, full shape)`` of every tensor ``export_hf_weights`` yields, in its order.

    Computed from the architecture alone (no collective, no tensor), so a refit can plan
    its buckets before the first tensor is gathered.
    """
    specs = [
        (name, shape)
        for entry in _entries(arch, dims)
        if entry.export
        for name, shape in zip(entry.hf, _hf_shapes(entry, arch), strict=True)
    ]
    if arch.moe is not None:
        specs += hf_experts.expert_specs(arch, dims)
    return specs


@torch.no_grad()
def export_hf_weights(
    model: torch.nn.Module, arch: ModelArch, dims: ParallelDims
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor)`` for every HF weight, on every rank, same order.

    Tensors are complete (TP shards gathered, vocabulary padding removed), in the model's
    dtype and device, and never alias model parameters. Tied embeddings yield only
    ``model.embed_tokens.weight`` (as HF's ``save_pretrained`` does). Every rank of the
    model-parallel group must consume the iterator fully: each parameter costs one TP
    all-gather on its stage and, with PP, one broadcast over the pipeline group. A MoE's
    experts come last, gathered over the expert-TP and EP groups one slot of one layer at
    a time (``hf_experts.export_experts``): then every rank of the job must iterate.
    """
    params = dict(unwrap_model(model).named_parameters())
    sample = next(iter(params.values()))
    tp_group = parallel_state.get_tensor_model_parallel_group()
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    stage = parallel_state.get_pipeline_model_parallel_rank()
    for entry in _entries(arch, dims):
        if not entry.export:
            continue
        if entry.stage == stage:
            full = _gather_tp(params[_resolve(entry, params)], entry.kind, tp_group, dims.tp)
        else:
            full = torch.empty(entry.full_shape, dtype=sample.dtype, device=sample.device)
        if dims.pp > 1:
            src = dist.get_global_rank(pp_group, entry.stage)
            collectives.broadcast(full, src=src, group=pp_group)
        yield from _unfuse(entry, full, arch, dims.tp)
    if arch.moe is not None:
        yield from hf_experts.export_experts(params, arch, dims)
