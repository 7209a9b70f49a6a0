"""The controller's one object for the refit of engines that are not the policy.

``GenerationGroup`` holds a ``Refitter`` (colocated Megatron generation needs none: the
policy's ranks generate on their own model). It asks the run's transport, chosen once
(``RunPlan.refit_transport``, ``config/refit_transport.py``), what it needs:

* ``broadcast``: one weight-update group of policy rank 0 and every engine worker (all TP
  ranks of every engine); rank 0 streams the buckets to them (NCCL on GPU, gloo on CPU);
* ``ipc``: every policy rank joins the (gloo) group for the per-bucket barriers; each
  engine worker maps the bucket buffer of the policy rank paired with it (CUDA IPC on GPU,
  shared memory on CPU), with the same bucket layout;
* ``object_store``: the whole model through Ray's object store (the fallback).

The group forms once per policy/engine lifetime (``join``); each transfer is submitted to
both sides without waiting (``start``) and waited for by ``PendingRefit.finish``. The
transports themselves live in ``dapo_megatron/refit/``; this module only calls the
workers' typed refit methods and gathers them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors.policy_group import PolicyGroup
from dapo_megatron.controller.actors.remote import WorkerDied, WorkerFailure, first_line, gather
from dapo_megatron.refit.group import GroupAddress
from dapo_megatron.workers.generation_worker import VLLM_DTYPES

# A weight-group collective that waits longer than this fails the refit instead of hanging
# (a dead member is normally noticed at once through its Ray actor).
WEIGHT_GROUP_TIMEOUT_S = 600.0
# How long a failed refit waits for the other members' outcome, to tell a dead member (the
# cause: restart) from a member that merely saw the broken connection.
REFIT_DEATH_GRACE_S = 30.0


class PendingRefit:
    """A weight transfer submitted to the policy ranks and the engines
    (``Refitter.start``); ``finish`` waits for it."""

    def __init__(
        self,
        refitter: Refitter,
        policy: PolicyGroup,
        refs: list[ray.ObjectRef[Any]],
        senders: int,
        started: float,
    ) -> None:
        self._refitter = refitter
        self._policy = policy
        self._refs = refs
        self._senders = senders  # the first refs are the policy ranks' sends
        self._started = started

    def finish(self) -> float:
        """Wait for the transfer; the policy's seconds in it: rank 0's own time sending
        (the controller's wait may hold a queued train step), or, for the object-store
        fallback, the controller's."""
        results = self._refitter.gather_transfer(self._policy, self._refs, self._senders)
        counts: list[dict[str, int]] = results[self._senders :]  # cumulative, per engine
        self._refitter.record_engine_counts(counts)
        sent = [r["seconds"] for r in results[: self._senders] if r and "seconds" in r]
        return max(sent) if sent else time.perf_counter() - self._started


class Refitter:
    """Refits the engine actors ``workers`` from a policy group (module docstring)."""

    def __init__(self, plan: RunPlan, workers: list[Any], describe: Callable[[int], str]) -> None:
        """Args:
        plan: the run plan (transport, device, bucket size, precision).
        workers: the engine actors (GenerationWorker handles), in engine order.
        describe: how errors name engine i.
        """
        self.plan = plan
        self.transport = plan.refit_transport
        """The run's transport: every branch below asks it, none compares its name."""
        self.workers = workers
        self._describe = describe
        # BucketLayout.to_wire() of the formed group: plain lists for Ray.
        self._layout_wire: list[Any] | None = None
        self._group_policy: PolicyGroup | None = None
        self._engine_metrics: dict[str, float] = {}

    @property
    def queues_refits(self) -> bool:
        """``start`` only submits calls (the collective transports); the object-store
        fallback's export waits for the policy."""
        return self.transport.needs_group()

    def start(self, policy: PolicyGroup, start: float) -> PendingRefit:
        """Submit the transfer of the policy's weights without waiting for it (the
        caller has released or woken what the transport needs: GenerationGroup);
        ``start``: the ``perf_counter`` the controller's refit began at."""
        if not self.transport.needs_group():
            weights = policy.export_weights()
            refs = [w.update_weights.remote([weights]) for w in self.workers]
            del weights  # the stored copy is freed once no reference is left
            return PendingRefit(self, policy, refs, 0, start)
        layout_wire = self.join(policy)
        refs = policy.submit_send_weights(layout_wire)
        refs += [w.receive_weights.remote(layout_wire) for w in self.workers]
        return PendingRefit(self, policy, refs, len(policy.workers), start)

    def engine_metrics(self) -> dict[str, float]:
        """``refit/engine_*`` counters of the last finished refit (cumulative)."""
        return dict(self._engine_metrics)

    def record_engine_counts(self, counts: list[dict[str, int]]) -> None:
        """Sum the engines' cumulative counters (``GenerationWorker.refit_counts``)."""
        self._engine_metrics = {
            "refit/engine_bytes_received": float(sum(c["bytes_received"] for c in counts)),
            "refit/engine_collective_loads": float(sum(c["collective"] for c in counts)),
            "refit/engine_object_store_loads": float(sum(c["object_store"] for c in counts)),
        }

    def join(self, policy: PolicyGroup) -> list[Any]:
        """Form the weight-update group once per policy/engine lifetime; the bucket layout
        (``BucketLayout.to_wire``)."""
        if self._layout_wire is not None and self._group_policy is policy:
            return self._layout_wire
        ranks: list[int] = self._gather_engines([w.weight_ranks.remote() for w in self.workers])
        address_of_rank0: tuple[str, int] = self._gather_with(
            policy, [policy.workers[0].address.remote()]
        )[0]
        host, port = address_of_rank0
        # Broadcast: policy rank 0 sends over NCCL/gloo. ipc: every policy rank joins the
        # (gloo) group for the per-bucket barriers; the bytes go through shared memory.
        senders = self.transport.group_senders(len(policy.workers))
        backend = self.transport.group_backend(self.plan.device)
        address = GroupAddress(
            host, int(port), senders + sum(ranks), backend, WEIGHT_GROUP_TIMEOUT_S
        )
        offsets = [senders + sum(ranks[:e]) for e in range(len(ranks))]
        refs = policy.submit_join_weight_group(address, self.transport)
        refs += [
            w.join_weight_group.remote(address, o, self.transport)
            for w, o in zip(self.workers, offsets, strict=True)
        ]
        self._gather_with(policy, refs)
        config = self.plan.config
        bucket_bytes = max(1, int(config.generation.refit_bucket_mb * 1024 * 1024))
        dtype = VLLM_DTYPES[config.policy.precision]
        layout_wire: list[Any] = self._gather_with(
            policy, [policy.workers[0].bucket_layout.remote(bucket_bytes, dtype)]
        )[0]
        self._layout_wire = layout_wire
        if self.transport.shared_buffer:
            self._share_buffers(policy, layout_wire, ranks)
        self._group_policy = policy
        return layout_wire

    def _share_buffers(self, policy: PolicyGroup, layout_wire: list[Any], ranks: list[int]) -> None:
        """ipc transport: engine worker j maps the buffer of policy rank j % exporters
        (colocated: the rank on its own GPU; see refit/ipc.py)."""
        exporters = self.transport.bucket_exporters(len(policy.workers), sum(ranks))
        handles: list[bytes | None] = self._gather_with(
            policy, policy.submit_share_buffer(layout_wire, exporters)
        )
        refs: list[ray.ObjectRef[Any]] = []
        j = 0
        for worker, count in zip(self.workers, ranks, strict=True):
            refs.append(
                worker.attach_shared.remote([handles[(j + i) % exporters] for i in range(count)])
            )
            j += count
        self._gather_engines(refs)
        # Every engine worker has mapped its buffer: the files' names can go, so a process
        # killed later leaves no file in /dev/shm (the mappings keep the memory).
        self._gather_with(policy, policy.submit_unlink_shared_buffer())

    def gather_transfer(
        self, policy: PolicyGroup, refs: Sequence[ray.ObjectRef[Any]], senders: int
    ) -> list[Any]:
        """The results of a transfer (``senders`` policy ranks first, then the engines).
        When a member dies mid-transfer, the survivors' collectives fail too (gloo:
        connection closed; NCCL: timeout), often before Ray reports the death; the death
        is the cause, so it is what is raised (WorkerDied: the run restarts from its last
        checkpoint)."""
        if not senders:
            return self._gather_engines(refs)
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

    def _gather_engines(self, refs: Sequence[ray.ObjectRef[Any]]) -> list[Any]:
        return gather(refs, self._describe)

    def _gather_with(self, policy: PolicyGroup, refs: Sequence[ray.ObjectRef[Any]]) -> list[Any]:
        """Gather calls on the policy's workers (first) and then the engines', failing on the
        first that dies or raises: the others would wait for it in a collective forever."""
        n = len(policy.workers)

        def describe(i: int) -> str:
            return policy.describe(i) if i < n else self._describe(i - n)

        return gather(refs, describe)
