"""Stateful, resumable order in which training prompts are drawn.

The controller asks for prompt indices step after step (more than one batch per step when
dynamic sampling refills). Epoch e visits every index once, in the order of a permutation
seeded with ``seed + e`` (identity order without shuffling); a request that runs past the
end of an epoch continues into the next one. The whole state is three integers (epoch,
position, seed), saved in the run checkpoint, so a resumed run draws exactly the prompts an
uninterrupted run would have drawn.
"""

from __future__ import annotations

import random
from typing import Any


class PromptSampler:
    """Epoch-wise (re)shuffled stream of indices into a dataset of `num_items` prompts."""

    def __init__(self, num_items: int, *, seed: int, shuffle: bool) -> None:
        """
        Args:
            num_items: dataset size (> 0).
            seed: base seed; epoch e is shuffled with seed + e.
            shuffle: shuffle every epoch (data.shuffle); False keeps dataset order.
        """
        if num_items < 1:
            raise ValueError(f"PromptSampler needs at least one prompt, got num_items={num_items}")
        self.num_items = num_items
        self.shuffle = shuffle
        self._seed = seed
        self._epoch = 0
        self._position = 0
        self._order: list[int] | None = None  # permutation of the current epoch, built lazily

    @property
    def epoch(self) -> int:
        """Epoch of the next index to be drawn (epochs completed so far)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Indices already drawn in the current epoch."""
        return self._position

    @property
    def seed(self) -> int:
        """Base seed of the permutations."""
        return self._seed

    def prompts_left(self, num_epochs: int) -> int:
        """Draws left before the stream enters epoch ``num_epochs`` (0-based): the rest of
        the first ``num_epochs`` passes, 0 once they are used up."""
        return max(0, (num_epochs - self._epoch) * self.num_items - self._position)

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            order = list(range(self.num_items))
            if self.shuffle:
                # random.Random's shuffle is stable across Python versions and platforms, so
                # a checkpoint resumes identically on another machine.
                random.Random(self._seed + self._epoch).shuffle(order)
            self._order = order
        return self._order

    def next_indices(self, n: int) -> list[int]:
        """The next `n` dataset indices, continuing into new epochs as needed."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out: list[int] = []
        while len(out) < n:
            order = self._epoch_order()
            take = min(n - len(out), self.num_items - self._position)
            out.extend(order[self._position : self._position + take])
            self._position += take
            if self._position == self.num_items:
                self._epoch += 1
                self._position = 0
                self._order = None
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the stream (plus the dataset size and shuffle flag,
        checked on load)."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self._seed,
            "num_items": self.num_items,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any], *, allow_resize: bool = False) -> None:
        """Continue from a state_dict(); the checkpoint's seed replaces this sampler's.

        Args:
            state: a ``state_dict()``.
            allow_resize: a dataset of another size continues with the next epoch over
                the new prompts (``checkpointing.allow_data_change``) instead of failing.

        Raises:
            ValueError: keys are missing, or the dataset size (unless ``allow_resize``) or
                shuffle flag differ from the checkpoint's (the resumed run would then see
                other prompts than the original).
        """
        missing = [k for k in ("epoch", "position", "seed") if k not in state]
        if missing:
            raise ValueError(f"sampler state lacks {', '.join(missing)}: {state}")
        if state.get("num_items", self.num_items) != self.num_items:
            if allow_resize:
                # Positions of the old epoch mean nothing in the new data: a fresh epoch.
                epoch = int(state["epoch"]) + (1 if int(state["position"]) else 0)
                self._seed, self._epoch, self._position = int(state["seed"]), epoch, 0
                self._order = None
                return
            raise ValueError(
                f"the checkpoint's sampler covered {state['num_items']} prompts but the dataset "
                f"now has {self.num_items}; resume with the same data files and "
                "data.max_prompt_length, set checkpointing.allow_data_change=true to continue "
                "on the changed data on purpose, or start a new run"
            )
        if state.get("shuffle", self.shuffle) != self.shuffle:
            raise ValueError(
                f"the checkpoint was written with data.shuffle={state['shuffle']}; resume with "
                "the same setting or start a new run"
            )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.num_items:
            raise ValueError(
                f"invalid sampler state epoch={epoch}, position={position} for "
                f"{self.num_items} prompts"
            )
        self._seed, self._epoch, self._position = int(state["seed"]), epoch, position
        self._order = None


def epochs_exhausted(
    sampler: PromptSampler, max_num_epochs: int | None, prompts_per_step: int
) -> bool:
    """dapo.max_num_epochs's stopping rule, asked before each step: True when the first
    ``max_num_epochs`` passes hold fewer than ``prompts_per_step`` undrawn prompts (never with
    ``max_num_epochs`` None).

    So the run ends before a step whose first draw would start epoch ``max_num_epochs``
    (0-based), and also before a step that would straddle that boundary: its prompts would
    not all come from the allowed passes. This is the peers' drop_last on their last epoch
    (verl ray_trainer.py _create_dataloader and NeMo RL grpo.py setup build the train
    StatefulDataLoader with drop_last=True; their fit / grpo_train loops end when the last
    epoch's batches are used up). Unlike theirs, our passes run into one another inside a
    step (a step may take the end of pass e and the start of pass e + 1), so only the tail
    of the last pass is dropped: without dynamic sampling, E passes over N prompts train
    floor(E * N / P) steps of P prompts, where the peers train E * floor(N / P).
    The rule reads only the sampler's state, which the checkpoint holds: a resumed run stops
    at the same step. Dynamic sampling draws more than P prompts per step, over rounds: the
    check bounds the step's start only, so its later rounds may draw from the next pass
    (verl-recipe dapo_ray_trainer.py fit instead drops the step's partial batch when the
    last epoch's data runs out).
    """
    if max_num_epochs is None:
        return False
    return sampler.prompts_left(max_num_epochs) < prompts_per_step
