"""Trace one policy rank of a recipe: the real Megatron step on a fake CUDA device.

The rank is built and stepped by the code a policy worker runs on a GPU
(``MegatronPolicy``: the model provider and layer spec, Megatron DDP, the distributed
optimizer, the pipeline schedule, packed micro-batches of ``max_tokens_per_microbatch``,
recompute, the fused logprob head), with every device tensor fake (device.py), the other
ranks of the recipe's world a fake process group (collectives return at once), and the
Transformer Engine / flash kernels of the GPU spec replaced by stand-ins that save and
allocate what those kernels do (kernels.py). ``StorageCensus`` counts the device bytes.

Phases: ``train`` (one optimizer step of one mini-batch share: the schedule's forward and
backward over its micro-batches, the grad reduce, the optimizer step; traced after a first
step created Adam's states, as in every step but a run's first), ``logprob`` (the
forward-only pass over the same micro-batches) and ``export`` (the refit's gathers of every
HF tensor, without the transport's buckets). The generation phase (vLLM) is not traced.

Run as ``python -m dapo_megatron.megatron.fake_trace SPEC_JSON OUT_JSON`` in a process
started with the shim LD_PRELOADed (planning/trace/launch.py does this and reads OUT_JSON).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dapo_megatron.megatron.fake_trace.census import ACTIVATIONS, StorageCensus
from dapo_megatron.megatron.fake_trace.device import fake_cuda, patched
from dapo_megatron.planning.step_time import TracedRank
from dapo_megatron.planning.trace.op_cost import OpCostMode
from dapo_megatron.shared.batch import PolicyBatch


@dataclass(frozen=True)
class TraceSpec:
    """What to trace: one rank of a recipe."""

    recipe: str
    """Recipe path."""
    overrides: tuple[str, ...]
    """``a.b=c`` overrides applied to the recipe."""
    rank: int
    """Global rank of the traced role in the recipe's policy world."""
    micro_batches: int
    """Packed micro-batches per traced mini-batch share (>= the in-flight count)."""
    gpu_bytes: int
    """What the fake device reports as its memory."""
    real: bool = False
    """Real host tensors in place of fake ones, on the same code path: the check of the
    tracer against a real run (tests/distributed/test_fake_trace.py)."""


def _fake_process_group(rank: int, world_size: int) -> contextlib.AbstractContextManager[None]:
    """The recipe's world as a fake process group: every group Megatron creates (its NCCL
    groups and their gloo copies) is a fake group of the same members."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    original = dist.new_group

    def new_group(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("pg_options", None)
        kwargs["backend"] = "fake"
        return original(*args, **kwargs)

    return patched(dist, {"new_group": new_group})


@contextlib.contextmanager
def _uncoalesced() -> Iterator[None]:
    """Megatron's grad reduce-scatter runs its buckets under ``_coalescing_manager``, whose
    coalesced collective has no fake kernel; each bucket's collective alone allocates the
    same (nothing: they are in place)."""
    from megatron.core.distributed import param_and_grad_buffer

    class _Handle:
        def wait(self) -> None: ...

    @contextlib.contextmanager
    def manager(*_a: Any, **_k: Any) -> Iterator[_Handle]:
        yield _Handle()

    with patched(param_and_grad_buffer, {"_coalescing_manager": manager}):
        yield


def _object_broadcast_stand_in(object_list: list[Any], src: int = 0, group: Any = None) -> None:
    """A fake group delivers nothing: a receiving stage gets an empty metrics dict where
    the last stage's would arrive (host objects: no device bytes either way)."""
    if dist.get_rank() != src:
        object_list[:] = [{} if o is None else o for o in object_list]


@contextlib.contextmanager
def _batch_labelled(census: StorageCensus) -> Iterator[None]:
    """What a pass makes while it packs the batch into micro-batches counts as "batch":
    on a GPU, the micro-batches' few [1, n] tensors; in the real host run, also the
    packing's host temporaries (which the fake run does not count)."""
    from dapo_megatron.megatron import policy_step

    def labelled(original: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            census.label = "batch"
            try:
                return original(*args, **kwargs)
            finally:
                census.label = ACTIVATIONS

        return run

    # The packing, and the loss normaliser read from the batch (host work, then moved).
    names = ("_split", "_global_denominator")
    with patched(policy_step, {n: labelled(getattr(policy_step, n)) for n in names}):
        yield


def synthetic_batch(rows: int, row_len: int, vocab: int, *, seed: int = 0) -> PolicyBatch:
    """``rows`` full-length rows (the packing worst case: every pack at its budget), with
    old logprobs (the step's ratio base) and per-sample advantages; host tensors, as a
    worker receives them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, row_len), generator=g)
    mask = torch.ones(rows, row_len)
    mask[:, 0] = 0
    return PolicyBatch(
        input_ids=ids,
        loss_mask=mask,
        advantages=torch.randn(rows, generator=g),
        old_logprobs=-torch.rand(rows, row_len, generator=g),
        lengths=torch.full((rows,), row_len, dtype=torch.long),
    )


def _label_resident(census: StorageCensus, policy: Any) -> dict[str, int]:
    """Label what a rank keeps between phases by its owner; returns bytes per label."""
    from dapo_megatron.megatron.optimizer import sub_optimizers

    for chunk in policy.model:
        census.relabel(chunk.parameters(), "weights")
        # Megatron DDP's contiguous buffers (distributed_data_parallel.py): the params are
        # views of param_data, their main_grad views of grad_data.
        for buffer in chunk.buffers + chunk.expert_parallel_buffers:
            census.relabel([buffer.grad_data], "grads")
            if buffer.param_data is not None:
                census.relabel([buffer.param_data], "weights")
    reference = getattr(policy, "_reference", None)
    if reference is not None:
        census.relabel(reference.parameters(), "reference")
    for opt in sub_optimizers(policy.optimizer):
        # DistributedOptimizer's shards, or Float16OptimizerWithFloat16Params' full copies.
        for name in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups"):
            for group in getattr(opt, name, None) or []:
                census.relabel(group, "master")
        inner = getattr(opt, "optimizer", None)
        for state in getattr(inner, "state", {}).values():
            census.relabel(
                (v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0),
                "optimizer",
            )
    return dict(census.by_label)


def _phase(census: StorageCensus, resident: dict[str, int], wall: float) -> dict[str, Any]:
    at_peak = {k: v for k, v in census.at_peak.items() if v}
    return {
        "peak_bytes": census.peak,
        "categories": at_peak,
        "resident_bytes": resident,
        "trace_s": round(time.perf_counter() - wall, 2),
    }


def trace_rank(spec: TraceSpec) -> dict[str, Any]:
    """Build the rank, run the train step twice and the logprob pass; bytes per phase."""
    from dapo_megatron.config.loader import load_config
    from dapo_megatron.device import collectives
    from dapo_megatron.megatron.fake_trace import kernels
    from dapo_megatron.megatron.policy import MegatronPolicy

    started = time.perf_counter()
    run = load_config(spec.recipe, list(spec.overrides)).require_plan()
    plan = run.policy()
    dims = plan.dims
    os.environ.update(WORLD_SIZE=str(dims.world_size), RANK=str(spec.rank), LOCAL_RANK="0")
    policy_cfg = plan.config.policy
    budget = policy_cfg.max_tokens_per_microbatch
    row_len = policy_cfg.max_total_sequence_length
    if budget is not None:
        row_len = min(row_len, budget)
        rows_per_pack = max(1, budget // row_len)
    else:
        rows_per_pack = policy_cfg.train_micro_batch_size
    batch = synthetic_batch(
        spec.micro_batches * rows_per_pack, row_len, plan.arch.vocab_size, seed=spec.rank
    )
    result: dict[str, Any] = {"rank": spec.rank, "phases": {}}
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_cuda(spec.gpu_bytes, real=spec.real))
        for (module, name), value in kernels.install(real=spec.real).items():
            stack.enter_context(patched(module, {name: value}))
        stack.enter_context(_fake_process_group(spec.rank, dims.world_size))
        stack.enter_context(_uncoalesced())
        stack.enter_context(
            patched(collectives, {"broadcast_object_list": _object_broadcast_stand_in})
        )
        census = stack.enter_context(StorageCensus("cpu" if spec.real else "cuda"))
        stack.enter_context(_batch_labelled(census))
        census.label = "build"
        policy = MegatronPolicy(plan, load_weights=False)
        from megatron.core import parallel_state as ps

        result["role"] = {
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "cp_rank": ps.get_context_parallel_rank(),
            "ep_rank": ps.get_expert_model_parallel_rank(),
        }
        result["build_s"] = round(time.perf_counter() - started, 2)
        census.label = ACTIVATIONS
        policy.train_step(batch)  # creates Adam's states (every later step starts with them)
        resident = _label_resident(census, policy)
        census.reset_peak()
        wall = time.perf_counter()
        with OpCostMode() as train_ops:
            policy.train_step(batch)
        result["phases"]["train"] = _phase(census, resident, wall)
        census.reset_peak()
        wall = time.perf_counter()
        with OpCostMode() as logprob_ops:
            policy.logprobs(batch)
        result["phases"]["logprob"] = _phase(census, _label_resident(census, policy), wall)
        census.reset_peak()
        wall = time.perf_counter()
        # The refit's export: every HF tensor gathered whole, one at a time, and dropped
        # (the consumer's buckets are the refit transport's, not traced here).
        for _name, _tensor in policy.export_weights():
            del _tensor
        result["phases"]["export"] = _phase(census, _label_resident(census, policy), wall)
        tokens = int(batch.input_ids.numel())
        result["ops"] = TracedRank(
            stage=result["role"]["pp_rank"],
            forward_backward=train_ops.ops,
            train_tokens=tokens,
            optimizer=None,
            logprob=logprob_ops.ops,
            logprob_tokens=tokens,
        ).to_json()
    result["wall_s"] = round(time.perf_counter() - started, 2)
    return result
