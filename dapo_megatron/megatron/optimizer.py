"""Megatron DDP wrapping, optimizer and learning-rate schedule from the run config, and the
optimizer step of the policy's train and SFT steps (policy_step.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import ChainedOptimizer, MegatronOptimizer, get_megatron_optimizer
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer import TransformerConfig

from dapo_megatron.config.schema_policy import OptimizerConfig, SchedulerConfig
from dapo_megatron.device import collectives
from dapo_megatron.megatron.packed_batches import compute_device

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def wrap_ddp(
    model: torch.nn.Module, config: TransformerConfig, *, use_distributed_optimizer: bool
) -> DistributedDataParallel:
    """Wrap one model chunk in Megatron's DDP (contiguous grad buffers, fp32 grad reduction).

    Gradients are reduced in fp32 so that summing many micro-batch contributions in bf16 does
    not lose the small per-token terms of the token-mean loss.
    """
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    return DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)


def build_optimizer(
    model_chunks: list[DistributedDataParallel],
    cfg: OptimizerConfig,
    *,
    precision: str,
    use_distributed_optimizer: bool,
) -> MegatronOptimizer:
    """Megatron optimizer (fp32 master weights for bf16/fp16) with global-norm grad clipping."""
    megatron_cfg = MegatronOptimizerConfig(
        optimizer=cfg.name,
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        adam_eps=cfg.adam_eps,
        clip_grad=cfg.clip_grad,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        params_dtype=PRECISION_DTYPES[precision],
        use_distributed_optimizer=use_distributed_optimizer,
    )
    optimizer = get_megatron_optimizer(megatron_cfg, model_chunks)
    for sub in sub_optimizers(optimizer):
        # Megatron builds SGD without a state initialiser, yet calls it unconditionally
        # when describing a checkpoint to load (FP32Optimizer.sharded_state_dict): every
        # SGD resume failed with "'NoneType' object is not callable".
        if sub.init_state_fn is None and isinstance(
            getattr(sub, "optimizer", None), torch.optim.SGD
        ):
            sub.init_state_fn = init_sgd_state
    return optimizer


def sub_optimizers(optimizer: MegatronOptimizer) -> list[MegatronOptimizer]:
    """The optimizers a (possibly chained) Megatron optimizer is made of."""
    if isinstance(optimizer, ChainedOptimizer):
        return list(optimizer.chained_optimizers)
    return [optimizer]


def init_sgd_state(optimizer: torch.optim.SGD, config: object = None) -> None:
    """Zero momentum buffers for the parameters that have none (with momentum only).

    A checkpoint is described from the optimizer's current state, so a fresh optimizer must
    hold the buffers a saved one has. torch's first SGD step starts a buffer as a copy of
    the gradient; from a zero buffer it computes ``0 * momentum + (1 - dampening) * grad``,
    the same value with Megatron's dampening of 0, so this changes no result.
    """
    for group in optimizer.param_groups:
        if group["momentum"] == 0:
            continue
        for param in group["params"]:
            state = optimizer.state[param]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(
                    param, memory_format=torch.preserve_format
                )


def build_scheduler(
    optimizer: MegatronOptimizer,
    opt: OptimizerConfig,
    sched: SchedulerConfig,
    *,
    total_optimizer_steps: int,
    optimizer_steps_per_train_step: int = 1,
) -> OptimizerParamScheduler:
    """Linear warm-up then constant/linear/cosine decay, counted in schedule steps
    (sched.unit): optimizer steps, or trainer steps of `optimizer_steps_per_train_step`
    optimizer steps each (the caller advances it through a ScheduleClock)."""
    every = optimizer_steps_per_train_step if sched.unit == "train_step" else 1
    decay_steps = sched.lr_decay_steps or max(1, total_optimizer_steps // every)
    # Megatron requires warm-up < decay steps; a run shorter than its warm-up still gets a
    # well-defined schedule (warm-up is cut short) instead of an assertion error.
    decay_steps = max(decay_steps, sched.lr_warmup_steps + 1)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=sched.lr_warmup_init,
        max_lr=opt.lr,
        min_lr=opt.min_lr,
        lr_warmup_steps=sched.lr_warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=sched.lr_decay_style,
        start_wd=opt.weight_decay,
        end_wd=opt.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
    )


class ScheduleClock:
    """When an optimizer step advances the lr schedule: every one (unit optimizer_step),
    or the last of each trainer step's `every` optimizer steps (unit train_step), so the
    lr is the same for all of a trainer step's mini-batches, as verl's and NeMo RL's
    workers step their schedulers once per training call. A run resumes at a trainer-step
    boundary, so the count starts at zero in every process."""

    def __init__(self, unit: str, optimizer_steps_per_train_step: int) -> None:
        self.every = optimizer_steps_per_train_step if unit == "train_step" else 1
        self.done = 0

    def tick(self) -> bool:
        """Count one optimizer step; True when it is the one that advances the schedule."""
        self.done += 1
        return self.done % self.every == 0


def grads_are_finite(model_chunks: list[torch.nn.Module]) -> bool:
    """True when every rank's gradients are finite (a non-finite step must be skipped).

    One device-side flag over all gradients, one all-reduce, one read-back per step (a
    per-parameter ``isfinite(...).all()`` test would read back once per parameter). The
    flag is built from each gradient's max-norm, ``max |g|``, computed by one multi-tensor
    ``_foreach_norm``: it is NaN or inf exactly when the gradient holds a NaN or an inf, and
    unlike a 2-norm it cannot overflow on finite values.
    """
    grads = []
    for chunk in model_chunks:
        for p in chunk.parameters():
            grad = getattr(p, "main_grad", None)
            if grad is None:
                grad = p.grad
            if grad is not None and grad.numel() > 0:
                grads.append(grad.detach())
    bad = torch.zeros(1, device=grads[0].device if grads else compute_device())
    if grads:
        norms = torch._foreach_norm(grads, float("inf"))
        finite = torch.stack([n.float().to(bad.device) for n in norms]).isfinite().all()
        bad = (~finite).float().reshape(1)
    if dist.is_initialized() and dist.get_world_size() > 1:
        collectives.all_reduce(bad, op=collectives.MAX)
    return bool(bad.item() == 0)


def optimizer_step(
    model_chunks: list[DistributedDataParallel],
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    lr: float | None = None,
    advance: bool = True,
) -> dict[str, float]:
    """Reduce grads, skip a non-finite step, else step (at `lr` when given, outside the
    schedule: the schedule neither advances nor keeps the override). `advance` False holds
    the schedule's lr for the next step (policy.scheduler.unit train_step)."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model_chunks)
    finite = grads_are_finite(model_chunks)
    grad_norm = float("nan")
    used_lr = lr if lr is not None else optimizer.param_groups[0]["lr"]
    if finite:
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        _, grad_norm, _ = optimizer.step()
        # 0: restore the schedule's lr (after an override) or hold it (mid trainer step)
        scheduler.step(increment=1 if lr is None and advance else 0)
    for chunk in model_chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    return {
        "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
        "lr": used_lr,
        "skipped_nonfinite_step": 0.0 if finite else 1.0,
    }
