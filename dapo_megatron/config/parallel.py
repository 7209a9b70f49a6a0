"""The policy's parallel layout as one validated object (TP x PP x CP x DP == world)."""

from __future__ import annotations

from dataclasses import dataclass

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.schema import DapoMegatronConfig


@dataclass(frozen=True)
class ParallelDims:
    """Megatron parallel sizes of the policy ranks; the product of tp, pp, cp, dp is world."""

    tp: int
    """Tensor parallel size."""
    pp: int
    """Pipeline parallel size."""
    cp: int
    """Context parallel size."""
    dp: int
    """Data parallel size."""
    sequence_parallel: bool
    """Sequence parallelism inside the TP group."""
    ep: int = 1
    """Expert parallel size (MoE): the experts of a layer are split over EP ranks taken from
    the DP x CP ranks of one pipeline stage (Megatron's expert grid, expert TP = TP)."""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def model_parallel_size(self) -> int:
        """Ranks holding one replica of the model."""
        return self.tp * self.pp * self.cp

    @classmethod
    def build(
        cls,
        *,
        world_size: int,
        tp: int,
        pp: int,
        cp: int,
        dp: int | None,
        sequence_parallel: bool,
        ep: int = 1,
    ) -> ParallelDims:
        """Derive dp when None and check every constraint, naming the key that breaks it."""
        prefix = "policy.megatron."
        if world_size < 1:
            raise ConfigError(
                f"the policy has {world_size} devices (cluster.num_nodes * "
                f"cluster.gpus_per_node, minus cluster.generation_num_devices in split mode): "
                f"it needs at least 1"
            )
        for key, size in (
            ("tensor_model_parallel_size", tp),
            ("pipeline_model_parallel_size", pp),
            ("context_parallel_size", cp),
            ("expert_model_parallel_size", ep),
        ):
            if size < 1:
                raise ConfigError(f"{prefix}{key} = {size}: must be >= 1")
        if sequence_parallel and tp == 1:
            raise ConfigError(
                f"{prefix}sequence_parallel = true needs tensor_model_parallel_size > 1 "
                f"(got 1); set sequence_parallel=false"
            )
        model_parallel = tp * pp * cp
        if world_size % model_parallel != 0:
            raise ConfigError(
                f"{prefix}tensor_model_parallel_size * pipeline_model_parallel_size * "
                f"context_parallel_size = {tp}*{pp}*{cp} = {model_parallel} must divide the "
                f"policy world size {world_size} (cluster.num_nodes * cluster.gpus_per_node"
                f" minus generation devices in split mode)"
            )
        derived = world_size // model_parallel
        if dp is None:
            dp = derived
        elif dp != derived:
            raise ConfigError(
                f"{prefix}data_parallel_size = {dp}: the policy world size {world_size} / "
                f"(TP*PP*CP = {model_parallel}) gives {derived}; set it to {derived} or null"
            )
        if (dp * cp) % ep != 0:
            raise ConfigError(
                f"{prefix}expert_model_parallel_size = {ep} must divide data parallel * "
                f"context parallel = {dp}*{cp} = {dp * cp} (expert ranks are taken from the "
                f"DP x CP ranks of a pipeline stage); choose an EP that divides {dp * cp}"
            )
        return cls(tp=tp, pp=pp, cp=cp, dp=dp, sequence_parallel=sequence_parallel, ep=ep)


def policy_world_size(config: DapoMegatronConfig) -> int:
    """Devices (CPU processes) running policy ranks."""
    total = config.cluster.num_nodes * config.cluster.gpus_per_node
    if config.cluster.colocated:
        return total
    return total - config.cluster.generation_num_devices


def generation_devices(config: DapoMegatronConfig) -> int:
    """Devices available to generation engines."""
    total = config.cluster.num_nodes * config.cluster.gpus_per_node
    return total if config.cluster.colocated else config.cluster.generation_num_devices


def parallel_dims(config: DapoMegatronConfig) -> ParallelDims:
    """The validated policy layout of a config."""
    m = config.policy.megatron
    return ParallelDims.build(
        world_size=policy_world_size(config),
        tp=m.tensor_model_parallel_size,
        pp=m.pipeline_model_parallel_size,
        cp=m.context_parallel_size,
        dp=m.data_parallel_size,
        sequence_parallel=m.sequence_parallel,
        ep=m.expert_model_parallel_size,
    )


# Sequence lengths under the layout: config validation checks the token budget with these,
# and the packer (data/pack_plan.py, data/packing.py) pads with them.


def sequence_multiple(*, tp: int, cp: int, sequence_parallel: bool) -> int:
    """What every sequence length must be a multiple of: 2*CP chunks under context
    parallelism, each divisible by TP under sequence parallelism."""
    multiple = 2 * cp if cp > 1 else 1
    return multiple * (tp if sequence_parallel else 1)


def padded_length(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (0 stays 0)."""
    return -(-length // multiple) * multiple
