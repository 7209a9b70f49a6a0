"""What a policy checkpoint holds, as the sharded state dict Megatron's dist checkpointing reads.

megatron/checkpoint.py writes and reads checkpoints; this module describes their content,
identically on save and load: the model chunks (each under its virtual pipeline rank), the
frozen KL reference under its own key prefix, the optimizer (whose torch-Adam per-parameter
'step' needs the fix-ups below to make a resume bit-exact), the LR scheduler, and each rank's
RNG states (``capture_rng_state`` / ``restore_rng_state``, also used on their own by
megatron/policy.py).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from dapo_megatron.megatron.model import unwrap_model
from dapo_megatron.megatron.optimizer import sub_optimizers

REFERENCE_PREFIX = "reference."
"""Key prefix of the KL reference model's tensors (distinct from the policy's)."""
DIST_OPTIMIZER_SHARDING = "dp_reshardable"
"""DistributedOptimizer format. ``fully_reshardable`` (TP/PP resharding of optimizer state)
fails to load with torch's Adam on Megatron-Core 0.16 (KeyError 'step', no Apex/TE)."""


# ----------------------------------------------------------------------------- RNG


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: Python, NumPy, torch (CPU and CUDA) and Megatron's tracker.

    Megatron's tracker holds the per-TP-rank stream used for weight init and dropout
    (``model_parallel_cuda_manual_seed``); on CPU it lives in the default generator (see
    cpu_compat). Tensors are cloned: the result does not change when training goes on.
    """
    tracker = tensor_parallel.get_cuda_rng_tracker()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": {name: s.clone() for name, s in tracker.get_states().items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng_state`` (on the same rank of the same layout)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(
        {name: s.clone() for name, s in state["tracker"].items()}
    )


# ------------------------------------------------------------------- state dicts


def current_layout() -> dict[str, int]:
    return {
        "tp": parallel_state.get_tensor_model_parallel_world_size(),
        "pp": parallel_state.get_pipeline_model_parallel_world_size(),
        "cp": parallel_state.get_context_parallel_world_size(),
        "dp": parallel_state.get_data_parallel_world_size(),
        "world_size": dist.get_world_size(),
    }


def is_distributed_optimizer(optimizer: MegatronOptimizer) -> bool:
    return any(isinstance(o, DistributedOptimizer) for o in sub_optimizers(optimizer))


@contextlib.contextmanager
def virtual_pipeline_rank(index: int, chunks: int) -> Iterator[None]:
    """With interleaved PP, layer numbering of a chunk depends on the virtual rank."""
    if chunks == 1:
        yield
        return
    previous = parallel_state.get_virtual_pipeline_model_parallel_rank()
    parallel_state.set_virtual_pipeline_model_parallel_rank(index)
    try:
        yield
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_rank(previous)


def model_keys(model: Sequence[torch.nn.Module]) -> list[str]:
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def _gpt(module: torch.nn.Module) -> Any:
    """The GPTModel inside a wrapped chunk, typed Any: nn.Module does not declare Megatron's
    sharded_state_dict."""
    return unwrap_model(module)


def _rng_sharded_object(state: dict[str, Any] | None) -> ShardedObject:
    """Each rank's RNG states as one element of a world-sized array of objects."""
    return ShardedObject(
        "rng_state", state, (dist.get_world_size(),), (dist.get_rank(),), replica_id=0
    )


def sharded_state_dict(
    model: Sequence[torch.nn.Module],
    optimizer: MegatronOptimizer | None,
    scheduler: OptimizerParamScheduler | None,
    *,
    is_loading: bool,
    with_rng: bool,
    reference: torch.nn.Module | None = None,
) -> dict[str, Any]:
    """The state dict that dist_checkpointing saves, or fills on load."""
    # Megatron's modules and optimizers read their options from this dict; it is the same
    # on save and load so that both sides describe the same sharded keys.
    metadata = {
        "distrib_optim_sharding_type": DIST_OPTIMIZER_SHARDING,
        "chained_optim_avoid_prefix": True,
        "singleton_local_shards": False,
    }
    state: dict[str, Any] = {}
    for index, (key, chunk) in enumerate(zip(model_keys(model), model, strict=True)):
        with virtual_pipeline_rank(index, len(model)):
            state[key] = _gpt(chunk).sharded_state_dict(metadata=metadata)
    if reference is not None:
        state["reference"] = _gpt(reference).sharded_state_dict(
            prefix=REFERENCE_PREFIX, metadata=metadata
        )
    if optimizer is not None:
        _init_optimizer_state(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(
            state, is_loading=is_loading, metadata=metadata
        )
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if with_rng:
        state["rng_state"] = _rng_sharded_object(None if is_loading else capture_rng_state())
    return state


def _init_optimizer_state(optimizer: MegatronOptimizer) -> None:
    """Give every parameter without optimizer state a fresh one: zero moments, step 0.

    Megatron describes the optimizer's checkpoint from its current state. Before the first
    step torch's Adam has none: the DistributedOptimizer then fails on save and load (it
    reads a per-parameter 'step' that Megatron's ``init_state_fn`` does not create, torch
    Adam without Apex/TE), and the plain optimizer saves no moments that a load could ask
    for. Zero moments at step 0 are exactly what Adam's first step would create, so this
    changes no result.
    """
    for sub in sub_optimizers(optimizer):
        inner = getattr(sub, "optimizer", None)
        if inner is None or sub.init_state_fn is None:
            continue
        sub.init_state_fn(inner, sub.config)
        _give_each_param_a_step(inner, None)


def _is_torch_adam(inner: Any) -> bool:
    """torch's Adam/AdamW keep 'step' per parameter (Apex/TE FusedAdam: per param group)."""
    return isinstance(inner, torch.optim.Adam | torch.optim.AdamW)


def _give_each_param_a_step(inner: Any, step: float | None) -> None:
    """Set each torch-Adam parameter state's 'step' to its own tensor: ``step``, or 0 where
    it has none. Other optimizers are left alone."""
    if not _is_torch_adam(inner):
        return
    for group in inner.param_groups:
        for param in group["params"]:
            param_state = inner.state.get(param)
            if not param_state or (step is None and "step" in param_state):
                continue
            old = param_state.get("step")
            # Same dtype/device as torch keeps it (CPU unless capturable/fused).
            like = old if isinstance(old, torch.Tensor) else torch.tensor(0.0)
            param_state["step"] = torch.full_like(like, float(step or 0.0))


def saved_adam_steps(optimizer: MegatronOptimizer, loaded: Any) -> list[float | None]:
    """Per sub-optimizer: the step count a DistributedOptimizer saved, else None.

    Also completes the plain optimizers' loaded state for a checkpoint taken before the
    first step: Megatron saves their shared Adam step as 'common_step' only when it is
    non-zero, and torch's Adam refuses to load a state without one.
    """
    subs = sub_optimizers(optimizer)
    if len(subs) == 1:
        per_sub = [loaded]
    else:
        per_sub = [loaded[k] for k in sorted(loaded)] if isinstance(loaded, dict) else loaded
    steps: list[float | None] = []
    for sub, sub_state in zip(subs, per_sub, strict=True):
        step = None
        if isinstance(sub, DistributedOptimizer):
            groups = sub_state["optimizer"]["param_groups"]
            found = {g["step"] for g in groups if g.get("step") is not None}
            if len(found) > 1:
                raise ValueError(f"checkpoint has different optimizer steps per group: {found}")
            step = found.pop() if found else None
        elif _is_torch_adam(getattr(sub, "optimizer", None)):
            # FP32Optimizer saves torch's state dict; the mixed-precision one nests it.
            torch_state = sub_state if "param_groups" in sub_state else sub_state["optimizer"]
            per_param = torch_state["state"]
            if "common_step" not in per_param and any("step" not in v for v in per_param.values()):
                per_param["common_step"] = torch.tensor(0.0, dtype=torch.float32)
        steps.append(step)
    return steps


def restore_adam_steps(optimizer: MegatronOptimizer, steps: list[float | None]) -> None:
    """Give torch Adam's per-parameter 'step' its saved value, one tensor per parameter.

    DistributedOptimizer.load_state_dict (torch Adam, no Apex/TE) puts ONE step tensor into
    every parameter's state, which Adam would then increment once per parameter on each
    step, and the dp_reshardable loader overwrites it with the pre-load value (the step is
    a non-persistent local object in that format). Adam's bias correction reads the step,
    so a resume is bit-exact only with the saved value restored per parameter. The plain
    optimizer restores its steps itself, except for a checkpoint taken before the first
    step (no step saved): those states get step 0, like a fresh Adam state.
    """
    for sub, step in zip(sub_optimizers(optimizer), steps, strict=True):
        inner = getattr(sub, "optimizer", None)
        if inner is not None:
            _give_each_param_a_step(inner, step)
