"""Where a step's rollouts come from: the synchronous rounds, or the overlapped stream.

``rollout.max_staleness = 0`` (``SyncRollouts``): a step generates its groups in rounds
(dynamic sampling), the policy trains, then the engines are refitted: the loop of DAPO's
paper, exactly as before overlapped rollouts existed. ``K >= 1`` (``RolloutStream``,
split mode): the engines keep generating while the policy trains, and groups at most K
policy versions old are trained (controller/rollout_stream.py). The loop sees one
interface either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingStats
from dapo_megatron.controller import steps
from dapo_megatron.controller.context import RunContext
from dapo_megatron.controller.generation_group import Engines, GenerationGroup
from dapo_megatron.controller.policy_group import PolicyGroup
from dapo_megatron.controller.rollout import RolloutGroup
from dapo_megatron.controller.rollout_stream import RolloutStream


class Rollouts(Protocol):
    """What the training loop asks of its rollout source."""

    def take(self, step: int) -> tuple[list[RolloutGroup], DynamicSamplingStats, dict[str, float]]:
        """The groups of the step trained at policy version ``step``, their dynamic-sampling
        statistics and generation metrics."""
        ...

    def arm_refit(self, policy: PolicyGroup, version: int, *, hold: bool = False) -> None:
        """The train step just submitted makes the weights of ``version``: their transfer
        may be queued behind it whenever the engines are done with their current weights
        (``hold``: validation on the new weights before any training request)."""
        ...

    def start_refit(
        self, policy: PolicyGroup, version: int, *, hold: bool = False, early: bool = False
    ) -> Any:
        """Start giving the engines the policy's weights (policy version ``version``),
        queued behind the train step submitted before; ``hold``: they generate nothing
        until ``finish_refit``. ``early`` (while the policy still trains): None when the
        engines would rather keep generating with their current weights; start it later."""
        ...

    def finish_refit(
        self, refit: Any, then: Callable[[], dict[str, float]] | None = None
    ) -> dict[str, float]:
        """Wait for a started refit, then run ``then`` (validation) on the new weights
        before the engines generate anything else; timings and ``then``'s metrics."""
        ...

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """A span with no generation in flight (validation, checkpoints)."""
        ...

    def engine_busy_s(self) -> float:
        """Cumulative seconds the engines spent generating training rollouts."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the rollout source (inside ``paused``)."""
        ...

    def close(self) -> None: ...


class SyncRollouts:
    """Generate, then train, then refit (``rollout.max_staleness = 0``)."""

    def __init__(self, ctx: RunContext, engines: Engines) -> None:
        self.ctx = ctx
        self.engines = engines
        self._busy_s = 0.0

    def take(self, step: int) -> tuple[list[RolloutGroup], DynamicSamplingStats, dict[str, float]]:
        groups, stats, metrics = steps.collect_rollouts(self.ctx, self.engines, step)
        self.engines.sleep()  # colocated engines give their memory to the training phase
        self._busy_s += metrics["timing/generate_s"]
        return groups, stats, metrics

    def arm_refit(self, policy: PolicyGroup, version: int, *, hold: bool = False) -> None:
        """Nothing runs in the background: the refit happens in ``finish_refit``."""

    def start_refit(
        self, policy: PolicyGroup, version: int, *, hold: bool = False, early: bool = False
    ) -> PolicyGroup | None:
        """Nothing runs in the background: the refit happens in ``finish_refit``."""
        return None if early else policy

    def finish_refit(
        self, refit: Any, then: Callable[[], dict[str, float]] | None = None
    ) -> dict[str, float]:
        metrics = {"timing/refit_s": self.engines.refit(refit)}
        return {**metrics, **then()} if then is not None else metrics

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        yield  # nothing runs between the loop's own calls

    def engine_busy_s(self) -> float:
        return self._busy_s

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Nothing runs in the background."""


def make_rollouts(
    ctx: RunContext, engines: Engines, *, version: int, pending_prompts: Sequence[int] = ()
) -> Rollouts:
    """The run's rollout source, starting at policy ``version`` (the engines already hold
    its weights); ``pending_prompts`` come from a checkpoint of an overlapped run."""
    if not ctx.plan.overlapped:
        if pending_prompts:  # a checkpoint of an overlapped run, resumed with K = 0
            print(
                f"[resume] {len(pending_prompts)} prompts drawn but not trained by the "
                "overlapped run are not generated again by the synchronous loop",
                flush=True,
            )
        return SyncRollouts(ctx, engines)
    if not isinstance(engines, GenerationGroup):
        # Validation requires split mode for K >= 1; colocated engines cannot overlap.
        raise TypeError("overlapped rollouts need split-mode engines (a GenerationGroup)")
    if pending_prompts:
        print(
            f"[resume] {len(pending_prompts)} prompts drawn but not trained before the "
            "checkpoint are generated again first (their samples are not checkpointed)",
            flush=True,
        )
    return RolloutStream(ctx, engines, version=version, pending_prompts=pending_prompts)
