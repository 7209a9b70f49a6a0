"""The resumable prompt sampler (data/sampler.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.data.sampler import PromptSampler, epochs_exhausted

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


# ----------------------------------------------------------------------- max_num_epochs


def _steps_until_exhausted(sampler: PromptSampler, epochs: int | None, per_step: int) -> int:
    """Steps the loop trains (no dynamic sampling: a step draws exactly per_step prompts)."""
    steps = 0
    while not epochs_exhausted(sampler, epochs, per_step) and steps < 1000:
        sampler.next_indices(per_step)
        steps += 1
    return steps


@pytest.mark.parametrize(
    ("num_items", "per_step", "epochs", "steps"),
    [
        # 10 prompts, 5 per step: 2 steps a pass, nothing dropped (= the peers' 2 x E).
        (10, 5, 1, 2),
        (10, 5, 3, 6),
        # 7 prompts, 4 per step, 2 passes: 14 prompts -> steps take 0-3, 4-6 + 0 (the
        # passes run into each other), 1-4; the last 2 prompts (5, 6) are too few: dropped.
        # The peers' drop_last would train 2 x floor(7 / 4) = 2 steps.
        (7, 4, 2, 3),
        (7, 4, 1, 1),  # 0-3, then 3 prompts left < 4: stop (the peers: 1 too)
        (3, 4, 1, 0),  # fewer prompts than a step: nothing to train (verl: empty dataloader)
        (3, 4, 4, 3),  # 12 prompts: three steps of 4
    ],
)
def test_epochs_bound_the_steps(num_items: int, per_step: int, epochs: int, steps: int) -> None:
    sampler = PromptSampler(num_items, seed=0, shuffle=False)
    assert _steps_until_exhausted(sampler, epochs, per_step) == steps
    assert steps * per_step <= epochs * num_items < (steps + 1) * per_step  # hand count
    # The stream never entered an epoch past the allowed ones.
    assert sampler.epoch < epochs or (sampler.epoch, sampler.position) == (epochs, 0)


def test_epoch_rule_without_limit_and_at_the_boundary() -> None:
    sampler = PromptSampler(6, seed=1, shuffle=True)
    assert not epochs_exhausted(sampler, None, 4)  # null: the steps alone end the run
    sampler.next_indices(6)  # exactly one pass: the next draw would start epoch 1
    assert (sampler.epoch, sampler.position, sampler.prompts_left(1)) == (1, 0, 0)
    assert epochs_exhausted(sampler, 1, 1)
    assert sampler.prompts_left(2) == 6 and not epochs_exhausted(sampler, 2, 6)
    assert epochs_exhausted(sampler, 2, 7)


@settings(max_examples=40, deadline=None)
@given(
    num_items=st.integers(1, 9),
    per_step=st.integers(1, 6),
    epochs=st.integers(1, 4),
    stop_after=st.integers(0, 8),
)
def test_resumed_run_stops_at_the_same_step(
    num_items: int, per_step: int, epochs: int, stop_after: int
) -> None:
    uninterrupted = _steps_until_exhausted(
        PromptSampler(num_items, seed=5, shuffle=True), epochs, per_step
    )
    assert uninterrupted == epochs * num_items // per_step
    first = PromptSampler(num_items, seed=5, shuffle=True)
    done = 0
    while done < min(stop_after, uninterrupted):  # the checkpoint is taken after step `done`
        first.next_indices(per_step)
        done += 1
    resumed = PromptSampler(num_items, seed=0, shuffle=True)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert done + _steps_until_exhausted(resumed, epochs, per_step) == uninterrupted
