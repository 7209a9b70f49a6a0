"""data.val_fraction: a validation set held out of the training file, as NeMo RL holds it.

NeMo RL (read at 7ea279ab): a dataset with ``split_validation_size > 0`` calls
nemo_rl/data/datasets/raw_dataset.py ``RawDataset.split_train_validation(test_size, seed)``
(OpenMathInstruct-2 does, with ``seed = data.train.seed``, ``${grpo.seed}`` in
grpo_math_1B.yaml, our run.seed), i.e. HF datasets'
``Dataset.train_test_split(test_size=f, seed=seed)`` with its defaults (``shuffle=True``,
no stratification). datasets' arrow_dataset.py ``train_test_split`` (read in datasets
5.2.0) then computes, for ``n`` rows and a float ``f`` in (0, 1):

    n_test = ceil(f * n); n_train = n - n_test           (n_train == 0 is an error)
    permutation = np.random.default_rng(seed).permutation(n)
    test = rows[permutation[:n_test]]; train = rows[permutation[n_test:]]

both in permutation order. `split_validation` computes exactly this, with the same float
product and numpy generator, so the same file and seed give NeMo RL's validation problems in
NeMo RL's order (validation.max_prompts then takes the first ones, as NeMo RL's unshuffled
validation loader does).

``n`` is the file's row count (``PromptDataset.num_rows``), and each record is placed by its
row number (``metadata["row"]``): a row our reader skips (empty prompt, missing answer) is
missing from the side the permutation put it on, and moves no other row to the other side.
NeMo RL keeps repeated problems (OpenMathInstruct-2 has several solutions of one problem),
and so does our converter of that dataset, so the rows are the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.data.records import PromptRecord


def split_indices(num_rows: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation) row indices (0-based) of HF datasets'
    ``train_test_split(test_size=fraction, seed=seed)`` on ``num_rows`` rows."""
    import numpy as np

    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    n_test = math.ceil(fraction * num_rows)
    if num_rows - n_test <= 0:
        raise ValueError(f"{num_rows} rows with test_size={fraction} leave no training row")
    permutation = np.random.default_rng(seed).permutation(num_rows).tolist()
    return permutation[n_test:], permutation[:n_test]


def split_validation(
    records: Sequence[PromptRecord], num_rows: int, source: str, fraction: float, seed: int
) -> tuple[list[PromptRecord], list[PromptRecord], int, int]:
    """The training and the validation records held out of one file's ``records``
    (``metadata["row"]`` their 1-based row numbers, ``num_rows`` the file's rows, read from
    ``source``) by data.val_fraction ``fraction`` with seed ``seed`` (run.seed, NeMo RL's
    data.train.seed), and the row count of each side (skipped rows included)."""
    try:
        train_rows, val_rows = split_indices(num_rows, fraction, seed)
    except ValueError as e:
        raise ConfigError(
            f"data.val_fraction = {fraction}: {source} has {num_rows} rows and "
            f"{e}; lower it or validate on a file (data.val_path)"
        ) from None
    by_row = {record.metadata["row"] - 1: record for record in records}
    train = [by_row[i] for i in train_rows if i in by_row]
    val = [by_row[i] for i in val_rows if i in by_row]
    for side_records, side in ((train, "training"), (val, "validation")):
        if not side_records:
            raise ConfigError(
                f"data.val_fraction = {fraction}: every {side} row of {source} was "
                "skipped; raise data.val_fraction or fix the file"
            )
    return train, val, len(train_rows), len(val_rows)
