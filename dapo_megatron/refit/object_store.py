"""The object-store transport of the refit, the fallback: the whole model through Ray.

Sender half (every policy rank): the export runs on every rank (its gathers are
collective); rank 0 keeps CPU copies and stores them once in Ray's object store. Receiver
half (each engine): fetches that one stored copy and hands it to the engine's
``update_weights``. No weight group, no bucket layout: the controller passes the reference
(``controller/actors/refitter.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def put_export(weights: Iterable[tuple[str, torch.Tensor]], rank: int) -> list[Any] | None:
    """Sender half: rank 0 returns ``[ObjectRef]`` of the list of ``(name, CPU tensor)``;
    the other ranks drain the export and return None."""
    import ray

    if rank != 0:
        for _ in weights:  # the collectives of the export need every rank
            pass
        return None
    stored = [(name, t.cpu()) for name, t in weights]
    # Wrapped in a list: Ray would otherwise resolve the reference on return.
    return [ray.put(stored)]


def fetch_weights(weights: list[Any]) -> list[tuple[str, torch.Tensor]]:
    """Receiver half: ``weights`` is ``[ObjectRef]`` from ``put_export`` (wrapped, so that
    Ray hands over the reference and each engine fetches the one stored copy itself), or
    already the list of pairs (in-process use)."""
    if len(weights) == 1 and not isinstance(weights[0], tuple):
        import ray

        fetched: list[tuple[str, torch.Tensor]] = ray.get(weights[0])
        return fetched
    return weights
