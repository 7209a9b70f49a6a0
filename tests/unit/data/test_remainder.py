"""The long-response remainder task (issue 31, data/remainder.py): problems and split."""

from __future__ import annotations

import pytest

from dapo_megatron.data.remainder import RemainderTask, make_train_val_split, record, solution
from dapo_megatron.data.tokenizer import CHARACTERS

TASK = RemainderTask(10, 129, 3, 9)


def test_solution_subtracts_down_to_the_remainder() -> None:
    assert solution(47, 9) == "38 29 20 11 2\n2"
    assert solution(10, 9) == "1\n1"
    assert solution(18, 9) == "9 0\n0"
    r = record(47, 9)
    assert r.prompt == "47-9=" and r.ground_truth == "38 29 20 11 2\n2"
    assert set(r.prompt + r.ground_truth) <= set(CHARACTERS)


def test_split_is_disjoint_seeded_and_spreads_lengths() -> None:
    train, val = make_train_val_split(2000, 400, seed=3, task=TASK)
    assert len(train) == 2000 and len(val) == len({r.prompt for r in val}) == 400
    assert not {r.prompt for r in train} & {r.prompt for r in val}
    again, _ = make_train_val_split(2000, 400, seed=3, task=TASK)
    assert [r.prompt for r in again] == [r.prompt for r in train]
    lengths = sorted(len(r.ground_truth) + 1 for r in val)  # + EOS
    assert lengths[0] <= 8 and lengths[-1] > 64
    assert 0.1 < sum(n > 56 for n in lengths) / len(lengths) < 0.4  # the recipe's cap


def test_split_refuses_holding_out_most_problems() -> None:
    with pytest.raises(ValueError, match="more than half"):
        make_train_val_split(10, 500, seed=0, task=TASK)
    with pytest.raises(ValueError, match="min_divisor"):
        RemainderTask(5, 100, 3, 9)
