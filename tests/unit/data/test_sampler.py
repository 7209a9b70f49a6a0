"""The resumable prompt sampler (data/sampler.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.data.sampler import PromptSampler

# ----------------------------------------------------------------------------- sampler


@settings(max_examples=60, deadline=None)
@given(
    num_items=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    shuffle=st.booleans(),
    before=st.lists(st.integers(0, 15), max_size=5),
    after=st.lists(st.integers(0, 15), max_size=5),
)
def test_sampler_resume_equals_uninterrupted(
    num_items: int, seed: int, shuffle: bool, before: list[int], after: list[int]
) -> None:
    uninterrupted = PromptSampler(num_items, seed=seed, shuffle=shuffle)
    for n in before:
        uninterrupted.next_indices(n)
    expected = [uninterrupted.next_indices(n) for n in after]

    first = PromptSampler(num_items, seed=seed, shuffle=shuffle)
    for n in before:
        first.next_indices(n)
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints may store it as JSON
    # A fresh sampler with another seed: the checkpoint's seed must win.
    resumed = PromptSampler(num_items, seed=seed + 1, shuffle=shuffle)
    resumed.load_state_dict(state)
    assert [resumed.next_indices(n) for n in after] == expected
    assert resumed.state_dict() == uninterrupted.state_dict()


def test_sampler_epochs_are_permutations() -> None:
    sampler = PromptSampler(50, seed=3, shuffle=True)
    drawn = sampler.next_indices(120)  # crosses two epoch boundaries
    epochs = [drawn[:50], drawn[50:100]]
    assert all(sorted(e) == list(range(50)) for e in epochs)
    assert epochs[0] != epochs[1] and epochs[0] != list(range(50))
    assert (sampler.epoch, sampler.position) == (2, 20)
    assert drawn[100:] == PromptSampler(50, seed=3 + 2, shuffle=True).next_indices(20)

    ordered = PromptSampler(4, seed=0, shuffle=False)
    assert ordered.next_indices(10) == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert ordered.next_indices(0) == []


def test_sampler_state_errors() -> None:
    sampler = PromptSampler(10, seed=0, shuffle=True)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="covered 10 prompts but the dataset now has 9"):
        PromptSampler(9, seed=0, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="data.shuffle=True"):
        PromptSampler(10, seed=0, shuffle=False).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks position"):
        sampler.load_state_dict({"epoch": 0, "seed": 0})
    with pytest.raises(ValueError, match="at least one prompt"):
        PromptSampler(0, seed=0, shuffle=True)
