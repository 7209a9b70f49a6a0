"""The policy batch (shared/batch.py)."""

from __future__ import annotations

import pytest
import torch

from dapo_megatron.shared.batch import PolicyBatch


def test_lengths_field_is_checked() -> None:
    ids = torch.zeros(2, 4, dtype=torch.long)
    batch = PolicyBatch(ids, torch.zeros(2, 4), lengths=torch.tensor([4, 1]))
    assert batch.pad_to(3, 5).lengths.tolist() == [4, 1, 0]
    with pytest.raises(ValueError, match="lengths exceed"):
        PolicyBatch(ids, torch.zeros(2, 4), lengths=torch.tensor([5, 1]))
    with pytest.raises(ValueError, match=r"lengths has shape \(3,\); expected \[B\]"):
        PolicyBatch(ids, torch.zeros(2, 4), lengths=torch.tensor([1, 1, 1]))
