"""Everything a run holds while it trains, built once from the config (and torn down once).

Building is where user errors surface: a missing model or data path, a recipe that does
not fit the cluster, a verifier that cannot start. Each becomes a ConfigError (one line
naming the key) before any worker starts when possible.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dapo_megatron.algorithms.dynamic_sampling import DynamicSampler
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.controller.generation_group import Engines
from dapo_megatron.controller.policy_group import PolicyGroup
from dapo_megatron.controller.rollout import RolloutGroup
from dapo_megatron.data.datasets import EncodedPrompts, build_datasets, encode_prompts
from dapo_megatron.data.sampler import PromptSampler
from dapo_megatron.rewards import VerifierPool


@dataclass
class RunContext:
    """The live objects of a run."""

    config: DapoMegatronConfig
    run_dir: Path
    checkpoint_dir: Path
    tokenizer: object
    train: EncodedPrompts
    val: EncodedPrompts | None
    sampler: PromptSampler
    dynamic: DynamicSampler[RolloutGroup]
    verifier: VerifierPool
    policy: PolicyGroup | None = None
    engines: Engines | None = None

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    @property
    def eos_ids(self) -> list[int]:
        return [int(self.tokenizer.eos_token_id)]

    def reset_state(self) -> None:
        """Fresh prompt and dynamic samplers (a checkpoint, if any, restores them next)."""
        self.sampler = make_sampler(self.config, len(self.train.input_ids))
        self.dynamic = make_dynamic_sampler(self.config)

    def stop_workers(self) -> None:
        """Kill the engines and policy workers (after a failure too); the run state stays."""
        if self.engines is not None:
            self.engines.shutdown()
            self.engines = None
        if self.policy is not None:
            self.policy.shutdown()
            self.policy = None

    def close(self) -> None:
        self.stop_workers()
        self.verifier.close()


def ensure_model(config: DapoMegatronConfig) -> None:
    """Create the tiny model when the recipe asks for it, or fail naming the key."""
    path = Path(config.policy.model_name_or_path)
    if (path / "config.json").is_file():
        return
    if not config.policy.init_model_if_missing:
        raise ConfigError(
            f"policy.model_name_or_path: {path} has no config.json (a local HF checkpoint "
            f"directory is expected; the hub is not used)"
        )
    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.data.tiny_model import create_tiny_model

    print(f"[setup] creating a random {config.policy.model_arch} model at {path}", flush=True)
    create_tiny_model(path, arch=PRESETS[config.policy.model_arch], seed=config.run.seed)


def _load_tokenizer(config: DapoMegatronConfig):
    from transformers import AutoTokenizer

    path = config.policy.tokenizer_name_or_path or config.policy.model_name_or_path
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"policy.tokenizer_name_or_path: cannot load a tokenizer from {path}: {e}".splitlines()[
                0
            ]
        ) from None


def _encode(records, tokenizer, config: DapoMegatronConfig, what: str) -> EncodedPrompts:
    encoded = encode_prompts(
        records,
        tokenizer,
        apply_chat_template=config.data.apply_chat_template,
        max_prompt_length=config.data.max_prompt_length,
    )
    if not encoded.input_ids:
        raise ConfigError(
            f"data.max_prompt_length = {config.data.max_prompt_length}: every "
            f"{what} prompt is longer; raise it"
        )
    if encoded.num_too_long:
        print(
            f"[setup] skipped {encoded.num_too_long} {what} prompts longer than "
            f"data.max_prompt_length",
            flush=True,
        )
    return encoded


def build_context(plan: RunPlan) -> RunContext:
    """Model, tokenizer, data, verifier and samplers (the policy workers come later)."""
    config = plan.config
    ensure_model(config)
    tokenizer = _load_tokenizer(config)
    try:
        splits = build_datasets(config.data, seed=config.run.seed)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"data: {e}") from None
    train = _encode(splits.train.records, tokenizer, config, "training")
    val = None
    if splits.val is not None:
        records = splits.val.records[: config.validation.max_prompts or None]
        val = _encode(records, tokenizer, config, "validation")
    return RunContext(
        config=config,
        run_dir=plan.run_dir,
        checkpoint_dir=plan.checkpoint_dir,
        tokenizer=tokenizer,
        train=train,
        val=val,
        sampler=make_sampler(config, len(train.input_ids)),
        dynamic=make_dynamic_sampler(config),
        verifier=VerifierPool(
            config.reward.verifier,
            num_workers=config.reward.num_workers,
            timeout_s=config.reward.timeout_s,
        ),
    )


def make_sampler(config: DapoMegatronConfig, num_prompts: int) -> PromptSampler:
    return PromptSampler(num_prompts, seed=config.run.seed, shuffle=config.data.shuffle)


def make_dynamic_sampler(config: DapoMegatronConfig) -> DynamicSampler[RolloutGroup]:
    """The step's dynamic sampler. "auto" starts at 2 (capped by the maximum) before any keep
    rate is observed; the loop sets it from the observed keep rate after the first step."""
    ds = config.dapo.dynamic_sampling
    multiplier = (
        min(2.0, ds.max_batch_multiplier) if ds.batch_multiplier == "auto" else ds.batch_multiplier
    )
    return DynamicSampler(
        num_prompts_per_step=config.dapo.num_prompts_per_step,
        batch_multiplier=float(multiplier),
        max_gen_batches=ds.max_gen_batches,
        surplus=ds.surplus,
        max_carry_age=ds.max_carry_age,
        enabled=ds.enabled,
        group_size=config.dapo.num_generations_per_prompt,
        auto_max_multiplier=ds.max_batch_multiplier if ds.batch_multiplier == "auto" else None,
    )


def round_seed(base: int, step: int, round_index: int) -> int:
    """A generation seed that depends only on (run seed, step, round): resumable."""
    return (base * 1_000_003 + step * 7919 + round_index * 104_729) % (2**31 - 1)
