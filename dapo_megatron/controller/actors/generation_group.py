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

Refit of separate engines: the group's ``Refitter`` (controller/actors/refitter.py; transports in
dapo_megatron/refit/). This module keeps the memory ordering around it: colocated, the
policy returns its cached CUDA blocks before the engines map their weights back, and engines
are never woken with their stale weights before a refit: only their weight memory is mapped
back, and the KV cache returns with the next generate call.

Sharding contract of ``GenerationGroup.generate``: prompts are cut into contiguous,
near-equal shards, one per engine; results are concatenated in prompt order. Each engine
draws with its own seed derived from the call's seed, so engines never share random
streams and a step's samples depend only on (seed, step, round, layout).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.controller.actors.cluster import release_groups
from dapo_megatron.controller.actors.placement import (
    colocated_engine_placements,
    split_engine_placements,
)
from dapo_megatron.controller.actors.policy_group import PolicyGroup, shard_bounds
from dapo_megatron.controller.actors.refitter import PendingRefit, Refitter
from dapo_megatron.controller.actors.remote import abandon, gather, settle_abandoned
from dapo_megatron.device.shm_files import remove_unused
from dapo_megatron.shared.sampling import Sample, SamplingParams
from dapo_megatron.workers.generation_worker import GenerationWorker


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
        self.workers: list[Any] = []
        try:
            for e, p in enumerate(places):
                self.workers.append(
                    actor.options(**p.options).remote(
                        plan,
                        engine_index=e,
                        num_threads=p.num_threads,
                        visible_devices=p.visible_devices,
                    )
                )
            self.info: list[dict[str, Any]] = self._gather([w.setup.remote() for w in self.workers])
        except BaseException:
            # A failed start leaves no engine actor and no placement group of its own (a
            # cleanup that fails itself must not hide why the start failed).
            for worker in self.workers:
                with contextlib.suppress(Exception):
                    ray.kill(worker, no_restart=True)
            with contextlib.suppress(Exception):
                settle_abandoned()
            if self.placement is not None:
                with contextlib.suppress(Exception):
                    release_groups([self.placement])
            raise
        self._asleep = False
        # Colocated: the policy whose GPUs the engines share; it returns its cached CUDA
        # blocks before any engine maps memory back (``_release_policy``).
        self._colocated_policy = policy if config.cluster.colocated else None
        # The refit of these engines (controller/actors/refitter.py, dapo_megatron/refit/).
        self.refitter = Refitter(plan, self.workers, self._describe)

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
                dataclasses.replace(sampling.for_prompts(a, b), seed=engine_seed(sampling.seed, e)),
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
        return self.refitter.queues_refits

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
        started = time.perf_counter()
        if not self.refitter.transport.needs_group():  # the object store loads awake engines
            self.wake()
        else:
            self._release_policy(policy)  # the engines map their weights back to receive
        return self.refitter.start(policy, started)

    def refit_metrics(self) -> dict[str, float]:
        return self.refitter.engine_metrics()

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
        waits for it, so no engine wakes first (device/memory_release.py). Split: nothing."""
        if self._colocated_policy is not None and policy is not None:
            gather(policy.submit_release_memory(), policy.describe)

    def worker_pids(self) -> list[int]:
        pids: list[int] = self._gather([w.pid.remote() for w in self.workers])
        return pids

    def shutdown(self) -> None:
        """Stop the engines: each shuts its engine down itself first (vLLM's processes then
        remove their /dev/shm files), within ENGINE_STOP_S; then every actor is killed (a
        dead, hung or busy one too) and the files a killed engine left are removed."""
        stopping = [w.shutdown.remote() for w in self.workers]
        ray.wait(stopping, num_returns=len(stopping), timeout=ENGINE_STOP_S)
        abandon(stopping)  # a dead engine's error is read, not reported as unhandled
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        settle_abandoned()  # their calls a failure left uncollected end now
        for info in self.info:
            remove_engine_files(info)
        if self.placement is not None:
            release_groups([self.placement])  # and Ray reports it REMOVED


# Seconds an engine gets to shut itself down (a TP2 vLLM engine on CPU: ~2 s) before the
# kill; one busy generating or hung is killed then, and its files removed after it.
ENGINE_STOP_S = 10.0


@ray.remote(num_cpus=0, max_calls=1)
def _remove_unused(names: list[str]) -> list[str]:
    return remove_unused(names)


def remove_engine_files(info: dict[str, Any]) -> None:
    """Remove the /dev/shm files an engine reported at start that its killed processes
    left (device/shm_files.py), on the engine's node: here when the controller shares it,
    else by a task pinned to that node; nothing when the node is gone with its files."""
    names, node = list(info.get("shm_files", ())), info.get("node_id")
    if not names:
        return
    if node is None or node == ray.get_runtime_context().get_node_id():
        remove_unused(names)
        return
    pinned = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    ref = _remove_unused.options(scheduling_strategy=pinned).remote(names)
    with contextlib.suppress(Exception):  # the node was lost meanwhile: nothing to clean
        ray.get(ref, timeout=ENGINE_STOP_S + 20)


def build_engines(plan: RunPlan, policy: PolicyGroup) -> Engines:
    """The rollout engines of a run, placed as the plan says (module docstring)."""
    if not plan.needs_engine_workers:
        return PolicyEngines(policy)
    return GenerationGroup(plan, policy)
