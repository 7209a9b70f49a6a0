"""The synthetic arithmetic task of the tiny CPU recipe.

A problem is ``"3+5="`` with ground truth ``"8"``: `num_operands` integers in
``[0, max_operand]`` joined by operators from `ops`, evaluated with the usual precedence
(``*`` before ``+``/``-``). `num_operands` is the difficulty knob (data.arithmetic.difficulty).
The defaults (single digits, ``+`` only) keep the task learnable by a ~80K-parameter model in a
few dozen RL steps on CPU.

Every problem of a task has an index in ``[0, num_distinct_problems)`` (a mixed-radix code of
its operands and operators). Sampling indices instead of strings makes generation seeded,
cheap for huge task spaces, and lets the train/validation split hold out whole problems:
no validation problem ever appears in training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dapo_megatron.config.arithmetic_task import check_task, num_distinct_problems
from dapo_megatron.data.records import PromptRecord

# Task spaces up to this size are enumerated (exact balanced sampling); larger ones are
# sampled by rejection, which is fast because the held-out set is then a tiny fraction.
_ENUMERATE_LIMIT = 1 << 20


@dataclass(frozen=True)
class _Task:
    num_operands: int
    max_operand: int
    ops: str

    def __post_init__(self) -> None:
        check_task(self.num_operands, self.max_operand, self.ops)

    @property
    def size(self) -> int:
        return num_distinct_problems(
            num_operands=self.num_operands, max_operand=self.max_operand, ops=self.ops
        )

    def record(self, index: int) -> PromptRecord:
        """Decode a problem index into its prompt and ground truth."""
        problem_index = index
        operands = []
        for _ in range(self.num_operands):
            index, value = divmod(index, self.max_operand + 1)
            operands.append(value)
        operators = []
        for _ in range(self.num_operands - 1):
            index, choice = divmod(index, len(self.ops))
            operators.append(self.ops[choice])
        text = str(operands[0]) + "".join(
            f"{op}{v}" for op, v in zip(operators, operands[1:], strict=True)
        )
        ground_truth = str(_evaluate(operands, operators))
        return PromptRecord(f"{text}=", ground_truth, {"problem_index": problem_index})


def _evaluate(operands: list[int], operators: list[str]) -> int:
    """Value with standard precedence: products first, then the sum of signed terms."""
    terms = [operands[0]]
    for op, value in zip(operators, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= value
        else:
            terms.append(value if op == "+" else -value)
    return sum(terms)


def make_problems(
    n: int, *, seed: int, num_operands: int, max_operand: int = 9, ops: str = "+"
) -> list[PromptRecord]:
    """`n` problems drawn uniformly (with replacement), the same ones for the same seed.

    Args:
        n: number of problems.
        seed: RNG seed.
        num_operands: operands per problem, >= 2 (the difficulty).
        max_operand: operands are integers in [0, max_operand].
        ops: operators to draw from, a subset of OPERATORS.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    task = _Task(num_operands, max_operand, ops)
    rng = random.Random(seed)
    return [task.record(rng.randrange(task.size)) for _ in range(n)]


def make_train_val_split(
    num_train: int,
    num_val: int,
    *,
    seed: int,
    num_operands: int,
    max_operand: int = 9,
    ops: str = "+",
) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """Disjoint training and validation problems.

    Validation holds `num_val` DISTINCT problems. Training draws `num_train` problems from the
    rest; when there are fewer distinct problems than `num_train` (2 single-digit operands give
    100), each is repeated as evenly as possible, in a seeded order.

    Raises:
        ValueError: num_val leaves no problem for training (it must be below
            num_distinct_problems), or a count is negative.
    """
    task = _Task(num_operands, max_operand, ops)
    if num_train < 1 or num_val < 0:
        raise ValueError(
            f"need num_train >= 1 and num_val >= 0, got num_train={num_train}, num_val={num_val}"
        )
    if num_val >= task.size:
        raise ValueError(
            f"data.arithmetic.num_val = {num_val} leaves no training problem: difficulty "
            f"{num_operands} (operands 0..{max_operand}, ops {ops!r}) has only {task.size} "
            f"distinct problems and validation problems are held out of training. Set "
            f"data.arithmetic.num_val below {task.size} (e.g. {task.size // 5}, a fifth, keeps "
            "most problems for training) or raise data.arithmetic.difficulty"
        )
    rng = random.Random(seed)
    if task.size <= _ENUMERATE_LIMIT:
        val = rng.sample(range(task.size), num_val)
        held_out = set(val)
        candidates = [i for i in range(task.size) if i not in held_out]
        train: list[int] = []
        while len(train) < num_train:
            rng.shuffle(candidates)
            train.extend(candidates[: num_train - len(train)])
    else:
        val, held_out = [], set()
        while len(val) < num_val:
            index = rng.randrange(task.size)
            if index not in held_out:
                held_out.add(index)
                val.append(index)
        train = []
        while len(train) < num_train:
            index = rng.randrange(task.size)
            if index not in held_out:
                train.append(index)
    return [task.record(i) for i in train], [task.record(i) for i in val]
