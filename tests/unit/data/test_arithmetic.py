"""The arithmetic task (data/arithmetic.py): problems and the train/validation split."""

from __future__ import annotations

from collections import Counter

import pytest

from dapo_megatron.config.arithmetic_task import num_distinct_problems
from dapo_megatron.data.arithmetic import make_problems, make_train_val_split
from dapo_megatron.data.tokenizer import CHARACTERS

# ----------------------------------------------------------------------------- arithmetic


def test_problems_are_deterministic_and_correct() -> None:
    a = make_problems(200, seed=7, num_operands=4, ops="+-*")
    assert a == make_problems(200, seed=7, num_operands=4, ops="+-*")
    assert a != make_problems(200, seed=8, num_operands=4, ops="+-*")
    for record in a:
        assert isinstance(record.prompt, str) and record.prompt.endswith("=")
        expression = record.prompt[:-1]
        # Python's own precedence is the reference for the generator's evaluator.
        assert int(record.ground_truth) == eval(expression)  # noqa: S307 (our own digits/ops)
        operands = expression.replace("-", "+").replace("*", "+").split("+")
        assert len(operands) == 4 and all(0 <= int(x) <= 9 for x in operands)
        assert set(record.prompt) <= set(CHARACTERS)


def test_default_problems_are_single_digit_sums() -> None:
    for record in make_problems(50, seed=0, num_operands=2):
        left, right = record.prompt[:-1].split("+")
        assert len(left) == len(right) == 1
        assert record.ground_truth == str(int(left) + int(right))
    assert num_distinct_problems(num_operands=2) == 100
    assert num_distinct_problems(num_operands=3, max_operand=4, ops="+-") == 5**3 * 2**2


def test_split_is_disjoint_and_balanced() -> None:
    train, val = make_train_val_split(1000, 20, seed=1, num_operands=2)
    val_prompts = [r.prompt for r in val]
    assert len(train) == 1000 and len(val) == 20 and len(set(val_prompts)) == 20
    assert not set(val_prompts) & {r.prompt for r in train}
    # 80 remaining problems, 1000 draws: each appears 12 or 13 times.
    counts = Counter(r.prompt for r in train)
    assert len(counts) == 80 and set(counts.values()) <= {12, 13}
    assert (train, val) == make_train_val_split(1000, 20, seed=1, num_operands=2)
    assert make_train_val_split(1000, 20, seed=2, num_operands=2)[1] != val


def test_split_of_a_huge_task_space_is_disjoint() -> None:
    # 10^7 problems: sampled by rejection rather than enumerated.
    train, val = make_train_val_split(3000, 500, seed=0, num_operands=7)
    assert len({r.prompt for r in val}) == 500
    assert not {r.prompt for r in val} & {r.prompt for r in train}


def test_arithmetic_errors() -> None:
    with pytest.raises(ValueError, match=r"difficulty\) must be >= 2"):
        make_problems(1, seed=0, num_operands=1)
    with pytest.raises(ValueError, match="ops must be distinct characters"):
        make_problems(1, seed=0, num_operands=2, ops="+/")
    with pytest.raises(
        ValueError, match=r"num_val = 100 leaves no training problem.*below 100 \(e\.g\. 20"
    ):
        make_train_val_split(10, 100, seed=0, num_operands=2)
    train, val = make_train_val_split(10, 99, seed=0, num_operands=2)
    assert {r.prompt for r in train} == {train[0].prompt}  # the one problem left
