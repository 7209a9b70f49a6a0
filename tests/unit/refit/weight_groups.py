"""Runs every rank of a gloo weight group as threads of this process (import:
``unit.refit.weight_groups``)."""

from __future__ import annotations

import threading

from dapo_megatron.refit.group import GroupAddress, WeightGroup
from dapo_megatron.workers.policy_worker import free_port


def _run_members(world: int, role, timeout_s: float = 60.0) -> list:
    """Run ``role(rank, group)`` for every rank of a gloo weight group concurrently (threads
    of this process, each with its own process group); their results, in rank order."""
    address = GroupAddress("127.0.0.1", free_port(), world, "gloo", timeout_s)
    results: list = [None] * world
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            group = WeightGroup(address, rank)
            results[rank] = role(rank, group)
            group.close()
        except BaseException as error:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(error)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results
