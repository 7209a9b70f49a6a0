"""The two decisions of dynamic sampling (algorithms/group_filter.py): which groups vary, and
the auto batch multiplier."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.algorithms.group_filter import auto_batch_multiplier, groups_with_variance

# ----------------------------------------------------------------------- groups_with_variance


def test_groups_with_variance_hand_cases() -> None:
    metric_GN = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.25]])
    # rows 0 and 3 differ within the group; rows 1 and 2 are constant
    assert groups_with_variance(metric_GN).tolist() == [True, False, False, True]


def test_groups_with_variance_dtypes_and_degenerate_shapes() -> None:
    bools = torch.tensor([[True, False], [True, True]])
    assert groups_with_variance(bools).tolist() == [True, False]
    ints = torch.tensor([[3, 3], [0, 2]])
    assert groups_with_variance(ints).tolist() == [False, True]
    # a lone sample cannot vary
    assert groups_with_variance(torch.tensor([[1.0], [0.0]])).tolist() == [False, False]
    empty = groups_with_variance(torch.zeros(0, 4))
    assert empty.dtype == torch.bool and empty.shape == (0,)


@pytest.mark.parametrize(
    ("metric", "match"),
    [
        (torch.zeros(3), "metric_GN"),
        (torch.zeros(2, 0), "N >= 1"),
        (torch.tensor([[1.0, float("nan")]]), "finite"),
        (torch.tensor([[float("nan"), float("nan")]]), "finite"),
    ],
)
def test_groups_with_variance_rejects_bad_input(metric: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        groups_with_variance(metric)


@settings(max_examples=50, deadline=None)
@given(
    rows=st.integers(1, 5).flatmap(
        lambda n: st.lists(
            st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n), max_size=8
        )
    )
)
def test_groups_with_variance_property(rows: list[list[float]]) -> None:
    width = len(rows[0]) if rows else 1
    out = groups_with_variance(torch.tensor(rows).reshape(len(rows), width))
    assert out.tolist() == [len(set(row)) > 1 for row in rows]


# ---------------------------------------------------------------------------------------
# auto_batch_multiplier


def test_auto_batch_multiplier_by_hand():
    # keep rate 0.4, headroom 1.2 -> 1.2 / 0.4 = 3.0 (inside [1, 8])
    assert auto_batch_multiplier(0.4, max_multiplier=8.0, headroom=1.2) == pytest.approx(3.0)
    # keep rate 0.1 -> 12.0, clamped to the maximum 8.0
    assert auto_batch_multiplier(0.1, max_multiplier=8.0, headroom=1.2) == 8.0
    # keep rate 1.0 -> 1.2; with headroom 1.0 -> exactly 1.0 (never below 1)
    assert auto_batch_multiplier(1.0, max_multiplier=8.0, headroom=1.2) == pytest.approx(1.2)
    assert auto_batch_multiplier(1.0, max_multiplier=8.0, headroom=1.0) == 1.0
    # nothing kept yet -> the maximum
    assert auto_batch_multiplier(0.0, max_multiplier=5.0) == 5.0
    with pytest.raises(ValueError, match="keep_rate"):
        auto_batch_multiplier(1.5, max_multiplier=8.0)
    with pytest.raises(ValueError, match="max_multiplier"):
        auto_batch_multiplier(0.5, max_multiplier=0.5)
