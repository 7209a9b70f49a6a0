"""The verifier registry (rewards/registry.py)."""

from __future__ import annotations

import pytest

from dapo_megatron.rewards import VERIFIERS, get_verifier, gsm8k, score

# ------------------------------------------------------------------------------ registry


def test_registry_names_match_the_config_values() -> None:
    import typing

    from dapo_megatron.config.schema_data import RewardConfig

    names = set(typing.get_args(typing.get_type_hints(RewardConfig)["verifier"]))
    assert (
        set(VERIFIERS)
        == names
        == {"math", "gsm8k", "gsm8k_verl", "gsm8k_skyrl", "arithmetic", "remainder"}
    )
    assert score("arithmetic", "4", "4") == 1.0
    assert get_verifier("gsm8k") is gsm8k.VERIFIER
    with pytest.raises(ValueError, match="known"):
        get_verifier("maths")
