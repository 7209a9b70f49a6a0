"""The controller's view of the rollout engines: generate, refit, sleep and wake.

Three placements, chosen from the run plan by ``build_engines``:

* colocated, megatron backend (``PolicyEngines``): the policy ranks generate on their own
  model, so there is no separate engine and a refit copies nothing;
* colocated, vllm backend (``GenerationGroup`` on the policy's bundles, GPU only): one
  engine actor per ``engine.tensor_parallel_size`` policy ranks shares their devices; it
  sleeps (weights offloaded, KV cache freed) while the policy trains and wakes for the
  refit;
* split mode (``GenerationGroup`` with a placement group of its own): engines on
  ``cluster.generation_num_devices`` devices, refitted after every step.

Refit of separate engines (``generation.refit_transport``): ``broadcast`` forms one
weight-update group of policy rank 0 and every engine worker (all TP ranks of every engine)
and streams the weights in buckets (``dapo_megatron.weight_sync``; NCCL on GPU, gloo on CPU);
``ipc`` (colocated GPU default) shares each policy rank's bucket buffer with the engine
workers paired with it (CUDA IPC on GPU, shared memory on CPU) with the same bucket plan;
``object_store`` is the fallback (the whole model through Ray's object store). Engines are
never woken with their stale weights before a refit: only their weight memory is mapped
back, and the KV cache returns with the next generate call.

Sharding contract of ``GenerationGroup.generate``: prompts are cut into contiguous,
near-equal shards, one per engine; results are concatenated in prompt order. Each engine
draws with its own seed derived from the call's seed, so engines never share random
streams and a step's samples depend only on (seed, step, round, layout).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

import ray
from ray.util.placement_group import remove_placement_group

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.placement import (
    colocated_engine_placements,
    split_engine_placements,
)
from dapo_megatron.controller.policy_group import PolicyGroup, shard_bounds
from dapo_megatron.controller.remote import WorkerDied, WorkerFailure, first_line, gather
from dapo_megatron.shared.sampling import Sample, SamplingParams
from dapo_megatron.weight_sync.group import GroupAddress, backend_for
from dapo_megatron.workers.generation_worker import VLLM_DTYPES, GenerationWorker

# A weight-group collective that waits longer than this fails the refit instead of hanging
# (a dead member is normally noticed at once through its Ray actor).
WEIGHT_GROUP_TIMEOUT_S = 600.0
# How long a failed refit waits for the other members' outcome, to tell a dead member (the
# cause: restart) from a member that merely saw the broken connection.
REFIT_DEATH_GRACE_S = 30.0


class Engines(Protocol):
    """What the loop needs of the rollout engines, whatever their placement."""

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[list[Sample]]: ...

    def refit(self, policy: PolicyGroup) -> float:
        """Give the engines the policy's current weights (waking them); returns seconds."""
        ...

    def sleep(self) -> None:
        """Release engine memory while the policy trains (colocated engines)."""
        ...

    def refit_metrics(self) -> dict[str, float]:
        """Refit counters of the engines (``refit/engine_*``: bytes received and loads per
        path), CUMULATIVE over the engines' lifetime, for the step's metrics (empty when
        nothing moved)."""
        ...

    def shutdown(self) -> None: ...


def engine_seed(seed: int | None, engine: int) -> int | None:
    """The sampling seed of one engine for a call seeded ``seed`` (None stays None)."""
    if seed is None:
        return None
    return (seed * 1_000_033 + engine * 15_485_863) % (2**31 - 1)


class PolicyEngines:
    """Colocated Megatron generation: the policy's DP replicas are the engines."""

    def __init__(self, policy: PolicyGroup) -> None:
        self.policy = policy

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        return self.policy.generate(prompts, sampling)

    def refit(self, policy: PolicyGroup) -> float:
        return policy.refit()

    def sleep(self) -> None:
        """Nothing to release: KV caches live only inside a generate call."""

    def refit_metrics(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        """The policy group owns the engines."""


class PendingRefit:
    """A weight transfer submitted to the policy ranks and the engines
    (``GenerationGroup.start_refit``); ``finish`` waits for it."""

    def __init__(
        self,
        group: GenerationGroup,
        policy: PolicyGroup,
        refs: list[ray.ObjectRef[Any]],
        senders: int,
        started: float,
    ) -> None:
        self._group = group
        self._policy = policy
        self._refs = refs
        self._senders = senders  # the first refs are the policy ranks' sends
        self._started = started

    def finish(self) -> float:
        """Wait for the transfer; the policy's seconds in it: rank 0's own time sending
        (the controller's wait may hold a queued train step), or, for the object-store
        fallback, the controller's."""
        if self._senders:
            results = self._group._gather_refit(self._policy, self._refs)
        else:
            results = self._group._gather(self._refs)
        counts: list[dict[str, int]] = results[self._senders :]  # cumulative, per engine
        self._group._refit_metrics = {
            "refit/engine_bytes_received": float(sum(c["bytes_received"] for c in counts)),
            "refit/engine_collective_loads": float(sum(c["collective"] for c in counts)),
            "refit/engine_object_store_loads": float(sum(c["object_store"] for c in counts)),
        }
        sent = [r["seconds"] for r in results[: self._senders] if r and "seconds" in r]
        return max(sent) if sent else time.perf_counter() - self._started


class GenerationGroup:
    """Engine actors: in a placement group of their own (split), or on the policy's."""

    def __init__(self, plan: RunPlan, policy: PolicyGroup) -> None:
        self.plan = plan
        self.config = config = plan.config
        count = plan.num_engines
        tp = config.generation.engine.tensor_parallel_size
        self.placement = None
        if config.cluster.colocated:
            # Validation rejects a colocated engine on CPU (config/validate.py).
            places = colocated_engine_placements(policy.placement, policy.device_ids(), count, tp)
        else:
            self.placement, places = split_engine_placements(
                config.cluster, count, tp, device=plan.device
            )
        actor = ray.remote(GenerationWorker)
        # Actor handles, typed Any: Ray actor method calls (``w.setup.remote()``) are
        # dynamic, with no static type; each call site annotates what the method returns.
        self.workers: list[Any] = [
            actor.options(**p.options).remote(
                plan, engine_index=e, num_threads=p.num_threads, visible_devices=p.visible_devices
            )
            for e, p in enumerate(places)
        ]
        self.info: list[dict[str, Any]] = self._gather([w.setup.remote() for w in self.workers])
        self._asleep = False
        # Colocated: the policy whose GPUs the engines share; it returns its cached CUDA
        # blocks before any engine maps memory back (``_release_policy``).
        self._colocated_policy = policy if config.cluster.colocated else None
        self.transport = plan.refit_transport
        self._plan: list[Any] | None = None  # RefitPlan.to_wire(): plain lists for Ray
        self._group_policy: PolicyGroup | None = None
        self._refit_metrics: dict[str, float] = {}

    def _describe(self, index: int) -> str:
        return f"generation engine {index} ({self.config.generation.backend})"

    def _gather(self, refs: Sequence[ray.ObjectRef[Any]]) -> list[Any]:
        return gather(refs, self._describe)

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        """n samples per prompt, prompts spread over the engines (module docstring)."""
        return self.results(self.submit(prompts, sampling))

    def submit(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[ray.ObjectRef[Any]]:
        """Start ``generate`` without waiting: one pending call per engine that has prompts,
        in engine order (``results`` collects them). Calls from one submitter run in the
        order submitted on each engine actor (Ray's actor task ordering)."""
        self.wake()
        bounds = shard_bounds(len(prompts), len(self.workers))
        return [
            w.generate_timed.remote(
                [list(p) for p in prompts[a:b]],
                dataclasses.replace(sampling, seed=engine_seed(sampling.seed, e)),
            )
            for e, (w, (a, b)) in enumerate(zip(self.workers, bounds, strict=True))
            if b > a
        ]

    def results(self, refs: Sequence[ray.ObjectRef[Any]]) -> list[list[Sample]]:
        """The groups of a ``submit``, in prompt order (waits for them)."""
        return self.timed_results(refs)[0]

    def timed_results(self, refs: Sequence[ray.ObjectRef[Any]]) -> tuple[list[list[Sample]], float]:
        """``results`` and the engines' own generation seconds (the slowest engine's: they
        generate side by side), without time spent queued behind other calls."""
        parts: list[tuple[list[list[Sample]], float]] = self._gather(refs)
        groups = [group for samples, _ in parts for group in samples]
        return groups, max((seconds for _, seconds in parts), default=0.0)

    def refit(self, policy: PolicyGroup) -> float:
        """Give every engine the policy's current weights; returns seconds."""
        return self.start_refit(policy).finish()

    @property
    def queues_refits(self) -> bool:
        """``start_refit`` only submits calls (the collective transports); the object-store
        fallback's export waits for the policy."""
        return self.transport != "object_store"

    def start_refit(self, policy: PolicyGroup) -> PendingRefit:
        """Submit the transfer of the policy's weights without waiting for it.

        Each side runs it after the calls already submitted to it (Ray runs one
        submitter's calls to an actor in order): the policy ranks send once their queued
        train step is done, each engine receives once its queued requests are generated,
        and a request submitted after this call is generated with the new weights. The
        object-store fallback exports (a gather) first, so it only starts when the policy
        is idle. Colocated, the policy's cache release is waited for first (the policy is
        idle then: colocated runs are synchronous).
        """
        start = time.perf_counter()
        if self.transport == "object_store":
            self.wake()
            weights = policy.export_weights()
            refs = [w.update_weights.remote([weights]) for w in self.workers]
            del weights  # the stored copy is freed once no reference is left
            return PendingRefit(self, policy, refs, 0, start)
        self._release_policy(policy)  # the engines map their weights back to receive
        plan = self._join_weight_group(policy)
        shared = self.transport == "ipc"
        refs = policy.call("send_weights_shared" if shared else "send_weights", plan)
        refs += [w.receive_weights.remote(plan, shared) for w in self.workers]
        return PendingRefit(self, policy, refs, len(policy.workers), start)

    def refit_metrics(self) -> dict[str, float]:
        return dict(self._refit_metrics)

    def _join_weight_group(self, policy: PolicyGroup) -> list[Any]:
        """Form the weight-update group once per policy/engine lifetime; the bucket plan."""
        if self._plan is not None and self._group_policy is policy:
            return self._plan
        ranks: list[int] = self._gather([w.weight_ranks.remote() for w in self.workers])
        address_of_rank0: tuple[str, int] = self._gather_with(
            policy, [policy.workers[0].address.remote()]
        )[0]
        host, port = address_of_rank0
        device = self.plan.device
        shared = self.transport == "ipc"
        # Broadcast: policy rank 0 sends over NCCL/gloo. Handles: every policy rank joins the
        # (gloo) group for the per-bucket barriers; the bytes go through shared memory.
        senders = len(policy.workers) if shared else 1
        backend = "gloo" if shared else backend_for(device)
        address = GroupAddress(
            host, int(port), senders + sum(ranks), backend, WEIGHT_GROUP_TIMEOUT_S
        )
        offsets = [senders + sum(ranks[:e]) for e in range(len(ranks))]
        refs = policy.call("join_weight_group", address, shared)
        refs += [
            w.join_weight_group.remote(address, o)
            for w, o in zip(self.workers, offsets, strict=True)
        ]
        self._gather_with(policy, refs)
        bucket_bytes = max(1, int(self.config.generation.refit_bucket_mb * 1024 * 1024))
        dtype = VLLM_DTYPES[self.config.policy.precision]
        plan: list[Any] = self._gather_with(
            policy, [policy.workers[0].refit_plan.remote(bucket_bytes, dtype)]
        )[0]
        self._plan = plan
        if shared:
            self._share_buffers(policy, plan, ranks)
        self._group_policy = policy
        return plan

    def _share_buffers(self, policy: PolicyGroup, plan: list[Any], ranks: list[int]) -> None:
        """Handle transport: engine worker j maps the buffer of policy rank j % exporters
        (colocated: the rank on its own GPU; see weight_sync/handles.py)."""
        exporters = min(len(policy.workers), sum(ranks))
        handles: list[bytes | None] = self._gather_with(
            policy, policy.call("share_buffer", plan, exporters)
        )
        refs: list[ray.ObjectRef[Any]] = []
        j = 0
        for worker, count in zip(self.workers, ranks, strict=True):
            refs.append(
                worker.attach_shared.remote([handles[(j + i) % exporters] for i in range(count)])
            )
            j += count
        self._gather(refs)
        # Every engine worker has mapped its buffer: the files' names can go, so a process
        # killed later leaves no file in /dev/shm (the mappings keep the memory).
        self._gather_with(policy, policy.call("unlink_shared_buffer"))

    def _gather_refit(self, policy: PolicyGroup, refs: Sequence[ray.ObjectRef[Any]]) -> list[Any]:
        """``_gather_with`` for the transfer itself. When a member dies mid-transfer, the
        survivors' collectives fail too (gloo: connection closed; NCCL: timeout), often
        before Ray reports the death; the death is the cause, so it is what is raised
        (WorkerDied: the run restarts from its last checkpoint)."""
        try:
            return self._gather_with(policy, refs)
        except WorkerDied:
            raise
        except WorkerFailure as failure:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=REFIT_DEATH_GRACE_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as death:
                    raise WorkerDied(
                        f"{failure} after a refit member died: {first_line(death)}"
                    ) from None
                except ray.exceptions.RayTaskError:
                    pass
            raise

    def _gather_with(self, policy: PolicyGroup, refs: Sequence[ray.ObjectRef[Any]]) -> list[Any]:
        """Gather calls on the policy's workers (first) and then the engines', failing on the
        first that dies or raises: the others would wait for it in a collective forever."""
        n = len(policy.workers)

        def describe(i: int) -> str:
            return policy.describe(i) if i < n else self._describe(i - n)

        return gather(refs, describe)

    def sleep(self) -> None:
        if not self._asleep:
            self._gather([w.sleep.remote() for w in self.workers])
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self._release_policy(self._colocated_policy)  # the KV cache comes back
            self._gather([w.wake.remote() for w in self.workers])
            self._asleep = False

    def _release_policy(self, policy: PolicyGroup | None) -> None:
        """Colocated: the policy ranks return their cached CUDA blocks (the training peak)
        before an engine maps its weights or KV cache back on their GPUs, and the call
        waits for it, so no engine wakes first (memory_release.py). Split: nothing."""
        if self._colocated_policy is not None and policy is not None:
            self._gather_with(policy, policy.call("release_memory"))

    def worker_pids(self) -> list[int]:
        pids: list[int] = self._gather([w.pid.remote() for w in self.workers])
        return pids

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        if self.placement is not None:
            remove_placement_group(self.placement)


def build_engines(plan: RunPlan, policy: PolicyGroup) -> Engines:
    """The rollout engines of a run, placed as the plan says (module docstring)."""
    if not plan.needs_engine_workers:
        return PolicyEngines(policy)
    return GenerationGroup(plan, policy)
