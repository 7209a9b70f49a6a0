"""data.val_fraction (data/val_split.py): NeMo RL's split_validation_size, i.e. HF datasets'
``train_test_split(test_size=f, seed=s)``, reproduced row for row."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.data.datasets import build_datasets
from dapo_megatron.data.val_split import split_indices
from unit.data.test_datasets import data_config, write_rows

# np.random.default_rng(42).permutation(10), the generator and call of datasets'
# arrow_dataset.py train_test_split (shuffle=True, seed=42).
PERMUTATION_42 = [5, 6, 0, 7, 3, 2, 4, 9, 1, 8]


def test_split_indices_by_hand() -> None:
    # n_test = ceil(0.3 * 10) = 3: the first three of the permutation are held out, the
    # other seven train, both in permutation order.
    train, val = split_indices(10, 0.3, seed=42)
    assert val == PERMUTATION_42[:3] == [5, 6, 0]
    assert train == PERMUTATION_42[3:] == [7, 3, 2, 4, 9, 1, 8]
    # ceil of the float product, as datasets computes it: 0.07 * 100 = 7.000000000000001.
    assert len(split_indices(100, 0.07, seed=0)[1]) == 8
    # 0.05 of 1000 rows (NeMo RL's grpo_math_1B split) is 50, a different seed another set.
    train_a, val_a = split_indices(1000, 0.05, seed=42)
    assert len(val_a) == 50 and len(train_a) == 950 and sorted(train_a + val_a) == list(range(1000))
    assert val_a != split_indices(1000, 0.05, seed=43)[1]
    with pytest.raises(ValueError, match="leave no training row"):
        split_indices(2, 0.9, seed=0)


def test_build_datasets_holds_out_the_share_of_the_training_file(tmp_path: Path) -> None:
    rows = [{"problem": f"p{i}", "answer": str(i)} for i in range(10)]
    rows[6]["answer"] = (
        None  # row 7 of the file (index 6) is skipped; it falls on the held-out side
    )
    train_file = write_rows(tmp_path / "train.jsonl", rows)
    cfg = data_config(format="aime", train_path=str(train_file), val_fraction=0.3)
    splits = build_datasets(cfg, seed=42)
    assert splits.val is not None
    assert [r.text for r in splits.val.records] == ["p5", "p0"]  # [5, 6, 0] without 6
    assert [r.text for r in splits.train.records] == ["p7", "p3", "p2", "p4", "p9", "p1", "p8"]
    assert "data.val_fraction = 0.3, seed 42" in splits.val.source
    # Off (null): the file trains whole, in file order.
    whole = build_datasets(data_config(format="aime", train_path=str(train_file)), seed=42)
    assert whole.val is None and len(whole.train) == 9


def test_a_share_too_large_for_the_file_names_the_key(tmp_path: Path) -> None:
    train_file = write_rows(tmp_path / "t.jsonl", [{"problem": "a", "answer": "1"}] * 2)
    cfg = data_config(format="aime", train_path=str(train_file), val_fraction=0.9)
    with pytest.raises(ConfigError, match=r"data\.val_fraction = 0\.9: .*2 rows.*lower it"):
        build_datasets(cfg, seed=0)
