"""A fault hook for the refit's restart tests: an engine worker that dies mid-refit.

Set ``DAPO_FAULT_EXIT_IN_REFIT=<n>:<marker file>`` in the job's environment (Ray workers and
vLLM's worker processes inherit it): the first engine worker to reach the second tensor of
its n-th collective refit creates the marker and exits at once, like a process killed by
the OOM killer in the middle of a transfer. The marker makes it happen once per run, so the
restarted run goes through. Unset (always, outside tests), the hook only passes the
tensors on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

FAULT_ENV = "DAPO_FAULT_EXIT_IN_REFIT"


def _claim(marker: str) -> bool:
    """True for exactly one process: the one that creates the marker."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def exit_midway_if_asked(
    weights: Iterator[tuple[str, torch.Tensor]], refit_index: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` unchanged, unless the fault hook asks this refit to die (module doc)."""
    spec = os.environ.get(FAULT_ENV)
    target, _, marker = (spec or "").partition(":")
    armed = bool(spec) and int(target) == refit_index
    for i, item in enumerate(weights):
        if armed and i == 1 and _claim(marker):
            os._exit(1)
        yield item
