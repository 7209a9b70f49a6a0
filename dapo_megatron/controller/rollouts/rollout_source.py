"""Where a step's rollouts come from: the synchronous rounds, or the overlapped stream.

``rollout.max_staleness = 0`` (``SyncRollouts``): a step generates its groups in rounds
(dynamic sampling), the policy trains, then the engines are refitted: the loop of DAPO's
paper. ``K >= 1`` (``RolloutStream``, split mode): the engines keep generating while the
policy trains, and groups at most K policy versions old are trained
(controller/rollouts/rollout_stream.py); its ``schedule`` (controller/rollouts/overlap.py) holds the request
budget, when the new weights are transferred and the next step taken early. Both give the loop the same small interface.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingStats
from dapo_megatron.controller.actors.generation_group import Engines, GenerationGroup
from dapo_megatron.controller.actors.policy_group import PolicyGroup
from dapo_megatron.controller.context import RunContext
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.rollout_groups import RolloutGroup
from dapo_megatron.controller.rollouts.rollout_planner import RolloutPlanner
from dapo_megatron.controller.rollouts.rollout_stream import RolloutStream


class Rollouts(Protocol):
    """What the training loop asks of its rollout source."""

    def take(self, step: int) -> tuple[list[RolloutGroup], DynamicSamplingStats, dict[str, float]]:
        """The groups of the step trained at policy version ``step``, their dynamic-sampling
        statistics and generation metrics."""
        ...

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """A span with no generation in flight (validation, checkpoints)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the rollout source (inside ``paused``)."""
        ...

    def engine_busy_s(self) -> float:
        """Cumulative seconds the engines spent generating training rollouts."""
        ...

    def close(self) -> None: ...


class SyncRollouts:
    """Generate in dynamic-sampling rounds, then hand the engines' memory to training
    (``rollout.max_staleness = 0``). The loop refits the engines itself after training."""

    def __init__(self, ctx: RunContext, engines: Engines) -> None:
        self.planner = RolloutPlanner(ctx)
        self.engines = engines
        self._busy_s = 0.0

    def take(self, step: int) -> tuple[list[RolloutGroup], DynamicSamplingStats, dict[str, float]]:
        groups, stats, metrics = steps.collect_rollouts(self.planner, self.engines, step)
        self.engines.sleep()  # colocated engines give their memory to the training phase
        self._busy_s += metrics["timing/generate_s"]
        return groups, stats, metrics

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        yield  # nothing runs between the loop's own calls

    def state(self) -> dict[str, Any]:
        return {}

    def engine_busy_s(self) -> float:
        return self._busy_s

    def close(self) -> None:
        """Nothing runs in the background."""


def synchronous_rollouts(
    ctx: RunContext, engines: Engines, *, pending_prompts: Sequence[int] = ()
) -> SyncRollouts:
    """The rollout source of a K = 0 run; ``pending_prompts`` come from a checkpoint of an
    overlapped run and are not generated again (said once)."""
    if pending_prompts:
        print(
            f"[resume] {len(pending_prompts)} prompts drawn but not trained by the "
            "overlapped run are not generated again by the synchronous loop",
            flush=True,
        )
    return SyncRollouts(ctx, engines)


def overlapped_rollouts(
    ctx: RunContext,
    engines: Engines,
    policy: PolicyGroup,
    *,
    version: int,
    pending_prompts: Sequence[int] = (),
) -> RolloutStream:
    """The rollout stream of a K >= 1 run, starting at policy ``version`` (the engines
    already hold its weights); ``pending_prompts`` (from a checkpoint) are generated first."""
    if not isinstance(engines, GenerationGroup):
        # Validation requires split mode for K >= 1; colocated engines cannot overlap.
        raise TypeError("overlapped rollouts need split-mode engines (a GenerationGroup)")
    if pending_prompts:
        print(
            f"[resume] {len(pending_prompts)} prompts drawn but not trained before the "
            "checkpoint are generated again first (their samples are not checkpointed)",
            flush=True,
        )
    return RolloutStream(ctx, engines, policy, version=version, pending_prompts=pending_prompts)
