"""The controller's view of the rollout engines: generate, refit, sleep and wake.

Three placements, chosen from the config by ``build_engines``:

* colocated, megatron backend (``PolicyEngines``): the policy ranks generate on their own
  model, so there is no separate engine and a refit copies nothing;
* colocated, vllm backend (``GenerationGroup`` on the policy's bundles, GPU only): one
  engine actor per ``engine.tensor_parallel_size`` policy ranks shares their devices; it
  sleeps (weights offloaded, KV cache freed) while the policy trains and wakes for the
  refit;
* split mode (``GenerationGroup`` with a placement group of its own): engines on
  ``cluster.generation_num_devices`` devices, refitted after every step.

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
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dapo_megatron.config.parallel import generation_devices
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.controller.cluster import rank_resources, reserve_ranks, resolve_device
from dapo_megatron.controller.policy_group import PolicyGroup, shard_bounds
from dapo_megatron.controller.remote import gather
from dapo_megatron.generation.base import Sample, SamplingParams
from dapo_megatron.workers.generation_worker import GenerationWorker

# GPU fraction Ray books for each of the two processes sharing a device when a vLLM engine
# is colocated with the policy (a logical booking: both see the whole device).
COLOCATED_SHARE = 0.5


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

    def shutdown(self) -> None: ...


def engine_seed(seed: int | None, engine: int) -> int | None:
    """The sampling seed of one engine for a call seeded ``seed`` (None stays None)."""
    if seed is None:
        return None
    return (seed * 1_000_033 + engine * 15_485_863) % (2**31 - 1)


def num_engines(config: DapoMegatronConfig) -> int:
    engine = config.generation.engine
    return engine.num_engines or generation_devices(config) // engine.tensor_parallel_size


def needs_engine_workers(config: DapoMegatronConfig) -> bool:
    """False only when the policy ranks generate themselves (colocated megatron)."""
    return not (config.cluster.colocated and config.generation.backend == "megatron")


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

    def shutdown(self) -> None:
        """The policy group owns the engines."""


class GenerationGroup:
    """Engine actors: in a placement group of their own (split), or on the policy's."""

    def __init__(self, config: DapoMegatronConfig, policy: PolicyGroup) -> None:
        self.config = config
        count = num_engines(config)
        tp = config.generation.engine.tensor_parallel_size
        cuda = resolve_device(config.cluster) == "cuda"
        actor = ray.remote(GenerationWorker)
        self.placement = None
        if config.cluster.colocated:
            if not cuda:
                raise RuntimeError(
                    "a colocated vllm engine needs GPUs (on CPU the engine process cannot "
                    "share a device with a policy rank); set generation.backend=megatron or "
                    "cluster.colocated=false"
                )
            devices = policy.device_ids()
            # Engine e shares the devices of policy ranks [e * tp, (e + 1) * tp).
            visible = [",".join(devices[e * tp : (e + 1) * tp]) for e in range(count)]
            placement, bundle_stride = policy.placement, tp
            num_cpus, num_gpus = 0.0, COLOCATED_SHARE
        else:
            resources = rank_resources(config.cluster)
            self.placement = reserve_ranks(
                count, resources, what="generation engines", devices_per_bundle=tp
            )
            visible = [None] * count
            placement, bundle_stride = self.placement, 1
            num_cpus, num_gpus = resources.num_cpus, (tp if resources.num_gpus else 0)
        threads = max(1, int(num_cpus)) if cuda else 1
        self.workers = [
            actor.options(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement, placement_group_bundle_index=e * bundle_stride
                ),
            ).remote(config, engine_index=e, num_threads=threads, visible_devices=visible[e])
            for e in range(count)
        ]
        self.info = self._gather([w.setup.remote() for w in self.workers])
        self._asleep = False

    def _describe(self, index: int) -> str:
        return f"generation engine {index} ({self.config.generation.backend})"

    def _gather(self, refs: list[ray.ObjectRef]) -> list[Any]:
        return gather(refs, self._describe)

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        """n samples per prompt, prompts spread over the engines (module docstring)."""
        self.wake()
        bounds = shard_bounds(len(prompts), len(self.workers))
        refs = [
            w.generate.remote(
                [list(p) for p in prompts[a:b]],
                dataclasses.replace(sampling, seed=engine_seed(sampling.seed, e)),
            )
            for e, (w, (a, b)) in enumerate(zip(self.workers, bounds, strict=True))
            if b > a
        ]
        return [group for part in self._gather(refs) for group in part]

    def refit(self, policy: PolicyGroup) -> float:
        """Export the policy's weights once and load them into every engine."""
        start = time.perf_counter()
        self.wake()
        weights = policy.export_weights()
        self._gather([w.update_weights.remote([weights]) for w in self.workers])
        del weights  # the stored copy is freed once no reference is left
        return time.perf_counter() - start

    def sleep(self) -> None:
        if not self._asleep:
            self._gather([w.sleep.remote() for w in self.workers])
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self._gather([w.wake.remote() for w in self.workers])
            self._asleep = False

    def worker_pids(self) -> list[int]:
        return self._gather([w.pid.remote() for w in self.workers])

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        if self.placement is not None:
            remove_placement_group(self.placement)


def build_engines(config: DapoMegatronConfig, policy: PolicyGroup) -> Engines:
    """The rollout engines of a run, placed as the config says (module docstring)."""
    if not needs_engine_workers(config):
        return PolicyEngines(policy)
    return GenerationGroup(config, policy)


def policy_device_share(config: DapoMegatronConfig) -> float:
    """GPU fraction of a policy rank: less than 1 when a vLLM engine shares its device."""
    return COLOCATED_SHARE if config.cluster.colocated and needs_engine_workers(config) else 1.0
