"""Pack plans and DP balance (data/pack_plan.py), by hand-derived numbers."""

from __future__ import annotations

import pytest

from dapo_megatron.config.parallel import padded_length, sequence_multiple
from dapo_megatron.data.pack_plan import balance_by_tokens, plan_packs


def test_first_fit_decreasing_by_hand() -> None:
    # Longest first: 11 -> pack 0 (room 5); 8 -> pack 1 (room 8); 5 -> pack 0 (room 0);
    # 3 -> pack 1 (room 5). The empty row (batch padding) goes nowhere.
    assert plan_packs([5, 11, 8, 0, 3], 16, multiple=1) == [[0, 1], [2, 4]]


def test_padding_to_the_multiple_counts_against_the_budget() -> None:
    # multiple 4: 5 -> 8, 11 -> 12, 8 -> 8, 3 -> 4; budget 16: 12+4, 8+8.
    assert padded_length(5, 4) == 8 and padded_length(0, 4) == 0
    assert plan_packs([5, 11, 8, 3], 16, multiple=4) == [[1, 3], [0, 2]]
    assert sequence_multiple(tp=2, cp=2, sequence_parallel=True) == 8
    assert sequence_multiple(tp=2, cp=1, sequence_parallel=False) == 1


def test_a_sequence_longer_than_the_budget_names_the_knobs() -> None:
    with pytest.raises(
        ValueError, match=r"policy.max_tokens_per_microbatch = 16: sequence 1 has 17"
    ):
        plan_packs([3, 17], 16, multiple=1)


def test_balance_by_tokens_by_hand() -> None:
    # 10 -> r0; 9 -> r1; 2 -> r1 (11); 1 -> r0 (11); 1 -> tie 11/11 and 2/2 rows: r0 (12);
    # 1 -> r1 (12).
    assert balance_by_tokens([10, 1, 1, 1, 9, 2], 2) == [[0, 1, 2], [3, 4, 5]]
    parts = balance_by_tokens([7] * 5, 3)
    assert sorted(len(p) for p in parts) == [1, 2, 2]
