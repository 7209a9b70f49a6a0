"""Forward-only logprobs, the DAPO train step and the SFT step on Megatron-Core.

All three run through Megatron's ``forward_backward_func`` (so PP schedules, TP, SP, CP
and DP work unchanged) with a model whose output layer returns hidden states instead of
logits (``hidden_state_head``): the token logprobs come from the chunked vocab-parallel
``linear_logprob`` kernel, so the fp32 [tokens, vocab] logits never exist.

Loss normalisation: the DAPO loss of a mini-batch is defined with a GLOBAL normaliser
(``algorithms.loss.loss_denominator`` summed over every micro-batch and data-parallel
rank), computed before the forward pass. Each micro-batch's loss is its share of the
mini-batch loss, and Megatron must only SUM gradients: the model config sets
``calculate_per_token_loss`` (DDP then neither averages over DP/CP nor does the schedule
divide by the micro-batch count) and the loss functions report 0 tokens (so
``finalize_model_grads`` does not rescale). The result is independent of micro-batching
and of the DP size.

Shift convention: batches arrive token-aligned (shared/batch.py). Inside, tensors are
shifted to "prediction position" p, where label[p] = input_ids[p + 1]; outputs are shifted
back before they leave this module.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, overload

import torch
from megatron.core import parallel_state
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

from dapo_megatron.algorithms.loss import (
    loss_denominator,
    metric_reduction,
    reduce_loss_metrics,
)
from dapo_megatron.algorithms.loss_inputs import LossInputs
from dapo_megatron.algorithms.loss_spec import LossAggMode, LossSpec
from dapo_megatron.algorithms.rollout_correction import mismatch_from_sums, mismatch_sums
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.device import collectives
from dapo_megatron.kernels import linear_logprob
from dapo_megatron.kernels.pg_loss import pg_loss
from dapo_megatron.megatron.context_parallel import (
    gather_from_context_parallel,
    split_for_context_parallel,
)
from dapo_megatron.megatron.model import unwrap_model
from dapo_megatron.megatron.moe_release import release_dispatcher_state
from dapo_megatron.megatron.optimizer import optimizer_step
from dapo_megatron.megatron.packed_batches import (
    MicroBatch,
    MicroBatches,
    compute_device,
    packed_micro_batches,
    pad_multiple,
    unpack_outputs,
)
from dapo_megatron.megatron.routing_replay import padded_router_order, replaying
from dapo_megatron.shared.batch import PolicyBatch

Outputs = dict[str, torch.Tensor]
"""What a loss function hands Megatron's schedule per micro-batch (its logprobs or sums)."""
LossOut = tuple[torch.Tensor, torch.Tensor, Outputs]
"""A loss function's (loss, token count, outputs), as Megatron's schedule takes them."""
LossFn = Callable[[torch.nn.Module, MicroBatch, torch.Tensor], LossOut]


@dataclass(frozen=True)
class StepContext:
    """What every policy computation needs to know about the model and the layout."""

    dims: ParallelDims
    """Parallel layout."""
    vocab_size: int
    """Real vocabulary size (the output layer carries padding rows beyond it)."""
    temperature: float
    """Logits are divided by the sampling temperature, so logprobs match the rollouts."""
    max_tokens_per_microbatch: int | None
    """Token budget of a packed micro-batch (policy.max_tokens_per_microbatch); None keeps
    padded micro-batches of a fixed number of rows."""


# ---------------------------------------------------------------------------------------
# Output layer -> hidden states


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; backward all-reduces the gradient over the TP group.

    Megatron's copy_to_tensor_model_parallel_region does the same, but its all-reduce runs
    on ``grad.contiguous()`` and returns the original tensor: a non-contiguous gradient
    (ours arrives transposed from GPTModel's [s, b, h] -> [b, s, h]) would be reduced in a
    temporary copy and the reduction silently lost.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        collectives.all_reduce(grad, group=parallel_state.get_tensor_model_parallel_group())
        return grad


@contextlib.contextmanager
def hidden_state_head(model_chunks: list[torch.nn.Module]) -> Iterator[None]:
    """Make the last stage's output layer return (TP-replicated) hidden states.

    GPTModel applies its output layer to the final-norm hidden states, optionally with the
    tied embedding weight. Under this context the layer instead returns those hidden
    states, gathered over TP/SP with Megatron's region ops (whose backward reduces the
    gradient), and records the weight it would have used on ``model._dapo_output_weight``.
    It is an instance attribute of our own model object, restored on exit; generation can
    use the same model with real logits outside the context.
    """
    layer_owners = [
        unwrap_model(m) for m in model_chunks if hasattr(unwrap_model(m), "output_layer")
    ]
    layers: list[torch.nn.Module] = [
        owner.output_layer
        for owner in layer_owners
        if getattr(owner, "post_process", False) and isinstance(owner.output_layer, torch.nn.Module)
    ]
    for owner, layer in zip(layer_owners, layers, strict=False):

        def forward(
            hidden: torch.Tensor,
            weight: torch.Tensor | None = None,
            runtime_gather_output: bool | None = None,
            _layer: torch.nn.Module = layer,
            _owner: torch.nn.Module = owner,
        ) -> tuple[torch.Tensor, None]:
            # object.__setattr__: nn.Module would register a Parameter value as a new
            # parameter of the model (renaming the shared embedding in named_parameters).
            object.__setattr__(
                _owner, "_dapo_output_weight", _layer.weight if weight is None else weight
            )
            if _layer.sequence_parallel:
                hidden = gather_from_sequence_parallel_region(hidden, True)
            elif parallel_state.get_tensor_model_parallel_world_size() > 1:
                # torch's Function.apply is unannotated.
                hidden = _CopyToTensorParallel.apply(hidden)  # type: ignore[no-untyped-call]
            return hidden, None

        # An instance attribute shadows the class's forward (nn.Module.__call__ reads it).
        setattr(layer, "forward", forward)  # noqa: B010 - mypy refuses assigning a method
    try:
        yield
    finally:
        for layer in layers:
            delattr(layer, "forward")  # back to the class's forward
        for owner in layer_owners:
            owner.__dict__.pop("_dapo_output_weight", None)


def _output_weight(model: torch.nn.Module) -> torch.Tensor:
    weight = unwrap_model(model).__dict__["_dapo_output_weight"]
    assert isinstance(weight, torch.Tensor)
    return weight


# ---------------------------------------------------------------------------------------
# Micro-batches


@overload
def _shifted(t: torch.Tensor) -> torch.Tensor: ...


@overload
def _shifted(t: torch.Tensor | None) -> torch.Tensor | None: ...


def _shifted(t: torch.Tensor | None) -> torch.Tensor | None:
    """Token-aligned [B, S] -> prediction-aligned: out[:, p] = t[:, p + 1], last column 0."""
    if t is None:
        return None
    return torch.cat([t[:, 1:], t.new_zeros((t.shape[0], 1))], dim=1)


def _micro_batches(
    batch: PolicyBatch,
    micro_batch_size: int,
    dims: ParallelDims,
) -> MicroBatches:
    """Split into equal padded micro-batches of prediction-aligned, CP-local tensors (filler
    rows pad the last one)."""
    n_real = len(batch)
    multiple = pad_multiple(dims)
    seq_len = -(-batch.seq_len // multiple) * multiple
    n_micro = max(1, -(-n_real // micro_batch_size))
    batch = batch.pad_to(n_micro * micro_batch_size, seq_len)
    cp_rank = parallel_state.get_context_parallel_rank()
    device = compute_device()

    def local(t: torch.Tensor) -> torch.Tensor:
        if dims.cp > 1 and t.dim() == 2:
            t = split_for_context_parallel(t, seq_dim=1, cp_rank=cp_rank, cp_size=dims.cp)
        return t.to(device)

    def optional(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else local(t)

    advantages = batch.advantages
    if advantages is not None and advantages.dim() == 1:
        advantages = advantages[:, None].expand(-1, seq_len)
    position_ids = torch.arange(seq_len).expand(len(batch), seq_len)
    micro = []
    for i in range(n_micro):
        rows = slice(i * micro_batch_size, (i + 1) * micro_batch_size)
        mb = batch.select(rows)
        routed = mb.routed_experts
        if routed is not None:
            tp_rank = parallel_state.get_tensor_model_parallel_rank()
            routed = padded_router_order(routed, dims, cp_rank=cp_rank, tp_rank=tp_rank)
        micro.append(
            MicroBatch(
                input_ids=local(mb.input_ids),
                position_ids=local(position_ids[rows]),
                labels=local(_shifted(mb.input_ids)),
                mask_BT=local(_shifted(mb.loss_mask).float()),
                advantages_BT=optional(None if advantages is None else _shifted(advantages[rows])),
                old_logprobs_BT=optional(_shifted(mb.old_logprobs)),
                rollout_logprobs_BT=optional(_shifted(mb.rollout_logprobs)),
                ref_logprobs_BT=optional(_shifted(mb.ref_logprobs)),
                routed_experts=optional(routed),
            )
        )
    return MicroBatches(micro, seq_len, rows_per_micro=micro_batch_size)


def _split(batch: PolicyBatch, ctx: StepContext, micro_batch_size: int) -> MicroBatches:
    """The one place a pass chooses its micro-batches: packed under a token budget
    (``ctx.max_tokens_per_microbatch``), else padded ones of ``micro_batch_size`` rows."""
    if ctx.max_tokens_per_microbatch is not None:
        return packed_micro_batches(batch, ctx.max_tokens_per_microbatch, ctx.dims)
    return _micro_batches(batch, micro_batch_size, ctx.dims)


def _token_logprobs(
    model: torch.nn.Module,
    hidden_BSH: torch.Tensor,
    labels_BS: torch.Tensor,
    ctx: StepContext,
    *,
    entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob (and entropy) of each label under the model, [b, s_local] fp32."""
    weight = _output_weight(model)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    b, s, h = hidden_BSH.shape
    lp, ent = linear_logprob(
        hidden_BSH.reshape(b * s, h),
        weight,
        labels_BS.reshape(-1),
        temperature=ctx.temperature,
        vocab_start=tp_rank * weight.shape[0],
        tp_group=parallel_state.get_tensor_model_parallel_group() if ctx.dims.tp > 1 else None,
        compute_entropy=entropy,
        # The region op of hidden_state_head already reduces the hidden gradient over TP.
        reduce_grad_hidden=False,
        vocab_size=ctx.vocab_size,
    )
    return lp.view(b, s), None if ent is None else ent.view(b, s)


def _run(
    model_chunks: list[torch.nn.Module],
    split: MicroBatches,
    loss_fn: LossFn,
    *,
    forward_only: bool,
) -> list[Outputs]:
    """Megatron's schedule over the micro-batches; returns the last stage's loss outputs.
    Micro-batches with routed experts replay them (routing_replay.py)."""
    data = iter(split.micro)
    replay = replaying(model_chunks, split.micro[0].routed_experts is not None)

    def forward_step(
        data_iterator: Iterator[MicroBatch], model: torch.nn.Module
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], LossOut]]:
        mb = next(data_iterator)
        set_routing(model, mb.routed_experts)
        if mb.packed_seq_params is None:
            output = model(mb.input_ids, mb.position_ids, None)
        else:
            output = model(
                mb.input_ids, mb.position_ids, None, packed_seq_params=mb.packed_seq_params
            )
        return output, functools.partial(loss_fn, model, mb)

    with hidden_state_head(model_chunks), replay as set_routing:
        outputs: list[Outputs] = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=data,
            model=model_chunks,
            num_microbatches=len(split.micro),
            seq_length=split.seq_len,
            micro_batch_size=split.rows_per_micro,
            forward_only=forward_only,
        )
    release_dispatcher_state(model_chunks)  # MoE: the last forward's graph (moe_release.py)
    return outputs


def _no_tokens(device: torch.device) -> torch.Tensor:
    """The token count a loss function reports to Megatron's schedule: 0, so that
    ``finalize_model_grads`` does not rescale (module docstring). On the loss's device: the
    schedule adds it to a device tensor."""
    return torch.zeros((), dtype=torch.int, device=device)


def _broadcast_from_last_stage(
    tensor: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """Give every pipeline stage the last stage's tensor (the other stages' copy is made on
    the compute device, where the last stage's outputs are)."""
    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        assert tensor is not None
        return tensor
    if tensor is None:
        tensor = torch.empty(shape, dtype=dtype, device=compute_device())
    tensor = tensor.contiguous()
    collectives.broadcast(
        tensor,
        src=parallel_state.get_pipeline_model_parallel_last_rank(),
        group=parallel_state.get_pipeline_model_parallel_group(),
    )
    return tensor


# ---------------------------------------------------------------------------------------
# Forward-only logprobs


@torch.no_grad()
def compute_logprobs(
    model_chunks: list[torch.nn.Module],
    batch: PolicyBatch,
    ctx: StepContext,
    *,
    micro_batch_size: int,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-aligned logprobs [B, S] (and entropies) of this DP rank's batch, on every rank.

    Position 0 of each row has no logprob and is 0.
    """
    for m in model_chunks:
        m.eval()
    split = _split(batch, ctx, micro_batch_size)

    def loss_fn(model: torch.nn.Module, mb: MicroBatch, hidden: torch.Tensor) -> LossOut:
        lp, ent = _token_logprobs(model, hidden, mb.labels, ctx, entropy=compute_entropy)
        out = {"lp": lp}
        if ent is not None:
            out["ent"] = ent
        return torch.zeros((), device=lp.device), _no_tokens(lp.device), out

    outputs = _run(model_chunks, split, loss_fn, forward_only=True)
    keys = ("lp", "ent") if compute_entropy else ("lp",)
    if split.packed:
        results = _unpacked_outputs(split, outputs, keys, (len(batch), batch.seq_len))
    else:
        results = _padded_outputs(split, outputs, keys, batch, ctx)
    return results[0], results[1] if compute_entropy else None


def _padded_outputs(
    split: MicroBatches,
    outputs: list[Outputs],
    keys: tuple[str, ...],
    batch: PolicyBatch,
    ctx: StepContext,
) -> list[torch.Tensor]:
    """Token-aligned ``[B, S]`` host tensors, one per key, from padded micro-batches."""
    shape = (len(split.micro) * split.rows_per_micro, split.seq_len)
    results = []
    for key in keys:
        full = None
        if parallel_state.is_pipeline_last_stage():
            # Gathered and broadcast on the compute device; read back once, below.
            full = torch.cat([o[key] for o in outputs]).float()
            if ctx.dims.cp > 1:
                full = gather_from_context_parallel(
                    full, seq_dim=1, group=parallel_state.get_context_parallel_group()
                )
        full = _broadcast_from_last_stage(full, shape, torch.float32).cpu()
        # prediction-aligned -> token-aligned: the logprob of token t sits at column t.
        token_aligned = torch.cat([full.new_zeros((shape[0], 1)), full[:, :-1]], dim=1)
        results.append(token_aligned[: len(batch), : batch.seq_len])
    return results


def _unpacked_outputs(
    split: MicroBatches, outputs: list[Outputs], keys: tuple[str, ...], shape: tuple[int, int]
) -> list[torch.Tensor]:
    """Token-aligned ``[B, S]`` host tensors, one per key, from packed micro-batches."""
    results = []
    for key in keys:
        full = None
        if parallel_state.is_pipeline_last_stage():
            full = unpack_outputs(split.micro, [o[key] for o in outputs], shape)
        results.append(_broadcast_from_last_stage(full, shape, torch.float32).cpu())
    return results


# ---------------------------------------------------------------------------------------
# Training


def _global_denominator(
    batch: PolicyBatch, mode: LossAggMode, scale_length: int | None
) -> torch.Tensor:
    """The mini-batch normaliser: local denominators summed over data-parallel ranks.

    On the compute device: every micro-batch's loss divides by it, and a host tensor would
    be copied to the device (a stream sync) once per micro-batch.
    """
    local = loss_denominator(_shifted(batch.loss_mask), mode, loss_scale_length=scale_length)
    total = local.to(device=compute_device(), dtype=torch.float64).reshape(1)
    if parallel_state.get_data_parallel_world_size() > 1:
        collectives.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return total[0]


def _reduce_metric_sums(outputs: list[Outputs], keys: list[str]) -> dict[str, torch.Tensor]:
    """Combine per-micro-batch metric sums over micro-batches and DP x CP ranks.

    The sums stay on the device where the loss left them: one all-reduce per reduction op
    (sum, max, min), not one per metric, and one read-back to the host for the whole step
    (the returned 0-d tensors are on the CPU).
    """
    ops = {"sum": collectives.SUM, "max": collectives.MAX, "min": collectives.MIN}
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    distributed = parallel_state.get_data_parallel_world_size(with_context_parallel=True) > 1
    first = next((o[k] for o in outputs for k in keys if torch.is_tensor(o[k])), None)
    device = None if first is None else first.device
    names: list[str] = []
    parts: list[torch.Tensor] = []
    for how, op in ops.items():
        these = [k for k in keys if metric_reduction(k) == how]
        if not these:
            continue
        per_micro = torch.stack(
            [
                torch.stack(
                    [torch.as_tensor(o[k], device=device).double().reshape(()) for k in these]
                )
                for o in outputs
            ]
        )
        local = getattr(per_micro, how)(dim=0)
        local = local.values if how != "sum" else local
        if distributed:
            collectives.all_reduce(local, op=op, group=group)
        names += these
        parts.append(local)
    if not parts:
        return {}
    host = torch.cat(parts).cpu()  # the step's one device-to-host copy of its metrics
    return dict(zip(names, host.unbind(), strict=True))


def train_step(
    model_chunks: list[torch.nn.Module],
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    batch: PolicyBatch,
    ctx: StepContext,
    loss: LossSpec,
    *,
    micro_batch_size: int,
    advance_schedule: bool = True,
) -> dict[str, float]:
    """One optimizer step of the DAPO loss on this DP rank's share of a mini-batch;
    `advance_schedule` False keeps the lr for the next one (ScheduleClock).

    `batch` needs advantages, and rollout logprobs when `loss` asks for a rollout
    correction; old_logprobs default to the current policy's (detached) logprobs, i.e. a
    ratio of 1. Returns the step's metrics (identical on every rank).
    """
    if batch.advantages is None:
        raise ValueError("train_step needs batch.advantages")
    # Checked here, before any collective: inside the schedule only the last pipeline stage
    # runs the loss, and its error would leave the other stages waiting.
    if loss.rollout_correction != "none" and batch.rollout_logprobs is None:
        raise ValueError(
            f"rollout_correction={loss.rollout_correction!r} needs batch.rollout_logprobs"
        )
    for m in model_chunks:
        m.train()
    normalizer = _global_denominator(batch, loss.loss_agg_mode, loss.loss_scale_length)
    split = _split(batch, ctx, micro_batch_size)
    want_entropy_grad = loss.entropy_coef > 0

    def loss_fn(model: torch.nn.Module, mb: MicroBatch, hidden: torch.Tensor) -> LossOut:
        lp, ent_or_none = _token_logprobs(model, hidden, mb.labels, ctx, entropy=True)
        assert ent_or_none is not None and mb.advantages_BT is not None  # asked for; checked
        # Packed: the loss sees per-row tensors, as unpacked.
        lp, ent = mb.loss_rows(lp), mb.loss_rows(ent_or_none)
        # Without old logprobs this is the only update on the batch (the controller skips
        # the separate pass, controller/rollouts/steps.py): the policy before the update IS the
        # current one, so old = lp.detached is exact (ratio 1, the same gradient).
        reuse = mb.old_logprobs_BT is None
        old = lp.detach() if mb.old_logprobs_BT is None else mb.old_logprobs_BT
        # algorithms.loss.torch_policy_loss semantics; the fused Triton kernel on CUDA, that very
        # function on CPU (impl="auto").
        inputs = LossInputs(
            logprobs_BT=lp,
            old_logprobs_BT=old,
            advantages=mb.advantages_BT,
            mask_BT=mb.mask_BT,
            normalizer=normalizer,
            rollout_logprobs_BT=mb.rollout_logprobs_BT,
            ref_logprobs_BT=mb.ref_logprobs_BT,
            entropy_BT=ent if want_entropy_grad else ent.detach(),
        )
        out = pg_loss(inputs, loss)
        metrics = dict(out.metrics, loss_sum=out.loss.detach().double())
        if reuse and mb.rollout_logprobs_BT is not None:
            # The mismatch diagnostics the skipped pass would have reported.
            metrics.update(mismatch_sums(old, mb.rollout_logprobs_BT, mb.mask_BT))
        return out.loss, _no_tokens(out.loss.device), metrics

    outputs = _run(model_chunks, split, loss_fn, forward_only=False)
    metrics = _finish_metrics(outputs)
    metrics.update(optimizer_step(model_chunks, optimizer, scheduler, advance=advance_schedule))
    return metrics


def _finish_metrics(outputs: list[Outputs]) -> dict[str, float]:
    """Reduce the last stage's metric sums and share the means with every pipeline stage."""
    metrics = None
    if parallel_state.is_pipeline_last_stage():
        sums = _reduce_metric_sums(outputs, sorted(outputs[0]))
        loss = float(sums.pop("loss_sum"))
        mismatch = {k: sums.pop(k) for k in list(sums) if k.startswith("mismatch_")}
        metrics = {"loss": loss, **reduce_loss_metrics([sums])}
        if mismatch:
            metrics.update(mismatch_from_sums(mismatch))
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        holder = [metrics]
        collectives.broadcast_object_list(
            holder,
            src=parallel_state.get_pipeline_model_parallel_last_rank(),
            group=parallel_state.get_pipeline_model_parallel_group(),
        )
        metrics = holder[0]
    assert metrics is not None
    return metrics


def sft_step(
    model_chunks: list[torch.nn.Module],
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    batch: PolicyBatch,
    ctx: StepContext,
    *,
    micro_batch_size: int,
    lr: float | None = None,
) -> dict[str, float]:
    """One optimizer step of token-mean NLL on the loss-masked tokens (supervised warm-up).

    With `lr`, the step uses that learning rate and leaves the schedule where it was.
    """
    for m in model_chunks:
        m.train()
    normalizer = _global_denominator(batch, "token-mean", None)
    split = _split(batch, ctx, micro_batch_size)

    def loss_fn(model: torch.nn.Module, mb: MicroBatch, hidden: torch.Tensor) -> LossOut:
        lp, _ = _token_logprobs(model, hidden, mb.labels, ctx, entropy=False)
        lp = mb.loss_rows(lp)
        nll_sum = -(lp * mb.mask_BT).sum()
        loss = nll_sum / normalizer.clamp(min=1).to(nll_sum.dtype)
        metrics = {
            "loss_sum": loss.detach().double(),
            "num_valid_tokens": mb.mask_BT.sum().double(),
        }
        return loss, _no_tokens(loss.device), metrics

    outputs = _run(model_chunks, split, loss_fn, forward_only=False)
    metrics = _sft_metrics(outputs)
    metrics.update(optimizer_step(model_chunks, optimizer, scheduler, lr))
    return metrics


def _sft_metrics(outputs: list[Outputs]) -> dict[str, float]:
    values = None
    if parallel_state.is_pipeline_last_stage():
        sums = _reduce_metric_sums(outputs, ["loss_sum", "num_valid_tokens"])
        values = torch.stack([sums["loss_sum"], sums["num_valid_tokens"]])
    values = _broadcast_from_last_stage(values, (2,), torch.float64).cpu()
    return {"sft/nll": float(values[0]), "num_valid_tokens": float(values[1])}
