"""Typed schema of a dapo-megatron run: one dataclass per YAML section.

Fields carry no defaults on purpose: every default lives once, in configs/dapo_base.yaml,
and recipes inherit it with `defaults:`. The loader (loader.py) turns the merged YAML into
these dataclasses, checking types; cross-field constraints live in validate.py.
Each field's docstring is the reference documentation of its key. This module holds the
top-level DapoMegatronConfig; the sections live beside it: schema_run.py (run, cluster,
checkpointing, logger), schema_policy.py (policy, generation), schema_dapo.py (dapo,
rollout, sft_warmup) and schema_data.py (data, reward, validation).
"""

from __future__ import annotations

from dataclasses import dataclass

# LossAggMode and LossConfig are re-exported because tests read them as schema attributes,
# ClusterConfig because many modules import it from here. The loss's keys and value sets
# are declared once, beside LossSpec (torch-free), so that a YAML value and a loss argument
# cannot disagree.
from dapo_megatron.algorithms.loss_spec import LossAggMode as LossAggMode
from dapo_megatron.config.schema_dapo import DapoConfig, RolloutConfig, SftWarmupConfig
from dapo_megatron.config.schema_dapo import LossConfig as LossConfig
from dapo_megatron.config.schema_data import DataConfig, RewardConfig, ValidationConfig
from dapo_megatron.config.schema_policy import GenerationConfig, PolicyConfig
from dapo_megatron.config.schema_run import CheckpointingConfig, LoggerConfig, RunConfig
from dapo_megatron.config.schema_run import ClusterConfig as ClusterConfig


@dataclass
class DapoMegatronConfig:
    """A whole run."""

    run: RunConfig
    """Run identity and directory."""
    policy: PolicyConfig
    """Policy model, Megatron layout, optimizer and batch sizes."""
    generation: GenerationConfig
    """Rollout generation."""
    dapo: DapoConfig
    """The DAPO algorithm."""
    rollout: RolloutConfig
    """Overlapped (asynchronous) rollouts with bounded staleness."""
    sft_warmup: SftWarmupConfig
    """Optional supervised warm-up."""
    validation: ValidationConfig
    """Validation."""
    data: DataConfig
    """Datasets."""
    reward: RewardConfig
    """Verifiers."""
    cluster: ClusterConfig
    """Cluster and placement."""
    checkpointing: CheckpointingConfig
    """Checkpointing and resume."""
    logger: LoggerConfig
    """Metrics and progress reporting."""
