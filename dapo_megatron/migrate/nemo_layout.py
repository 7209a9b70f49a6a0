"""NeMo RL's layout keys in the table: the Megatron and DTensor parallel layout, micro-batch
and token budgets, the cluster and the generation engine's placement; nemo_keys.py joins
them to the rest of NeMo RL's keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_megatron.migrate.dialects import ForeignKey

NEMO_LAYOUT_KEYS: tuple[ForeignKey, ...] = ()
"""NeMo RL's layout, cluster and engine-placement keys."""

NEMO_LAYOUT_TIERS: dict[str, str] = {}
"""NeMo RL layout keys (or subtrees ending in ".") classified by what NeMo RL does with them."""


def layout_inactive(flat: Mapping[str, Any]) -> dict[str, str]:
    """NeMo RL layout keys of a config that are not live there (key -> why)."""
    return {}
