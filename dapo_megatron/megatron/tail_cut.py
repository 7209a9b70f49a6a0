"""Cutting a generate call's tail (``SamplingParams.finish_after_fraction``) in the
Megatron engine: which prompts have finished, across the batches of one call.

The engine decodes a batch of rows in lockstep until the longest row ends, so a call's
time is its slowest sample's. Once enough prompts have every sample finished, the rows
still running are aborted (megatron/inference.py ``_decode``) and later batches are not
started: the long tail is not paid for.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class TailCut:
    """``finish_after_fraction`` of one generate call: counts the prompts whose n rows all
    finished (rows are prompt-major: row r is sample r % n of prompt r // n), across the
    call's batches, and says when ``target`` of them have."""

    def __init__(self, num_prompts: int, n: int, target: Callable[[int], int | None]) -> None:
        self.n = n
        self.target = target(num_prompts)
        self._left = torch.full((num_prompts,), n, dtype=torch.long)  # rows not finished
        self._done = 0

    def reached(self) -> bool:
        return self.target is not None and self._done >= self.target

    def check(self, batch: list[int]) -> Callable[[torch.Tensor], bool]:
        """``enough`` of one batch (its rows ``batch``, in batch order)."""
        groups = torch.tensor(batch, dtype=torch.long) // self.n
        target = self.target if self.target is not None else 0

        def enough(finished_B: torch.Tensor) -> bool:
            left = self._left.clone()
            left.index_add_(0, groups, -finished_B.cpu().long())
            return self._done + int((left[groups.unique()] == 0).sum()) >= target

        return enough

    def finish(self, batch: list[int], finished_B: torch.Tensor) -> None:
        """The batch ended: its finished rows count for later batches."""
        groups = torch.tensor(batch, dtype=torch.long) // self.n
        before = self._left.clone()
        self._left.index_add_(0, groups, -finished_B.cpu().long())
        self._done += int(((self._left == 0) & (before > 0)).sum())
