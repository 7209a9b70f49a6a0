"""Start and stop torch.distributed plus Megatron's model-parallel state for one policy rank.

One process per rank (a Ray actor or a spawned test process) calls
``initialize_parallel(dims, seed=...)`` once before building the model and
``destroy_parallel()`` when done. The rank and world come from the usual launcher
variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK picks the GPU). The
backend is nccl on GPU and gloo on CPU, where the CPU compatibility layer is applied first.
"""

from __future__ import annotations

import os
import random
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.megatron.cpu_compat import apply_cpu_compat
from dapo_megatron.megatron.gloo_device import one_gloo_device


def initialize_parallel(dims: ParallelDims, *, seed: int, backend: str | None = None) -> None:
    """Initialise torch.distributed, Megatron's TP/PP/CP/DP/EP groups and all RNG seeds.

    Args:
        dims: the validated layout; ``dims.world_size`` must equal WORLD_SIZE.
        seed: base seed. Python, NumPy, torch and Megatron's RNG tracker (which derives
            its per-TP-rank stream from it) get ``seed + 100 * pp_rank``, as in
            Megatron-LM: stages hold different layers, so they should not share a stream;
            TP and DP ranks must, so that weights initialised on CPU are identical across
            them.
        backend: torch.distributed backend; default nccl with CUDA, gloo without.

    Raises:
        ValueError: WORLD_SIZE disagrees with ``dims``, or a launcher variable is missing.
    """
    apply_cpu_compat()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if dims.world_size != world_size:
        raise ValueError(
            f"parallel layout tp={dims.tp} x pp={dims.pp} x cp={dims.cp} x dp={dims.dp} needs "
            f"{dims.world_size} processes, but WORLD_SIZE={world_size}; launch "
            f"{dims.world_size} ranks or change the layout"
        )
    if dist.is_initialized() and dist.get_world_size() != world_size:
        raise ValueError(
            f"torch.distributed is already initialised with world size "
            f"{dist.get_world_size()}, but WORLD_SIZE={world_size}"
        )
    # Megatron's ~20 groups (all gloo on CPU, its gloo DP copies on GPU) share one gloo
    # device: one polling thread per rank instead of one per group (gloo_device.py).
    with one_gloo_device():
        if not dist.is_initialized():
            _init_process_group(rank, world_size, backend)
        parallel_state.initialize_model_parallel(
            # Megatron's groups time out like the default group: a stuck peer fails the
            # collective (the controller names the rank) instead of hanging the run.
            distributed_timeout_minutes=collective_timeout().total_seconds() / 60,
            tensor_model_parallel_size=dims.tp,
            pipeline_model_parallel_size=dims.pp,
            context_parallel_size=dims.cp,
            # The expert grid (MoE): EP ranks from the DP x CP ranks of a stage, expert TP
            # = TP; a dense model has ep 1 and its expert groups are never used.
            expert_model_parallel_size=dims.ep,
            expert_tensor_parallel_size=dims.tp,
        )
    stage_seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(stage_seed)
    np.random.seed(stage_seed)
    torch.manual_seed(stage_seed)
    # Megatron's layers fork the tracker's 'model-parallel-rng' state during init and for
    # dropout, so the tracker must be seeded even when nothing is parallel.
    model_parallel_cuda_manual_seed(stage_seed)


def collective_timeout() -> timedelta:
    """How long a collective waits for a peer: ``run.collective_timeout_s``, which a policy
    worker passes as DAPO_COLLECTIVE_TIMEOUT_S with the launcher variables (default: 30
    minutes, torch's and Megatron's own)."""
    return timedelta(seconds=float(os.environ.get("DAPO_COLLECTIVE_TIMEOUT_S", "1800")))


def _init_process_group(rank: int, world_size: int, backend: str | None) -> None:
    cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world_size == 1 and not {"MASTER_ADDR", "MASTER_PORT"} <= os.environ.keys():
        # A single rank needs no rendezvous: an in-memory store avoids picking a port.
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=collective_timeout()
        )
        return
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK") if k not in os.environ]
    if missing:
        raise ValueError(
            f"WORLD_SIZE={world_size} needs the launcher variables {', '.join(missing)}"
        )
    dist.init_process_group(
        backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=collective_timeout(),
    )


def destroy_parallel() -> None:
    """Tear down Megatron's parallel state and the default process group (idempotent)."""
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def parallel_ranks() -> dict[str, int]:
    """This process's rank in each of Megatron's parallel groups (after
    ``initialize_parallel``), as a policy worker reports its layout to the controller."""
    return {
        "dp_rank": parallel_state.get_data_parallel_rank(),
        "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
        "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
        "cp_rank": parallel_state.get_context_parallel_rank(),
        "ep_rank": parallel_state.get_expert_model_parallel_rank(),
    }
