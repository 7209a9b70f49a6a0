"""Ray actor classes: PolicyWorker (one per Megatron rank), GenerationWorker (one engine)."""

from __future__ import annotations

import warnings

# Megatron warns at import that Transformer Engine / Apex are absent (expected on CPU, where
# the local spec is used) and about a deprecated cuda-graph default it sets itself; repeated
# by every worker process, these would bury the run's progress lines.
_EXPECTED_MEGATRON_WARNINGS = (
    "Transformer Engine and Apex are not installed",
    "Apex is not installed",
    "full scope is deprecated",
)


def ignore_expected_megatron_warnings() -> None:
    """Filter the Megatron import warnings that are expected in a worker process."""
    for message in _EXPECTED_MEGATRON_WARNINGS:
        warnings.filterwarnings("ignore", message=f".*{message}")
