"""The config schema (config/schema.py) against the algorithms it configures."""

from __future__ import annotations

from dapo_megatron.config import schema


def test_loss_agg_modes_match_the_algorithm():
    import typing

    from dapo_megatron.algorithms.loss import LOSS_AGG_MODES

    assert typing.get_args(schema.LossAggMode) == LOSS_AGG_MODES
