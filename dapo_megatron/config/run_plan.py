"""The run plan: a validated config plus every value derived from it, computed once.

``load_config`` returns it (``LoadedConfig.plan``); the controller, the policy ranks and the
engines read the parallel layout, architecture, engine count, device, device shares and the
loss's hyper-parameters from it instead of deriving them again from the config. It is
frozen and picklable: Ray workers receive it as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from dapo_megatron.algorithms.loss_spec import LossParams, LossSpec
from dapo_megatron.algorithms.shaping_limits import OverlongPenalty, RewardShaping, ScoreScaling
from dapo_megatron.config.model_arch import ModelArch, padded_vocab_size, resolve_arch
from dapo_megatron.config.parallel import ParallelDims, generation_devices, policy_world_size
from dapo_megatron.config.refit_transport import RefitTransport as RefitTransport
from dapo_megatron.config.refit_transport import choose_refit_transport
from dapo_megatron.config.schema import ClusterConfig, DapoMegatronConfig
from dapo_megatron.config.yaml_comments import BASE_YAML

Device = Literal["cpu", "cuda"]
# RefitTransport is imported "as" itself: re-exported, the workers type the transport they
# are handed as run_plan.RefitTransport.

# GPU fraction Ray books for each of the two processes sharing a device when a vLLM engine
# is colocated with the policy (a logical booking: both see the whole device).
COLOCATED_SHARE = 0.5


@dataclass(frozen=True)
class MoeTraining:
    """What the policy's model build takes from ``policy.moe`` (read for a
    mixture-of-experts architecture only; a dense model ignores it)."""

    aux_loss_coef: float
    """Load-balancing loss coefficient; 0 builds the router without the loss."""
    token_dispatcher: Literal["alltoall", "allgather"]
    """Megatron's token dispatcher between expert-parallel ranks."""
    routing_replay: bool = False
    """Routers with Megatron's RouterReplay: the Megatron engine records each token's
    experts, the policy's passes replay them (megatron/routing_replay.py)."""
    freeze_router: bool = False
    """The routers' weights take no gradient (policy.moe.freeze_router)."""


FORWARD_MOE = MoeTraining(aux_loss_coef=0.0, token_dispatcher="alltoall")
"""``policy.moe`` of configs/dapo_base.yaml, for a model built outside a run (an engine's
copy, the exporter, tests); tests/unit check that the two agree."""


def moe_training(config: DapoMegatronConfig) -> MoeTraining:
    """``policy.moe`` as the model build reads it."""
    return MoeTraining(
        aux_loss_coef=config.policy.moe.aux_loss_coef,
        token_dispatcher=config.policy.moe.token_dispatcher,
        routing_replay=config.policy.moe.routing_replay,
        freeze_router=config.policy.moe.freeze_router,
    )


@dataclass(frozen=True)
class PolicyPlan:
    """What a policy rank needs: its slice of the run plan."""

    config: DapoMegatronConfig
    """The run config (policy, optimizer, precision; treat as read-only)."""
    dims: ParallelDims
    """The policy's parallel layout."""
    arch: ModelArch
    """The policy architecture."""
    moe: MoeTraining
    """Mixture-of-experts training settings (a MoE architecture only)."""
    loss: LossSpec
    """The policy loss's hyper-parameters."""
    total_optimizer_steps: int
    """Optimizer steps of the whole run (the lr schedule's horizon)."""
    optimizer_steps_per_train_step: int
    """Optimizer steps of one trainer step (its mini-batches): the lr is held over them
    when policy.scheduler.unit is train_step."""


@dataclass(frozen=True)
class RunPlan:
    """Everything a run derives from its config, resolved once by ``load_config``."""

    config: DapoMegatronConfig
    """The validated config (treat as read-only)."""
    dims: ParallelDims
    """The policy's parallel layout (data_parallel_size resolved)."""
    arch: ModelArch | None
    """Policy architecture (config.json, else the preset); None only when neither exists
    (a dry run of a recipe whose model is not there yet)."""
    arch_source: str
    """Where ``arch`` came from, or why it is unknown."""
    run_dir: Path
    """The run directory (run.output_dir), absolute (against the driver's working directory)."""
    checkpoint_dir: Path
    """Where checkpoints go: checkpointing.checkpoint_dir, else RUN_DIR/checkpoints; absolute."""
    device: Device
    """Device kind of every rank and engine (cluster.device with auto resolved)."""
    policy_world_size: int
    """Devices (CPU processes) running policy ranks."""
    generation_devices: int
    """Devices available to the generation engines."""
    num_engines: int
    """Generation engines (colocated Megatron: the policy's DP replicas)."""
    needs_engine_workers: bool
    """False only when the policy ranks generate themselves (colocated megatron backend)."""
    overlapped: bool
    """Whether rollouts overlap training (rollout.max_staleness >= 1; split mode only): the
    loop, the rollout source, the dynamic sampler and the memory plan all read it here."""
    max_group_age: int
    """How many policy versions behind its step a trained group may be: rollout.max_staleness
    when rollouts overlap (carried and fresh groups alike), else
    dapo.dynamic_sampling.max_carry_age (null: 1). Validation refuses a max_carry_age that
    differs from the staleness bound it would be replaced by."""
    refit_transport: RefitTransport
    """generation.refit_transport with auto resolved: the one transport object every
    refit decision asks (config/refit_transport.py)."""
    sampling_seeds: Literal["per_request", "engine"]
    """generation.sampling_seeds with auto resolved (engine on GPU, per_request on CPU)."""
    policy_device_share: float
    """Fraction of its device each policy rank books in Ray (0.5 beside a colocated engine)."""
    padded_vocab_size: int | None
    """Rows of the policy's embedding/output layer (vocab padded for TP), when arch is known."""
    total_optimizer_steps: int
    """Optimizer steps of the whole run (the lr schedule's horizon)."""
    loss: LossSpec
    """The policy loss's hyper-parameters, validated."""
    reward_shaping: RewardShaping
    """The reward shaping of every round, validated once here."""
    moe: MoeTraining
    """Mixture-of-experts training settings (a MoE architecture only)."""
    warnings: tuple[str, ...]
    """Suspicious but legal settings."""

    def require_arch(self) -> ModelArch:
        """The architecture; a clear error when the plan was made without one."""
        if self.arch is None:
            raise ValueError(f"the policy architecture is unknown: {self.arch_source}")
        return self.arch

    def policy(self) -> PolicyPlan:
        """The policy ranks' slice of the plan."""
        return PolicyPlan(
            config=self.config,
            dims=self.dims,
            arch=self.require_arch(),
            moe=self.moe,
            loss=self.loss,
            total_optimizer_steps=self.total_optimizer_steps,
            optimizer_steps_per_train_step=optimizer_steps_per_train_step(self.config),
        )


def policy_plan(
    config: DapoMegatronConfig, dims: ParallelDims, arch: ModelArch | None = None
) -> PolicyPlan:
    """A PolicyPlan for a policy built outside a run (dapo-export, tests), whose layout is
    given rather than the config's cluster; ``arch`` defaults to the checkpoint's config.json
    (or the preset)."""
    if arch is None:
        arch, source = resolve_arch(config.policy.model_name_or_path, config.policy.model_arch)
        if arch is None:
            raise ValueError(f"policy.model_name_or_path: the architecture is unknown: {source}")
    return PolicyPlan(
        config=config,
        dims=dims,
        arch=arch,
        moe=moe_training(config),
        loss=build_loss_spec(config),
        total_optimizer_steps=total_optimizer_steps(config),
        optimizer_steps_per_train_step=optimizer_steps_per_train_step(config),
    )


def runtime_problems(plan: RunPlan) -> list[str]:
    """What makes a valid plan impossible on THIS machine (the resolved device), checked
    before any worker starts. Validation checks only what the config says, so that a GPU
    recipe with cluster.device=auto still validates on a CPU login node."""
    config = plan.config
    problems = []
    if config.cluster.colocated and config.generation.backend == "vllm" and plan.device == "cpu":
        problems.append(
            f"generation.backend = vllm with cluster.colocated = true needs GPUs, and "
            f"cluster.device = {config.cluster.device} resolves to cpu here (no CUDA device "
            f"visible): a colocated engine cannot share a CPU rank's device; use "
            f"generation.backend=megatron, or cluster.colocated=false with "
            f"cluster.generation_num_devices"
        )
    if plan.device == "cuda" and not config.policy.allow_local_spec and not te_installed():
        # The worker would raise TransformerEngineUnavailable after Ray started every rank;
        # a missing package is visible here already.
        problems.append(
            "policy.allow_local_spec = false and cluster.device resolves to cuda, but "
            "transformer_engine is not installed here: the policy would run the unfused "
            "local layer spec that the memory plan does not count. Install the GPU stack "
            "with bash scripts/setup_gpu.sh (the gpu extra, pip install -e '.[gpu]', with "
            "Transformer Engine built against the installed torch), or set "
            "policy.allow_local_spec=true to run the local spec on purpose"
        )
    elif plan.device == "cuda" and not config.policy.allow_local_spec:
        # Installed but compiled against another torch: its import fails in every worker;
        # a child process imports it here (te_abi_error). Other import failures are left
        # to the worker's TransformerEngineUnavailable, as before.
        abi = te_abi_error()
        if abi is not None:
            problems.append(
                f"policy.allow_local_spec = false and cluster.device resolves to cuda: {abi}"
            )
    return problems


def te_installed() -> bool:
    """Whether the transformer_engine package is installed (found, not imported: importing
    it initialises CUDA in the driver)."""
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


TE_VERSION = "2.11.0"
"""The Transformer Engine release pyproject.toml's gpu extra and scripts/setup_gpu.sh pin."""

# Imports TE's torch layer in a child process (the driver must not initialise CUDA) and
# prints an ImportError's text after a marker line; any other outcome prints nothing.
_TE_IMPORT_PROBE = """
try:
    import transformer_engine.pytorch
except ImportError as error:
    print("TE_IMPORT_ERROR", error, flush=True)
"""
TE_PROBE_TIMEOUT_S = 180.0
"""How long the child's import may take (TE loads its libraries and cuDNN: seconds)."""


def te_abi_message(error_text: str) -> str | None:
    """One line for an undefined-symbol ImportError of TE's torch extension, else None.

    ``transformer_engine/pytorch/__init__.py`` loads ``transformer_engine_torch`` (a C++
    extension linked against libtorch) through ``load_framework_extension``
    (transformer_engine/common/__init__.py, TE 2.11.0), which raises this ImportError when
    the extension was compiled against another torch than the one installed: the sdist's
    isolated build (its pyproject.toml asks for an unpinned ``torch>=2.1``) compiles against
    the newest torch, not this environment's (pyproject.toml's gpu extra comment)."""
    marker = "undefined symbol:"
    if marker not in error_text:
        return None
    words = error_text.rsplit(marker, 1)[1].split()
    symbol = words[0] if words else "?"
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "(not installed)"
    return (
        f"Transformer Engine's torch extension (transformer_engine_torch) does not load "
        f"against the installed torch {torch_version}: undefined symbol {symbol} (it was "
        f"compiled against another torch, as pip's isolated build of its sdist does); fix: "
        f"bash scripts/setup_gpu.sh, or rebuild it against this torch: pip install "
        f"--no-build-isolation --no-deps --force-reinstall "
        f"transformer-engine-torch=={TE_VERSION}"
    )


def te_abi_error() -> str | None:
    """``te_abi_message`` of importing ``transformer_engine.pytorch`` in a child process
    (the driver must not initialise CUDA), when TE is installed and fails so; else None
    (also when the child cannot tell in TE_PROBE_TIMEOUT_S: the worker reports it then)."""
    import subprocess
    import sys

    if not te_installed():
        return None
    try:
        child = subprocess.run(
            [sys.executable, "-c", _TE_IMPORT_PROBE],
            capture_output=True,
            text=True,
            timeout=TE_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in child.stdout.splitlines():
        if line.startswith("TE_IMPORT_ERROR "):
            return te_abi_message(line.removeprefix("TE_IMPORT_ERROR "))
    return None


def resolve_device(cluster: ClusterConfig) -> Device:
    """cluster.device with auto = cuda when a CUDA device is visible (imports torch)."""
    if cluster.device != "auto":
        return cluster.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def num_engines(config: DapoMegatronConfig) -> int:
    """generation.engine.num_engines, or as many engines of its TP as the devices hold."""
    engine = config.generation.engine
    return engine.num_engines or generation_devices(config) // engine.tensor_parallel_size


def loss_scale_length(config: DapoMegatronConfig) -> int:
    """``dapo.loss.loss_scale_length``, null resolved to generation.max_response_length."""
    length = config.dapo.loss.loss_scale_length
    return config.generation.max_response_length if length is None else length


def build_loss_spec(config: DapoMegatronConfig) -> LossSpec:
    """``dapo.loss`` as a validated LossSpec (its fields copied generically, loss_scale_length
    resolved). Raises ValueError on a bad value (a validated config has none:
    validate_config reports LossSpec's limits under their keys)."""
    return LossSpec.resolve(config.dapo.loss, loss_scale_length(config))


def build_reward_shaping(config: DapoMegatronConfig) -> RewardShaping:
    """``dapo.reward_scaling`` and ``dapo.overlong_buffer`` (the switched-on ones) as the
    run's validated ``RewardShaping``; raises ValueError on a bad value (a validated config
    has none: validate_config reports the same limits under their keys)."""
    d = config.dapo
    rs, ob = d.reward_scaling, d.overlong_buffer
    return RewardShaping(
        scaling=(
            ScoreScaling(rs.source_min, rs.source_max, rs.target_min, rs.target_max)
            if rs.enabled
            else None
        ),
        overlong=(
            OverlongPenalty(config.generation.max_response_length, ob.length, ob.penalty_factor)
            if ob.enabled
            else None
        ),
    )


def shipped_loss_spec(loss_scale_length: int, **changes: Any) -> LossSpec:
    """The spec of configs/dapo_base.yaml's ``dapo.loss`` defaults with ``loss_scale_length``
    and ``changes`` (field -> value) applied, validated like any spec.

    For the code that needs a spec without a recipe (gpu_check's kernel comparison, tests):
    it reads every field of ``LossParams`` from the shipped defaults, so a new
    hyper-parameter reaches it with no edit here or at its callers."""
    with BASE_YAML.open(encoding="utf-8") as file:
        shipped = yaml.safe_load(file)["dapo"]["loss"]
    values = {f.name: shipped[f.name] for f in fields(LossParams)}
    return LossSpec(**{**values, "loss_scale_length": loss_scale_length, **changes})


def max_group_age(config: DapoMegatronConfig) -> int:
    """``RunPlan.max_group_age``: the one staleness bound of a trained group."""
    if config.rollout.max_staleness >= 1:
        return config.rollout.max_staleness
    age = config.dapo.dynamic_sampling.max_carry_age
    return 1 if age is None else age


def optimizer_steps_per_train_step(config: DapoMegatronConfig) -> int:
    """Mini-batches, each one optimizer step, of one trainer step's groups."""
    d = config.dapo
    per_step = d.num_prompts_per_step * d.num_generations_per_prompt
    return max(1, per_step // config.policy.train_global_batch_size)


def total_optimizer_steps(config: DapoMegatronConfig) -> int:
    """Optimizer steps of the whole run."""
    return config.dapo.max_num_steps * optimizer_steps_per_train_step(config)


def make_plan(
    config: DapoMegatronConfig,
    *,
    dims: ParallelDims,
    arch: ModelArch | None,
    arch_source: str,
    warnings: tuple[str, ...] = (),
    device: Device | None = None,
) -> RunPlan:
    """Derive every value of the plan from a config whose constraints already hold
    (``validate_config`` calls this last); ``device`` defaults to resolving cluster.device."""
    device = device or resolve_device(config.cluster)
    gen = config.generation
    needs_workers = not (config.cluster.colocated and gen.backend == "megatron")
    return RunPlan(
        config=config,
        dims=dims,
        arch=arch,
        arch_source=arch_source,
        # Absolute, resolved once against the driver's working directory: a Ray worker's
        # working directory is its raylet's (another directory on another node, or a cluster
        # started earlier elsewhere), where a relative run directory would name another place.
        run_dir=Path(config.run.output_dir).absolute(),
        checkpoint_dir=Path(
            config.checkpointing.checkpoint_dir or Path(config.run.output_dir) / "checkpoints"
        ).absolute(),
        device=device,
        policy_world_size=policy_world_size(config),
        generation_devices=generation_devices(config),
        num_engines=num_engines(config) if needs_workers else dims.dp,
        needs_engine_workers=needs_workers,
        overlapped=config.rollout.max_staleness >= 1,
        max_group_age=max_group_age(config),
        refit_transport=choose_refit_transport(gen, config.cluster, device),
        sampling_seeds=(
            gen.sampling_seeds
            if gen.sampling_seeds != "auto"
            else ("engine" if device == "cuda" else "per_request")
        ),
        policy_device_share=(
            COLOCATED_SHARE if config.cluster.colocated and needs_workers else 1.0
        ),
        padded_vocab_size=padded_vocab_size(arch.vocab_size, dims.tp) if arch else None,
        total_optimizer_steps=total_optimizer_steps(config),
        loss=build_loss_spec(config),
        reward_shaping=build_reward_shaping(config),
        moe=moe_training(config),
        warnings=warnings,
    )
