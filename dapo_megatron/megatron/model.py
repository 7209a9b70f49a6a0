"""Build this rank's Megatron-Core GPTModel for a Qwen2, Llama 3, Qwen3 or Qwen3-MoE
architecture.

The model mirrors the HF implementation: RMSNorm before attention and MLP, SwiGLU MLP
without biases, rotary embeddings with the model's theta, grouped-query attention, a
q/k/v bias for Qwen2, Qwen3's per-head q/k RMSNorm and explicit head size, tied or
untied input/output embeddings. Qwen3-MoE replaces every MLP by a top-k router over
SwiGLU experts, split over expert-parallel ranks (``_moe_settings``). Weights are random
until ``hf_weights.load_hf_checkpoint`` fills them.

Layer implementation: Transformer Engine's spec on CUDA; Megatron's local (pure torch)
spec on CPU, with our own RMSNorm (the local spec's torch norm refuses sequence
parallelism, see ``_RMSNorm``) and, when context parallelism is on or the model runs
packed sequences (``packed=True``), our all-gather core attention (``context_parallel.py``),
which implements both (Megatron's local ``DotProductAttention`` refuses CP > 1 and
``packed_seq_params``). On CUDA a Transformer Engine that does not import is an error
(``TransformerEngineUnavailable``), not a silent fall-back: the local spec attends unfused,
which the memory plan does not count; ``policy.allow_local_spec`` opts in. Both specs get
their arguments (QK-norm, MoE experts, grouped GEMM) from the same TransformerConfig
fields (``spec_arguments``).

Vocabulary padding: the embedding and output layer have ``padded_vocab_size`` rows (a
multiple of 128 * TP, Megatron's convention, so that each TP shard is equal and GEMM
friendly). Padded rows are zero; logits beyond ``arch.vocab_size`` are padding and must be
masked (or sliced off) before any softmax over the vocabulary.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig

from dapo_megatron.config.model_arch import SUPPORTED_FAMILIES, ModelArch, padded_vocab_size
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.run_plan import FORWARD_MOE, MoeTraining, te_abi_message
from dapo_megatron.megatron import rope_thd
from dapo_megatron.megatron.cp_attention import ContextParallelAttention
from dapo_megatron.megatron.cpu_compat import apply_cpu_compat

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside Megatron's DDP / Float16Module wrappers (same parameters)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


class TransformerEngineUnavailable(RuntimeError):
    """CUDA is present but Transformer Engine (or Megatron's layers over it) does not import,
    and ``policy.allow_local_spec`` is false."""


def transformer_engine_error() -> str | None:
    """None when Transformer Engine and Megatron's TE layers import; else the error's text.

    Megatron's ``gpt_layer_specs`` swallows the same import error (its ``HAVE_TE``), so the
    TE spec would fail later and less clearly; this asks the same imports directly. An
    undefined-symbol ImportError (TE's torch extension compiled against another torch) is
    turned into one line naming the installed torch and the fix (run_plan.te_abi_message)."""
    try:
        import transformer_engine.pytorch  # noqa: F401
        from megatron.core.extensions.transformer_engine_spec_provider import (  # noqa: F401
            TESpecProvider,
        )
    except Exception as error:  # ImportError, OSError (a missing .so), RuntimeError, ...
        abi = te_abi_message(str(error)) if isinstance(error, ImportError) else None
        return abi if abi is not None else f"{type(error).__name__}: {error}"
    return None


def uses_transformer_engine(*, allow_local_spec: bool = False) -> bool:
    """True when the Transformer Engine layer spec is used: on CUDA, always, unless TE does
    not import and ``allow_local_spec`` accepts the local spec instead; on CPU, never.

    Raises:
        TransformerEngineUnavailable: CUDA without an importable TE, not opted in.
    """
    if not torch.cuda.is_available():
        return False
    error = transformer_engine_error()
    if error is None:
        return True
    if allow_local_spec:
        warnings.warn(
            f"Transformer Engine does not import ({error}); policy.allow_local_spec=true: "
            "the local spec runs on CUDA (unfused attention, more activation memory than "
            "dapo-plan counts)",
            stacklevel=2,
        )
        return False
    raise TransformerEngineUnavailable(
        f"Transformer Engine does not import on this CUDA machine ({error}); without it the "
        "policy would run Megatron's local spec: unfused attention, slower, and more "
        "activation memory than dapo-plan counts. Install the GPU stack with bash "
        "scripts/setup_gpu.sh (the gpu extra, with transformer-engine[pytorch] built against "
        "the installed torch), or set policy.allow_local_spec=true to run the local spec "
        "on purpose"
    )


def _recompute_settings(recompute: str) -> dict[str, object]:
    """Megatron's activation-recompute fields for ``policy.megatron.recompute_granularity``.

    selective: core attention only (Megatron's default module; the [b, a, s, s] scores of
    unfused attention are the largest activation it saves). full: every layer keeps only its
    input and recomputes the rest in backward (uniform, one layer per unit).
    """
    if recompute == "none":
        return {}
    if recompute == "selective":
        return {"recompute_granularity": "selective"}
    if recompute == "full":
        return {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    raise ValueError(f"recompute {recompute!r}: expected none, selective or full")


def _moe_settings(arch: ModelArch, dims: ParallelDims, moe: MoeTraining) -> dict[str, object]:
    """Megatron's MoE fields for a Qwen3-MoE ``arch`` (none for a dense model).

    HF's router: softmax over every expert, top-k, then (``norm_topk_prob``) renormalise the
    k probabilities; renormalised, that is a softmax over the k largest logits, Megatron's
    ``moe_router_pre_softmax=False``; without renormalising it is Megatron's pre-softmax
    router (softmax first, then top-k). Router logits in fp32 (``moe_router_dtype``), as
    HF's softmax. Expert TP is TP (Megatron's default, and what hf_experts.py shards by).
    """
    if arch.moe is None:
        return {}
    # TEGroupedMLP (one grouped GEMM over the local experts) where TE imports on CUDA,
    # SequentialMLP (one GEMM per expert) elsewhere: the local spec has no grouped GEMM
    # without the grouped_gemm package.
    grouped = torch.cuda.is_available() and transformer_engine_error() is None
    return {
        "num_moe_experts": arch.moe.num_experts,
        "moe_router_topk": arch.moe.experts_per_token,
        "moe_ffn_hidden_size": arch.moe.moe_ffn_hidden_size,
        "moe_router_pre_softmax": not arch.moe.norm_topk_prob,
        "moe_router_dtype": "fp32",
        "moe_aux_loss_coeff": moe.aux_loss_coef,
        # "none" builds the router without the load-balancing term at all (RL default).
        "moe_router_load_balancing_type": "aux_loss" if moe.aux_loss_coef > 0 else "none",
        "moe_token_dispatcher_type": moe.token_dispatcher,
        "moe_grouped_gemm": grouped,
        # One RouterReplay per router (megatron/routing_replay.py); inert until an action
        # is set, so a model built with it routes as one built without.
        "moe_enable_routing_replay": moe.routing_replay,
        "expert_model_parallel_size": dims.ep,
        "expert_tensor_parallel_size": dims.tp,
    }


def transformer_config(
    arch: ModelArch,
    dims: ParallelDims,
    precision: str,
    *,
    recompute: str = "none",
    moe: MoeTraining = FORWARD_MOE,
) -> TransformerConfig:
    """Megatron TransformerConfig equivalent to the HF model ``arch`` under layout ``dims``.

    Args:
        arch: model architecture (Qwen2, Llama, Qwen3 or Qwen3-MoE family).
        dims: parallel layout; tp, pp, cp, ep and sequence_parallel are used.
        precision: "fp32", "bf16" or "fp16": the dtype of the parameters and activations.
        recompute: activation recompute in training: "none", "selective" or "full".
        moe: ``policy.moe`` (``PolicyPlan.moe``); read for a MoE architecture only.
    """
    if precision not in _DTYPES:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(_DTYPES)}")
    recompute_fields = _recompute_settings(recompute)
    if arch.family not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"model family {arch.family!r} is not supported ({', '.join(SUPPORTED_FAMILIES)})"
        )
    dtype = _DTYPES[precision]
    on_cpu = not torch.cuda.is_available()
    # With Transformer Engine on a GPU: SwiGLU as one autograd function that saves only
    # FC1's output (mlp.py -> fusions/fused_bias_swiglu.py SwiGLUFunction; the unfused glu
    # keeps silu(gate), the product and a copy of up: 5 f/TP per token where the fused one
    # keeps 2), and TE's fused RoPE (rope_utils.apply_rotary_pos_emb; the unfused THD path
    # saves cos/sin tables per token). CPU keeps the unfused paths: the fused SwiGLU is
    # torch.compile'd (megatron/core/jit.py), a compile per shape on a CPU twin, and the
    # fused RoPE exists only in TE. The memory tracer (fake_trace/) measured the difference.
    gpu_fusions = not on_cpu and transformer_engine_error() is None
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        # Qwen3's head size is its own (heads x head_dim != hidden in Qwen3-0.6B/8B...):
        # SelfAttention sizes linear_qkv's q rows and linear_proj's input as
        # heads x kv_channels, not hidden.
        kv_channels=arch.head_dim,
        # Qwen3's q_norm / k_norm: RMSNorm over each head after the qkv split, before RoPE
        # (Attention.get_query_key_value_tensors). Both specs take it from this field
        # (spec_arguments); finalize_model_grads all-reduces the q/k_layernorm grads over
        # TP by their names whenever it is set.
        qk_layernorm=arch.qk_layernorm,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_epsilon,
        gated_linear_unit=True,  # SwiGLU: fc1 = [gate; up], act = silu(gate) * up
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.add_qkv_bias,
        # RL fine-tuning runs without dropout, and HF's forward has none to match.
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=dims.tp,
        pipeline_model_parallel_size=dims.pp,
        context_parallel_size=dims.cp,
        sequence_parallel=dims.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        # On CPU, the master weight is built once and split, so that every TP layout of
        # the same seed starts from the same weights (and no CUDA allocation is tried).
        use_cpu_initialization=on_cpu,
        bias_activation_fusion=gpu_fusions,
        apply_rope_fusion=gpu_fusions,
        **recompute_fields,
        **_moe_settings(arch, dims, moe),
    )


class _RMSNorm(torch.nn.RMSNorm):
    """RMSNorm with Megatron's norm constructor, usable with sequence parallelism.

    Megatron's local spec wraps torch norms in ``WrappedTorchNorm``, which asserts
    ``not config.sequence_parallel``. Normalisation is per token, so it is correct on a
    sequence shard; only the weight gradient is partial on each TP rank, and Megatron's
    ``finalize_model_grads`` all-reduces it over TP for params marked ``sequence_parallel``.

    The forward follows the HF/vLLM rounding (normalise in fp32, cast to the input dtype,
    then scale by the weight), so that bf16 training sees the rollout engine's numbers.
    """

    def __init__(
        self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused: object
    ) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        # Megatron's marker on a parameter, read by finalize_model_grads (not torch's).
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., hidden] -> same shape and dtype."""
        x32 = x.float()
        # eps None: torch.nn.RMSNorm's default, the dtype's machine epsilon.
        eps = torch.finfo(x32.dtype).eps if self.eps is None else self.eps
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return self.weight * x32.to(x.dtype)


def spec_arguments(config: TransformerConfig) -> dict[str, Any]:
    """The layer-spec arguments both specs take from the model's config (QK-norm, MoE), so
    the TE spec on GPU and the local spec on CPU build the same layer.

    QK-norm on GPU is decided in Megatron's ``get_gpt_layer_with_transformer_engine_spec``
    (``gpt_layer_specs.py``): ``q_layernorm``/``k_layernorm`` are
    ``TESpecProvider.layer_norm(for_qk=True)`` (TENorm) when ``qk_layernorm`` is passed,
    else IdentityOp; nothing reads ``config.qk_layernorm`` there, so it must be passed.
    Either spec names the weights ``self_attention.q_layernorm.weight`` / ``k_layernorm``.
    """
    return {
        "num_experts": config.num_moe_experts,
        "moe_grouped_gemm": config.moe_grouped_gemm,
        "qk_layernorm": config.qk_layernorm,
    }


def _local_block_spec(config: TransformerConfig, packed: bool) -> TransformerBlockSubmodules:
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", **spec_arguments(config))
    self_attention = spec.submodules.self_attention
    attention: dict[str, type] = {}
    if config.context_parallel_size > 1 or packed:
        # The local DotProductAttention refuses CP > 1 and packed sequences (only TE
        # implements them); ours all-gathers K/V over the CP group and attends per packed
        # sequence. CP == 1 without packing keeps Megatron's module and numerics.
        attention["core_attention"] = ContextParallelAttention
    if config.qk_layernorm:
        # The local QK-norm is the same torch norm that refuses sequence parallelism.
        attention.update(q_layernorm=_RMSNorm, k_layernorm=_RMSNorm)
    if attention:
        self_attention = dataclasses.replace(
            self_attention,
            submodules=dataclasses.replace(self_attention.submodules, **attention),
        )
    layer = dataclasses.replace(
        spec,
        submodules=dataclasses.replace(
            spec.submodules,
            input_layernorm=_RMSNorm,
            pre_mlp_layernorm=_RMSNorm,
            self_attention=self_attention,
        ),
    )
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    num_layers = get_num_layers_to_build(config, pp_rank=pp_rank)
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=_RMSNorm)


def layer_spec(
    config: TransformerConfig, *, packed: bool = False, allow_local_spec: bool = False
) -> ModuleSpec | TransformerBlockSubmodules:
    """The decoder spec: Transformer Engine on GPU, local modules on CPU (and on GPU only
    with ``allow_local_spec``, when TE does not import; ``uses_transformer_engine``).

    The local spec under CP > 1 or with ``packed`` uses ``ContextParallelAttention``; its
    inputs must then be split with ``context_parallel.split_for_context_parallel`` (or
    ``split_packed_for_context_parallel`` for packed rows: the layouts that GPTModel's
    rotary embedding assumes). TE's spec handles both natively and is the same either way.
    """
    if uses_transformer_engine(allow_local_spec=allow_local_spec):
        return get_gpt_layer_with_transformer_engine_spec(**spec_arguments(config))
    return _local_block_spec(config, packed)


def build_model(
    arch: ModelArch,
    dims: ParallelDims,
    precision: str,
    *,
    recompute: str = "none",
    packed: bool = False,
    allow_local_spec: bool = False,
    moe: MoeTraining = FORWARD_MOE,
) -> GPTModel:
    """This rank's pipeline stage of the GPT model (requires ``initialize_parallel``).

    The stage owns layers ``[pp_rank * L / pp, (pp_rank + 1) * L / pp)``, the embedding on
    the first stage, the final norm and output layer on the last. Forward:
    ``model(input_ids [b, s], position_ids [b, s], attention_mask=None)`` returns, on the
    last stage, logits ``[b, s, padded_vocab / tp]`` (vocab-parallel, not gathered), and
    on other stages the hidden states ``[s / (tp if SP else 1), b, h]`` for the next stage.

    ``packed=True`` makes the model accept packed rows (it still accepts unpacked
    batches): ``model(input_ids [1, t], position_ids [1, t], None,
    packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu,
    cu_seqlens_kv=cu, max_seqlen_q=m, max_seqlen_kv=m))`` with ``cu`` the GLOBAL
    cumulative padded lengths (int32 ``[n + 1]``, each length a multiple of ``2 * cp``,
    times ``tp`` under sequence parallelism), ``m`` the longest padded length, and
    ``t = cu[-1] / cp`` tokens per rank laid out by
    ``context_parallel.split_packed_for_context_parallel``; the logits are ``[1, t,
    padded_vocab / tp]`` in the same layout. On CPU (local spec) this needs
    ``packed=True``; on GPU the Transformer Engine spec handles it either way.

    ``allow_local_spec`` (``policy.allow_local_spec``): on CUDA without an importable
    Transformer Engine, build the local spec instead of raising TransformerEngineUnavailable.

    ``moe`` (``PolicyPlan.moe``): the MoE training settings of a Qwen3-MoE ``arch``; a
    forward-only copy (engine, exporter) keeps the default. Each rank builds the experts
    ``[ep_rank * E / ep, (ep_rank + 1) * E / ep)`` of every layer (``hf_experts.py``).
    """
    apply_cpu_compat()
    # Packed batches: Megatron's unfused THD RoPE loops over the sequences on every layer;
    # the vectorised replacement gives the same numbers (rope_thd.py).
    rope_thd.install()
    config = transformer_config(arch, dims, precision, recompute=recompute, moe=moe)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(config, packed=packed, allow_local_spec=allow_local_spec),
        vocab_size=padded_vocab_size(arch.vocab_size, dims.tp),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=arch.rope_theta,
        rope_scaling=arch.rope_scaling_factor is not None,
        rope_scaling_factor=arch.rope_scaling_factor or 1.0,
    )
    if moe.freeze_router:
        # Before DDP wraps the model: a parameter without requires_grad gets no gradient
        # buffer and no optimizer state, so the router keeps its checkpoint weights.
        for layer in model.decoder.layers:
            router = getattr(getattr(layer, "mlp", None), "router", None)
            if router is not None:
                router.weight.requires_grad_(False)
    # Megatron's linear layers already use params_dtype; the norms are plain torch modules.
    model.to(config.params_dtype)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model
