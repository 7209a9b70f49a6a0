"""The controller's view of the policy: its Ray workers behind one call per operation.

Sharding contract (the same for every operation): a batch of B samples (or a list of
prompts) is cut into DP contiguous shards, as equal as possible; shard i goes to EVERY
worker whose data-parallel rank is i (the TP/PP/CP ranks of one replica receive the same
shard, as Megatron expects); results come from the first worker of each replica and are
concatenated in shard order. Training metrics are identical on all ranks; rank 0's are used.

A worker that dies makes the pending call raise WorkerFailure naming the rank and its
layout, without waiting for the survivors (they would block in a collective forever).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

import ray
import torch

from dapo_megatron.config.run_plan import RefitTransport, RunPlan
from dapo_megatron.controller.actors.cluster import RankResources, rank_resources, reserve_ranks
from dapo_megatron.controller.actors.placement import policy_placements
from dapo_megatron.controller.actors.remote import (
    WorkerDied,
    WorkerFailure,
    gather,
    settle_abandoned,
)
from dapo_megatron.data.pack_plan import balance_by_tokens
from dapo_megatron.refit.group import GroupAddress
from dapo_megatron.shared.batch import PolicyBatch
from dapo_megatron.shared.sampling import Sample, SamplingParams
from dapo_megatron.workers.policy_worker import PolicyWorker

__all__ = ["PolicyGroup", "WorkerDied", "WorkerFailure", "shard_bounds"]


MAX_CONNECTIONS_VAR = "CUDA_DEVICE_MAX_CONNECTIONS"


def policy_env_vars(plan: RunPlan) -> dict[str, str]:
    """Environment variables every policy actor starts with (Ray ``runtime_env``: set
    before the process exists, so before anything in it initialises CUDA, which reads them
    once at context creation).

    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` on CUDA with TP > 1: one hardware work queue per
    device, so kernels start in the order they are launched. Megatron's tensor-parallel
    linear layers launch the sequence-parallel reduce-scatter / all-gather (SP) or the
    input-gradient all-reduce (TP without SP) before the weight-gradient GEMM and rely on
    that order for the overlap (megatron-core 0.16.1 megatron/core/tensor_parallel/
    layers.py, ``LinearWithGradAccumulationAndAsyncCommunication`` comments and
    ``linear_with_grad_accumulation_and_async_allreduce``, which warns when the variable is
    not "1" with sequence_parallel or allreduce_dgrad, i.e. whenever TP > 1). Not set at
    TP 1 (no such overlap) nor on CPU. A value the controller's environment sets wins.
    """
    if plan.device != "cuda" or plan.dims.tp == 1:
        return {}
    return {MAX_CONNECTIONS_VAR: os.environ.get(MAX_CONNECTIONS_VAR, "1")}


def with_env_vars(options: dict[str, Any], env_vars: dict[str, str]) -> dict[str, Any]:
    """Ray actor options with ``env_vars`` added to their runtime_env (none: unchanged)."""
    if not env_vars:
        return options
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env_vars}
    return {**options, "runtime_env": runtime_env}


def shard_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of `parts` contiguous shards of `total` items, sizes differing by <= 1."""
    base, extra = divmod(total, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


class PolicyGroup:
    """All policy ranks of the run (one Ray actor each, in one placement group)."""

    def __init__(self, plan: RunPlan) -> None:
        """Start one actor per policy rank and set up torch.distributed + Megatron.

        Each rank asks Ray for ``plan.policy_device_share`` of its GPU (< 1 when a
        generation engine actor shares the rank's device, see cluster.rank_resources).
        """
        self.plan = plan
        self.config = plan.config
        world = plan.policy_world_size
        resources = rank_resources(
            plan.config.cluster, device=plan.device, device_share=plan.policy_device_share
        )
        # Rank r runs on the r-th bundle in (node, GPU id) order, not on bundle r (whose node
        # Ray does not tie to its index); policy_placements checks TP/CP groups share nodes.
        self.placement = reserve_ranks(world, resources)
        # Actor handles, typed Any: Ray actor method calls (``w.setup.remote(...)``) are
        # dynamic, with no static type; each call site annotates what the method returns.
        self.workers: list[Any] = []
        self.layouts: list[dict[str, int]] = [{"rank": r} for r in range(world)]
        try:
            self._start(plan, resources)
        except BaseException:
            # A start that failed (a rank died in setup, a layout refused) leaves no actor
            # and no placement group behind: the next attempt places on free resources.
            # A cleanup that fails itself must not hide why the start failed.
            with contextlib.suppress(Exception):
                self.shutdown()
            raise

    def _start(self, plan: RunPlan, resources: RankResources) -> None:
        """Start the actors on the reservation and set up torch.distributed + Megatron."""
        world = plan.policy_world_size
        placements = policy_placements(self.placement, plan, resources)
        actor = ray.remote(PolicyWorker)
        env_vars = policy_env_vars(plan)
        for rank, p in enumerate(placements):
            self.workers.append(
                actor.options(**with_env_vars(p.options, env_vars)).remote(
                    plan, rank=rank, world_size=world, num_threads=p.num_threads
                )
            )
        address: tuple[str, int] = self._gather([self.workers[0].address.remote()])[0]
        addr, port = address
        self.layouts = self._gather([w.setup.remote(addr, port) for w in self.workers])
        self.dp = 1 + max(layout["dp_rank"] for layout in self.layouts)
        # The first worker of each replica (lowest rank) answers for it.
        self.leaders = [
            min(r for r, layout in enumerate(self.layouts) if layout["dp_rank"] == dp)
            for dp in range(self.dp)
        ]

    # ----------------------------------------------------------------------------------
    # Calls

    def _describe(self, rank: int) -> str:
        layout = self.layouts[rank]
        parts = ", ".join(f"{k} {v}" for k, v in layout.items() if k != "rank")
        return f"policy rank {rank}" + (f" ({parts})" if parts else "")

    def _gather(self, refs: Sequence[ray.ObjectRef[Any]]) -> list[Any]:
        return gather(refs, self._describe)

    def _start_sharded(
        self, method: str, shards: Sequence[Any], *args: Any
    ) -> list[ray.ObjectRef[Any]]:
        """Start `method(shard_of_my_replica, *args)` on every worker; the pending refs."""
        return [
            getattr(w, method).remote(shards[self.layouts[r]["dp_rank"]], *args)
            for r, w in enumerate(self.workers)
        ]

    def _finish_sharded(self, refs: Sequence[ray.ObjectRef[Any]]) -> list[Any]:
        """The replica leaders' results of a ``_start_sharded`` call (waits for all ranks)."""
        results = self._gather(refs)
        return [results[leader] for leader in self.leaders]

    def _call_sharded(self, method: str, shards: Sequence[Any], *args: Any) -> list[Any]:
        """Call `method(shard_of_my_replica, *args)` on every worker; replica leaders' results."""
        return self._finish_sharded(self._start_sharded(method, shards, *args))

    def _shard_rows(self, batch: PolicyBatch) -> list[list[int]]:
        """Rows of each DP shard: dealt by tokens when micro-batches are packed (the ranks
        then finish together), else contiguous and equal in count."""
        if self.config.policy.max_tokens_per_microbatch is not None and batch.lengths is not None:
            return balance_by_tokens([int(n) for n in batch.lengths.tolist()], self.dp)
        return [list(range(a, b)) for a, b in shard_bounds(len(batch), self.dp)]

    def _batch_shards(
        self, batch: PolicyBatch, rows: list[list[int]] | None = None
    ) -> list[PolicyBatch]:
        """The DP shards of ``batch`` (``rows``: its ``_shard_rows``, when already known)."""
        rows = self._shard_rows(batch) if rows is None else rows
        return [batch.select(torch.tensor(r, dtype=torch.long)) for r in rows]

    @staticmethod
    def _unshard(rows: list[list[int]], parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-shard [b_i, S] results (shard i holds ``rows[i]``) back in batch row order."""
        order = torch.tensor([r for shard in rows for r in shard], dtype=torch.long)
        stacked = torch.cat(list(parts))
        out = torch.empty_like(stacked)
        out[order] = stacked
        return out

    # ----------------------------------------------------------------------------------
    # Operations

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        """Rollouts for every prompt (n samples each), prompts spread over DP replicas."""
        bounds = shard_bounds(len(prompts), self.dp)
        if sampling.max_tokens_per_prompt is not None:
            # Per-prompt caps travel with their prompts: one shard = (prompts, sampling).
            shards_with: list[Any] = [
                (list(prompts[a:b]), sampling.for_prompts(a, b)) for a, b in bounds
            ]
            parts = self._call_sharded("generate_with", shards_with)
        else:
            shards = [list(prompts[a:b]) for a, b in bounds]
            parts = self._call_sharded("generate", shards, sampling)
        return [group for part in parts for group in part]

    def logprobs(
        self, batch: PolicyBatch, *, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token-aligned logprobs (and entropies) [B, S] of the whole batch."""
        rows = self._shard_rows(batch)
        parts: list[tuple[torch.Tensor, torch.Tensor | None]] = self._call_sharded(
            "logprobs", self._batch_shards(batch, rows), compute_entropy
        )
        lp = self._unshard(rows, [p[0] for p in parts])
        if not compute_entropy:
            return lp, None
        entropies = [p[1] for p in parts]
        present = [e for e in entropies if e is not None]
        if len(present) != len(entropies):
            raise RuntimeError("a policy worker returned no entropies when asked for them")
        return lp, self._unshard(rows, present)

    def ref_logprobs(self, batch: PolicyBatch) -> torch.Tensor:
        """Token-aligned logprobs [B, S] of the whole batch under the frozen KL reference
        (the policy's weights at the start of DAPO training, kept on every rank)."""
        rows = self._shard_rows(batch)
        shards = self._batch_shards(batch, rows)
        parts: list[torch.Tensor] = self._call_sharded("ref_logprobs", shards)
        return self._unshard(rows, parts)

    def submit_train_step(self, mini_batch: PolicyBatch) -> list[ray.ObjectRef[Any]]:
        """Start ``train_step`` without waiting: it runs on each rank after the calls
        already submitted to it (Ray runs one submitter's calls to an actor in order), so a
        step can be queued behind a refit's send; ``train_step_result`` collects it."""
        return self._start_sharded("train_step", self._batch_shards(mini_batch))

    def train_step_result(self, refs: Sequence[ray.ObjectRef[Any]]) -> dict[str, float]:
        """The metrics of a submitted train step (rank 0's; identical on every rank)."""
        metrics: dict[str, float] = self._finish_sharded(refs)[0]
        return metrics

    def sft_step(self, batch: PolicyBatch, *, lr: float | None = None) -> dict[str, float]:
        metrics: dict[str, float] = self._call_sharded("sft_step", self._batch_shards(batch), lr)[0]
        return metrics

    def refit(self) -> float:
        """Update the generation engines with the trained weights; returns seconds."""
        start = time.perf_counter()
        self._gather([w.refit.remote() for w in self.workers])
        return time.perf_counter() - start

    def export_weights(self) -> ray.ObjectRef[Any]:
        """The trained weights as full HF-named tensors, stored once in Ray's object store.

        Every rank takes part in the export (TP gathers, PP broadcasts); rank 0 keeps the
        CPU copies and puts them in the object store, so each engine fetches them from
        there. The ``object_store`` refit fallback only: the default transports stream
        buckets instead (``submit_send_weights``, controller/actors/refitter.py).
        """
        # Rank 0 returns ``[ref]`` (wrapped so Ray does not resolve it), the others None.
        exported: list[list[ray.ObjectRef[Any]] | None] = self._gather(
            [w.export_weights.remote() for w in self.workers]
        )
        first = exported[0]
        if first is None:
            raise RuntimeError("policy rank 0 exported no weights")
        return first[0]

    # The policy's half of the refit and of the colocated memory release: each starts the
    # call on every rank and returns the pending refs in rank order, for the caller to
    # gather together with the engines' calls (controller/actors/refitter.py).

    def submit_join_weight_group(
        self, address: GroupAddress, transport: RefitTransport
    ) -> list[ray.ObjectRef[Any]]:
        return [w.join_weight_group.remote(address, transport) for w in self.workers]

    def submit_share_buffer(
        self, layout_wire: list[Any], exporters: int
    ) -> list[ray.ObjectRef[Any]]:
        return [w.share_buffer.remote(layout_wire, exporters) for w in self.workers]

    def submit_unlink_shared_buffer(self) -> list[ray.ObjectRef[Any]]:
        return [w.unlink_shared_buffer.remote() for w in self.workers]

    def submit_send_weights(self, layout_wire: list[Any]) -> list[ray.ObjectRef[Any]]:
        return [w.send_weights.remote(layout_wire) for w in self.workers]

    def submit_release_memory(self) -> list[ray.ObjectRef[Any]]:
        return [w.release_memory.remote() for w in self.workers]

    def describe(self, rank: int) -> str:
        """How errors name a rank ("policy rank 1 (dp_rank 1, ...)")."""
        return self._describe(rank)

    def export_hf(self, out_dir: str) -> str:
        """The current weights as a Hugging Face checkpoint in ``out_dir`` (rank 0 writes)."""
        written: list[str] = self._gather([w.export_hf.remote(out_dir) for w in self.workers])
        return written[0]

    def device_ids(self) -> list[str]:
        """Each rank's accelerator ids as Ray assigned them (empty strings on CPU)."""
        ids: list[str] = self._gather([w.device_ids.remote() for w in self.workers])
        return ids

    def save(self, directory: str, step: int, extra_state: dict[str, Any]) -> str:
        paths: list[str] = self._gather(
            [w.save.remote(directory, step, extra_state) for w in self.workers]
        )
        return paths[0]

    def load(self, path: str) -> dict[str, Any]:
        states: list[dict[str, Any]] = self._gather([w.load.remote(path) for w in self.workers])
        return states[0]

    def worker_pids(self) -> list[int]:
        pids: list[int] = self._gather([w.pid.remote() for w in self.workers])
        return pids

    def shutdown(self) -> None:
        """Kill the workers and release their resources (also after a failure): their
        placement group is removed and Ray reports it REMOVED before this returns."""
        try:
            for worker in self.workers:
                with contextlib.suppress(Exception):  # dead already, its node gone
                    ray.kill(worker, no_restart=True)
            settle_abandoned()  # their calls a failure left uncollected end now
        finally:
            self.placement.remove()
