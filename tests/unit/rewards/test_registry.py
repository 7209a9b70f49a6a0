"""The verifier registry (rewards/registry.py)."""

from __future__ import annotations

import pytest

from dapo_megatron.rewards import VERIFIERS, get_verifier, gsm8k, score

# ------------------------------------------------------------------------------ registry


def test_registry_names_match_the_config_values() -> None:
    assert set(VERIFIERS) == {"math", "gsm8k", "arithmetic", "remainder"}
    assert score("arithmetic", "4", "4") == 1.0
    assert get_verifier("gsm8k") is gsm8k.VERIFIER
    with pytest.raises(ValueError, match="known"):
        get_verifier("maths")
