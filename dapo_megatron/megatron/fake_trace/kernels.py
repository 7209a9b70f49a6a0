"""Stand-ins for the GPU spec's kernels: they save for backward and allocate what the
Transformer Engine (2.11) and flash kernels do, and compute nothing of value.

On a GPU the policy builds Megatron's Transformer Engine spec
(``get_gpt_layer_with_transformer_engine_spec``, megatron/core/models/gpt/gpt_layer_specs.py):
the two norms fused into the GEMM after them (``TELayerNormColumnParallelLinear`` for
linear_qkv and linear_fc1, the norm modules ``IdentityOp``), ``TEDotProductAttention``
(cuDNN/flash, THD with packing), ``TERowParallelLinear`` for linear_proj and linear_fc2, and
``TENorm`` for Qwen3's q/k norms. None of them runs on a CPU build, fake or real. The layer
spec here keeps the same module tree and Megatron code around them (attention.py's QKV split,
RoPE dispatch, mlp.py's activation, the bias-dropout-add, the schedule) and puts in place of
each kernel an autograd Function that

  norm + column GEMM  saves the norm's input x [n/sp, h] (aliased, no copy), its output (the
                      GEMM input, the local shard: TE gathers it again for the weight
                      gradient under SP) and rsigma fp32 [n/sp]
                      (transformer_engine/pytorch/module/layernorm_linear.py,
                      _LayerNormLinear.forward: inputmat, ln_out, rsigma)
  core attention      cuDNN's FusedAttention (F16_arbitrary_seqlen: preferred on sm90,
                      dot_product_attention/utils.py get_attention_backend) saves q, k, v,
                      out and fp32 softmax stats [n, heads, 1] (backends.py
                      FusedAttnFunc.forward); v, a strided view of the mixed QKV output
                      after Megatron's split, fails get_qkv_layout's stride check and is
                      made contiguous (a copy), so the mixed QKV tensor is not kept;
                      backward allocates dq, dk, dv (csrc/extensions/attention.cpp)
  fused RoPE          saves only the frequencies; its output is a new tensor like its input
                      (attention/rope.py FusedRoPEFunc, csrc/extensions/apply_rope.cpp)
  q/k norm (TENorm)   te.pytorch.RMSNorm: the input made contiguous (a copy of the strided
                      q/k view) and rstdevs fp32 saved (ops/basic/rmsnorm.py op_forward)

Sources: Transformer Engine tag v2.11, Megatron-Core 0.16.1 as installed. Row-parallel GEMMs keep Megatron's local RowParallelLinear: it saves what TE's Linear saves
(its input shard and the weight) and reduce-scatters the same way. Values are zeros (a real
CPU run of the same spec stays finite, so its optimizer steps like a GPU's); the tracer only
counts bytes. Kernel workspaces (cuBLAS, cuDNN) are not tensors here: the memory plan keeps
them as a named budget term.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy
import torch
from megatron.core.fusions import fused_bias_swiglu
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
from megatron.core.optimizer import clip_grads
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

from dapo_megatron.megatron import model as model_module
from dapo_megatron.megatron.cp_attention import ContextParallelAttention
from dapo_megatron.planning.trace import op_cost


# torch's autograd.Function.apply is unannotated: its calls below carry no-untyped-call.
class _RMSNormKernel(torch.autograd.Function):
    """TE's RMSNorm kernel: out = norm(x) * w in x's dtype; saves x and rsigma (fp32)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # TE's norms read a contiguous input (a copy of a strided view)
        nbytes = _nbytes(x)
        with op_cost.kernel("te_rmsnorm_fwd", 4 * x.numel(), 2 * nbytes):
            rsigma = x.new_zeros(x.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(x, weight, rsigma)
            return torch.zeros_like(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight, _ = ctx.saved_tensors
        with op_cost.kernel("te_rmsnorm_bwd", 8 * x.numel(), 3 * _nbytes(x)):
            return torch.zeros_like(x), torch.zeros_like(weight)


# Megatron-Core ships no type information: its classes are Any to mypy.
class FusedNormColumnParallelLinear(ColumnParallelLinear):  # type: ignore[misc]
    """TELayerNormColumnParallelLinear: RMSNorm fused into the column-parallel GEMM after
    it. The norm's weight is this module's ``layer_norm_weight``, as in TE (the HF importer
    maps input_layernorm/post_attention_layernorm onto it on a GPU)."""

    def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
        kwargs.pop("tp_comm_buffer_name", None)
        kwargs.pop("tp_group", None)
        super().__init__(input_size, output_size, config=config, **kwargs)
        self.layer_norm_weight = torch.nn.Parameter(
            torch.ones(input_size, dtype=config.params_dtype)
        )
        self.layer_norm_weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        normed = _RMSNormKernel.apply(x, self.layer_norm_weight)  # type: ignore[no-untyped-call]
        return super().forward(normed, *args, **kwargs)


class TENormStandIn(torch.nn.Module):
    """TENorm (RMSNorm) for Qwen3's q/k norms."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _RMSNormKernel.apply(x, self.weight)  # type: ignore[no-untyped-call]
        return out


class _FlashAttentionKernel(torch.autograd.Function):
    """cuDNN fused attention over packed sequences: out like q, fp32 softmax stats
    [n, heads, 1] saved with q, k, v and out; backward allocates dq, dk, dv."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, flops: int
    ) -> torch.Tensor:
        # get_qkv_layout: q and k (RoPE's fresh outputs) pass as they are; v, a strided
        # view of the mixed QKV tensor, is copied.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        ctx.flops = flops
        with op_cost.kernel("cudnn_attention_fwd", flops, 2 * _nbytes(q) + 2 * _nbytes(k)):
            out = torch.zeros_like(q)
            stats = q.new_zeros((q.shape[0], q.shape[-2], 1), dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, stats)
            return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, _out, _lse = ctx.saved_tensors
        # Backward recomputes the scores: 2.5x the forward (op_cost.causal_attention_flops).
        nbytes = 4 * _nbytes(q) + 4 * _nbytes(k)
        with op_cost.kernel("cudnn_attention_bwd", int(2.5 * ctx.flops), nbytes):
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None


class FlashAttentionStandIn(ContextParallelAttention):
    """TEDotProductAttention for THD packed sequences (CP included: TE's ring exchanges
    K/V chunks in place of the all-gather of the CPU module)."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        # Causal attention over the packed sequences: the trace packs rows of one length
        # (max_seqlen), so the pack is len // max_seqlen of them; CP ranks hold 1/cp of
        # each sequence's queries.
        cp = self.config.context_parallel_size
        local = query.shape[0]
        longest = getattr(packed_seq_params, "max_seqlen_q", None) or local * cp
        sequences = [int(longest)] * max(1, local * cp // int(longest))
        flops = op_cost.causal_attention_flops(sequences, query.shape[-2], query.shape[-1], cp)
        out: torch.Tensor = _FlashAttentionKernel.apply(query, key, value, flops)  # type: ignore[no-untyped-call]
        return out.reshape(*out.shape[:-2], -1)


class _FusedRoPE(torch.autograd.Function):
    """TE's fused RoPE (THD): a new tensor like t; saves nothing but the frequencies."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        with op_cost.kernel("te_rope_fwd", 3 * t.numel(), 2 * _nbytes(t)):
            ctx.save_for_backward(freqs)
            return torch.zeros_like(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        with op_cost.kernel("te_rope_bwd", 3 * grad.numel(), 2 * _nbytes(grad)):
            return torch.zeros_like(grad), None


def fused_rope_thd(
    t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, **_: Any
) -> torch.Tensor:
    return fused_rope(t, freqs)


def fused_rope(t: torch.Tensor, freqs: torch.Tensor, **_: Any) -> torch.Tensor:
    out: torch.Tensor = _FusedRoPE.apply(t, freqs)  # type: ignore[no-untyped-call]
    return out


def _swiglu(y: torch.Tensor) -> torch.Tensor:
    """The compiled SwiGLU kernel (megatron/core/jit.py: torch.compile): one output."""
    with op_cost.kernel("swiglu_fwd", 4 * y.numel(), _nbytes(y) * 3 // 2):
        return y.new_zeros((*y.shape[:-1], y.shape[-1] // 2))


def _swiglu_back(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with op_cost.kernel("swiglu_bwd", 8 * y.numel(), _nbytes(y) * 5 // 2):
        return torch.zeros_like(y)


def _weighted_swiglu_back(g: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> Any:
    """The compiled kernel returns the input's and the per-token weights' gradients."""
    with op_cost.kernel("weighted_swiglu_bwd", 8 * y.numel(), _nbytes(y) * 5 // 2):
        return torch.zeros_like(y), torch.zeros_like(w)


def _logprob_head_costs() -> dict[tuple[Any, str], Any]:
    """Our Triton logprob head (kernels/triton_logprob.py) runs its real Python with no-op
    launches; its GEMMs are declared here: forward logits 2 n h V/t; backward recomputes
    them and makes dW and dH, 3 x that. Bytes: the hidden states and the weight shard."""
    from dapo_megatron.kernels.triton_logprob import TritonLinearLogprob

    forward, backward = TritonLinearLogprob.forward, TritonLinearLogprob.backward

    def costed_forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, *rest: Any) -> Any:
        flops = 2 * hidden.shape[0] * hidden.shape[1] * weight.shape[0]
        ctx.cost = (flops, _nbytes(hidden) + _nbytes(weight))
        with op_cost.kernel("triton_logprob_fwd", *ctx.cost):
            return forward(ctx, hidden, weight, *rest)

    def costed_backward(ctx: Any, *grads: Any) -> Any:
        flops, nbytes = ctx.cost
        with op_cost.kernel("triton_logprob_bwd", 3 * flops, 3 * nbytes):
            return backward(ctx, *grads)

    return {
        (TritonLinearLogprob, "forward"): staticmethod(costed_forward),
        (TritonLinearLogprob, "backward"): staticmethod(costed_backward),
    }


def _balanced(n: int, parts: int) -> list[int]:
    """n split into `parts` counts as equal as integers allow."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _balanced_routing() -> dict[tuple[Any, str], Any]:
    """Which expert a token goes to is data, which fake tensors do not hold: every count
    the alltoall dispatcher derives from the routing map (token_dispatcher.py
    MoEAlltoAllTokenDispatcher.preprocess) is replaced by balanced routing's, as real host
    tensors (the dispatcher reads them on the host to size its all-to-all and expert
    splits): each rank's n x k routed copies spread evenly over the E experts. A real run
    with a hot expert allocates more on that expert's rank (the plan assumes the same).
    The permutation's index is data too: a stand-in of the same sizes
    (moe_utils.permute, dropless: index_select over n x k indices)."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    preprocess = MoEAlltoAllTokenDispatcher.preprocess
    to_host = moe_utils.maybe_move_tensor_to_cpu

    def host_splits(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        # The balanced split sizes are host tensors already; the all-to-all takes them
        # as NumPy arrays, which upstream makes only from CUDA tensors (as cpu_compat.py).
        if as_numpy and torch.is_tensor(tensor) and not isinstance(tensor, FakeTensor):
            # A recompute in backward runs with the fake mode active: read the host
            # values with it off.
            with _disable_current_modes():
                return numpy.array(tensor.tolist(), dtype=numpy.int64)
        return to_host(tensor, as_numpy=as_numpy, record_stream=record_stream)

    def balanced_preprocess(self: Any, routing_map: torch.Tensor) -> torch.Tensor:
        preprocess(self, routing_map)  # the device work (the count reductions)
        routed = routing_map.size(0) * self.config.moe_router_topk
        with _disable_current_modes():  # host values, real even under the fake mode
            return _balanced_splits(self, routed)

    def _balanced_splits(self: Any, routed: int) -> torch.Tensor:
        per_expert = torch.tensor(_balanced(routed, self.num_experts))
        local = per_expert.reshape(self.ep_size, self.num_local_experts)
        if self.ep_size > 1 or self.tp_size > 1:
            self.input_splits = local.sum(dim=1)
            # Every TP x EP rank routes alike, so each sends this rank's experts what this
            # rank sends them: [tp, ep, local experts].
            ep_rank = self.ep_group.rank() if self.ep_size > 1 else 0
            glob = local[ep_rank].expand(self.tp_size, self.ep_size, -1).contiguous()
            self.output_splits = glob.sum(dim=2)[self.tp_rank]
            self.output_splits_tp = glob.sum(dim=2).sum(dim=1)
            tokens_per_local_expert = glob.sum(dim=(0, 1))
        else:
            glob = per_expert
            tokens_per_local_expert = per_expert
        if self.num_local_experts > 1:
            self.num_global_tokens_per_local_expert = glob.reshape(-1, self.num_local_experts)
        return tokens_per_local_expert

    def permute(
        tokens: torch.Tensor,
        routing_map: torch.Tensor,
        probs: torch.Tensor | None = None,
        num_out_tokens: int | None = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        routed = int(num_out_tokens or routing_map.size(0) * routing_map.size(1))
        index = torch.zeros(routed, dtype=torch.long, device=tokens.device)
        permuted_probs = None
        if probs is not None:
            permuted_probs = probs.T.contiguous().view(-1).index_select(0, index)
        return tokens.index_select(0, index), permuted_probs, index

    def sort_chunks(
        input: torch.Tensor, split_sizes: Any, sorted_idxs: Any, probs: Any = None, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # moe_utils.sort_chunks_by_idxs reorders the [ranks x local experts] chunks by
        # expert: split views, then one cat, a copy of the same size (balanced chunks are
        # equal, so the order moves no byte).
        return input.clone(), None if probs is None else probs.clone()

    return {
        (MoEAlltoAllTokenDispatcher, "preprocess"): balanced_preprocess,
        (token_dispatcher, "permute"): permute,
        (token_dispatcher, "sort_chunks_by_idxs"): sort_chunks,
        (token_dispatcher, "maybe_move_tensor_to_cpu"): host_splits,
        # Bound only when TE imports (moe_utils.RouterGatingLinearFunction tests it): None
        # takes torch.mm, which makes the same fp32 router logits as TE's general_gemm.
        (moe_utils, "te_general_gemm"): None,
    }


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _NoLaunch:
    """A Triton kernel whose launch does nothing: the fused logprob head and loss
    (dapo_megatron/kernels/) allocate their buffers with torch around the launches, so the
    real Python of those kernels runs and only the device code is skipped."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


def _l2norm(chunk_size: int, noop: Any, tensor_lists: Any, per_tensor: bool, *a: Any) -> Any:
    """amp_C/TE multi_tensor_l2norm: one fp32 norm on the device, no host read (Megatron's
    CPU fallback, utils.local_multi_tensor_l2_norm, reads every norm into Python)."""
    return torch.zeros(1, dtype=torch.float32, device="cuda"), None


def install(*, real: bool = False) -> dict[tuple[Any, str], Any]:
    """What the GPU build sees on a fake device: TE's fused RoPE (so TransformerConfig
    accepts apply_rope_fusion, as with TE installed), the fused SwiGLU's kernels (compiled
    on a GPU; their allocations, without a compile) and the GPU layer spec. ``real`` (host
    tensors posing as the device's): the Triton head and loss chosen as on CUDA."""
    from dapo_megatron.kernels import dispatch, pg_loss, triton_logprob, triton_pg_loss
    from dapo_megatron.megatron import optimizer

    launches = {
        (triton_logprob, name): _NoLaunch()
        for name in ("_matmul_kernel", "_dlogits_kernel", "_forward_kernel")
    }
    on_host = (
        {
            (dispatch, "_resolve_impl"): lambda impl, *_: "triton" if impl == "auto" else impl,
            (pg_loss, "resolve_pg_loss_impl"): lambda impl, *_: (
                "triton" if impl == "auto" else impl
            ),
            (dispatch, "_triton_interpreted"): lambda: True,
            (pg_loss, "_triton_interpreted"): lambda: True,
            # The skipped launches leave the head's outputs uninitialised: the step takes
            # the branch a healthy GPU step takes (the fake run's reads answer the same).
            (optimizer, "grads_are_finite"): lambda *_: True,
        }
        if real
        else {}
    )
    return {
        **launches,
        **on_host,
        **_balanced_routing(),
        **_logprob_head_costs(),
        (triton_pg_loss, "_pg_loss_kernel"): _NoLaunch(),
        (clip_grads, "l2_norm_impl"): _l2norm,
        (fused_bias_swiglu, "swiglu"): _swiglu,
        (fused_bias_swiglu, "swiglu_back"): _swiglu_back,
        (fused_bias_swiglu, "weighted_swiglu"): lambda y, w: _swiglu(y),
        (fused_bias_swiglu, "weighted_swiglu_back"): _weighted_swiglu_back,
        (rope_utils, "fused_apply_rotary_pos_emb_thd"): fused_rope_thd,
        (rope_utils, "fused_apply_rotary_pos_emb"): fused_rope,
        (model_module, "layer_spec"): gpu_layer_spec,
        (model_module, "transformer_engine_error"): lambda: None,
    }


def gpu_layer_spec(config: Any, *, packed: bool = False, allow_local_spec: bool = False) -> Any:
    """The local block spec rebuilt with the TE spec's module tree (module docstring)."""
    block: TransformerBlockSubmodules = model_module._local_block_spec(config, packed)
    layer = block.layer_specs[0]
    sub = layer.submodules
    attention = sub.self_attention
    attn_sub = dataclasses.replace(
        attention.submodules,
        linear_qkv=FusedNormColumnParallelLinear,
        core_attention=FlashAttentionStandIn,
        **(
            {"q_layernorm": TENormStandIn, "k_layernorm": TENormStandIn}
            if config.qk_layernorm
            else {}
        ),
    )
    mlp = sub.mlp
    if config.num_moe_experts is not None:
        # TEGroupedMLP runs one grouped GEMM over the local experts' token splits; Megatron's
        # SequentialMLP runs the same GEMMs expert by expert, saving the same inputs (views
        # of one permuted tensor) and outputs: its bytes, without a grouped-GEMM kernel.
        mlp = get_moe_module_spec(use_te=False, num_experts=config.num_moe_experts)
    if (
        isinstance(mlp, ModuleSpec)
        and mlp.submodules is not None
        and config.num_moe_experts is None
    ):
        mlp = dataclasses.replace(
            mlp,
            submodules=dataclasses.replace(
                mlp.submodules, linear_fc1=FusedNormColumnParallelLinear
            ),
        )
        pre_mlp: Any = IdentityOp
    else:
        pre_mlp = TENormStandIn  # MoE: the router and experts take the normed input (TENorm)
    layer = dataclasses.replace(
        layer,
        submodules=dataclasses.replace(
            sub,
            input_layernorm=IdentityOp,
            self_attention=dataclasses.replace(attention, submodules=attn_sub),
            pre_mlp_layernorm=pre_mlp,
            mlp=mlp,
        ),
    )
    return TransformerBlockSubmodules(
        layer_specs=[layer] * len(block.layer_specs), layer_norm=TENormStandIn
    )
