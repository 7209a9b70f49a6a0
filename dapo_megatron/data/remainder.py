"""The long-response synthetic task: a remainder worked out by repeated subtraction.

A problem is ``"47-9="``: subtract 9 from 47 again and again until the number is below 9,
writing every intermediate number, then the remainder (47 mod 9) on a line of its own::

    38 29 20 11 2
    2

The ground truth of a record is that whole reference solution (the SFT warm-up trains on it,
as it trains on the arithmetic task's ground truth); the verifier (rewards/remainder.py)
reads only the answer line of the response and of the ground truth, so a scratchpad, right
or wrong, scores by its final answer alone.

Why this task: the arithmetic task's responses are 2-3 tokens, so truncation, the overlong
buffer and the length normalisation of the loss never come into play. Here the solution
has n // d steps of ~3-4 characters, so with dividends in [20, 199] and divisors in
[5, 19] (the defaults) the reference solutions spread over 4-130 tokens (median 34): a
response cap of 48 leaves ~20% of the problems unsolvable within it (always truncated,
never solved) while one-step problems are solved every time, both kinds of zero-variance
group that dynamic sampling removes; errors compound over the steps, so accuracy falls
with length and RL has room to move. Each step depends only on the previous number and the
divisor (the token before ``=``), which a 2-layer model can learn; a task whose steps
index into the prompt (a running sum of k operands) was not learned by the tiny model in
a short warm-up (greedy accuracy 0.05 after 400 SFT steps).

Validation problems are distinct and never appear in training. Every character used
(digits, ``-``, ``=``, space, newline) is in the char tokenizer (data/tokenizer.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dapo_megatron.data.records import PromptRecord

ANSWER_SEPARATOR = "\n"
"""What separates the scratchpad from the answer line (the verifier splits on it)."""


@dataclass(frozen=True)
class RemainderTask:
    """The knobs of the task (data.remainder.*): dividends and divisors, both uniform."""

    min_dividend: int
    """Smallest dividend n."""
    max_dividend: int
    """Largest dividend n."""
    min_divisor: int
    """Smallest divisor d (>= 2)."""
    max_divisor: int
    """Largest divisor d (< min_dividend, so every problem has at least one step)."""

    def __post_init__(self) -> None:
        if not 2 <= self.min_divisor <= self.max_divisor < self.min_dividend <= self.max_dividend:
            raise ValueError(
                "need 2 <= min_divisor <= max_divisor < min_dividend <= max_dividend, got "
                f"divisors {self.min_divisor}..{self.max_divisor}, dividends "
                f"{self.min_dividend}..{self.max_dividend}"
            )

    @property
    def num_divisors(self) -> int:
        return self.max_divisor - self.min_divisor + 1

    @property
    def size(self) -> int:
        """Distinct problems of the task (the most a split can hold out)."""
        return (self.max_dividend - self.min_dividend + 1) * self.num_divisors

    def problem(self, index: int) -> tuple[int, int]:
        """(n, d) of the problem with this index in [0, size)."""
        n, d = divmod(index, self.num_divisors)
        return self.min_dividend + n, self.min_divisor + d


def solution(n: int, d: int) -> str:
    """The reference worked solution: n - d, n - 2d, ... down to n mod d, then the answer."""
    steps = list(range(n - d, -1, -d))
    return " ".join(map(str, steps)) + ANSWER_SEPARATOR + str(steps[-1])


def record(n: int, d: int) -> PromptRecord:
    """The prompt ``"n-d="`` with its reference solution as ground truth."""
    return PromptRecord(f"{n}-{d}=", solution(n, d), {"dividend": n, "divisor": d})


def make_train_val_split(
    num_train: int, num_val: int, *, seed: int, task: RemainderTask
) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """`num_val` distinct validation problems and `num_train` training problems from the rest.

    Training repeats the remaining problems as evenly as possible, in a seeded order (the
    task has a few thousand problems); the same seed gives the same split.

    Raises:
        ValueError: a count is negative or num_train is 0, or num_val leaves fewer than half
            of the distinct problems for training.
    """
    if num_train < 1 or num_val < 0:
        raise ValueError(
            f"need num_train >= 1 and num_val >= 0, got num_train={num_train}, num_val={num_val}"
        )
    if 2 * num_val > task.size:
        raise ValueError(
            f"data.remainder.num_val = {num_val} would hold out more than half of the task's "
            f"{task.size} distinct problems; use fewer or widen the dividend/divisor ranges"
        )
    rng = random.Random(seed)
    val = rng.sample(range(task.size), num_val)
    held_out = set(val)
    candidates = [i for i in range(task.size) if i not in held_out]
    train: list[int] = []
    while len(train) < num_train:
        rng.shuffle(candidates)
        train.extend(candidates[: num_train - len(train)])
    return [record(*task.problem(i)) for i in train], [record(*task.problem(i)) for i in val]
