"""Everything a run holds while it trains, built once from the config (and torn down once).

Building is where user errors surface: a missing model or data path, a recipe that does
not fit the cluster, a verifier that cannot start. Each becomes a ConfigError (one line
naming the key) before any worker starts when possible.

Two lifetimes: the RunContext (config, directories, tokenizer, data, samplers, verifier)
lives for the whole run; the Workers (policy ranks and rollout engines) live for one
attempt, and a worker's death replaces them all (controller/loop.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dapo_megatron.algorithms.dynamic_sampling import DynamicSampler
from dapo_megatron.algorithms.prompt_skipping import PromptSkipper, SkipRule
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.controller.actors.generation_group import Engines
from dapo_megatron.controller.actors.policy_group import PolicyGroup
from dapo_megatron.controller.rollouts.partial_rollouts import PartialRollouts
from dapo_megatron.controller.rollouts.rollout_groups import RolloutGroup
from dapo_megatron.data.datasets import EncodedPrompts, build_datasets, encode_prompts
from dapo_megatron.data.records import PromptRecord
from dapo_megatron.data.sampler import PromptSampler
from dapo_megatron.rewards import VerifierPool

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Tokenizer(Protocol):
    """What the controller uses of its tokenizer (a Hugging Face one in a run): the special
    token ids, encoding a reference answer (SFT warm-up) and decoding a response (scoring).
    Prompts are encoded once, by data.datasets.encode_prompts, before the run starts."""

    @property
    def pad_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    # A list of strings comes back only for a batch of sequences (Hugging Face's decode
    # takes both); the controller decodes one response at a time: see decode_text.
    def decode(
        self, token_ids: list[int], *, skip_special_tokens: bool = ...
    ) -> str | list[str]: ...


def decode_text(tokenizer: Tokenizer, token_ids: list[int]) -> str:
    """One response's text, special tokens left out (what the verifier reads)."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    if not isinstance(text, str):
        raise TypeError(
            f"the tokenizer decoded one sequence to a {type(text).__name__}, not a string"
        )
    return text


def eos_token_id(tokenizer: Tokenizer) -> int:
    """The tokenizer's end-of-sequence id; a ConfigError naming the key when it has none
    (generation would never stop on it and SFT answers could not end)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError(
            "policy.tokenizer_name_or_path: the tokenizer defines no eos_token_id; use a "
            "tokenizer whose special tokens include an end-of-sequence token"
        )
    return int(eos)


@dataclass(frozen=True)
class Workers:
    """The live Ray workers of one training attempt: the policy ranks and the rollout
    engines. Built together at the start of an attempt (loop.start_workers) and stopped
    together at its end; a worker that dies ends the attempt, and the next one builds new
    workers, while the RunContext carries over."""

    policy: PolicyGroup
    engines: Engines

    def stop(self) -> None:
        """Kill the engines, then the policy workers (after a failure too)."""
        try:
            self.engines.shutdown()
        finally:
            self.policy.shutdown()


@dataclass
class RunContext:
    """What lives for the whole run, across worker restarts."""

    plan: RunPlan
    """The run plan: the config and what is decided from it once (``plan.overlapped``...)."""
    run_dir: Path
    checkpoint_dir: Path
    tokenizer: Tokenizer
    train: EncodedPrompts
    val: EncodedPrompts | None
    sampler: PromptSampler
    dynamic: DynamicSampler[RolloutGroup]
    verifier: VerifierPool
    skipper: PromptSkipper = field(default_factory=lambda: PromptSkipper(None, seed=0))
    """Pre-rollout skipping (``dapo.dynamic_sampling.skip_predicted``); off: draws all."""
    partials: PartialRollouts = field(default_factory=PartialRollouts)
    """The groups a cut round aborted, continued next round (``rollout.partial_rollouts``)."""

    @property
    def config(self) -> DapoMegatronConfig:
        """The run config (``plan.config``)."""
        return self.plan.config

    @property
    def pad_id(self) -> int:
        """Padding id of batches: the tokenizer's pad token, else its EOS."""
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else eos_token_id(self.tokenizer)

    @property
    def eos_ids(self) -> list[int]:
        return [eos_token_id(self.tokenizer)]

    def reset_state(self) -> None:
        """Fresh prompt and dynamic samplers and skip history (a checkpoint, if any,
        restores them next)."""
        self.sampler = make_sampler(self.config, len(self.train.input_ids))
        self.dynamic = make_dynamic_sampler(self.plan)
        self.skipper = make_skipper(self.config)
        self.partials = PartialRollouts()

    def draw_prompts(self, count: int) -> list[int]:
        """The next ``count`` training prompts to generate: drawn in the sampler's order,
        less those the skip rule skips (they count as visited). Each prompt is generated
        with probability >= ``min_generate_prob``, so this ends after about ``count /
        min_generate_prob`` draws at worst."""
        out: list[int] = []
        while len(out) < count:
            for index in self.sampler.next_indices(count - len(out)):
                if self.skipper.decide(index) != "skip":
                    out.append(index)
        return out

    def close(self) -> None:
        """Stop the verifier (the workers are stopped by the attempt that started them)."""
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
    preset = config.policy.model_arch
    if preset is None:
        raise ConfigError(
            f"policy.model_arch: null, but policy.init_model_if_missing must create a model at "
            f"{path}; name an architecture preset (config/model_arch.py) or point "
            f"policy.model_name_or_path at a checkpoint"
        )
    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.data.tiny_model import create_tiny_model

    print(f"[setup] creating a random {preset} model at {path}", flush=True)
    create_tiny_model(path, arch=PRESETS[preset], seed=config.run.seed)


def _load_tokenizer(config: DapoMegatronConfig) -> PreTrainedTokenizerBase:
    # The pre-flight's checks (path, files, round trip), so the run fails as the dry run.
    from dapo_megatron.data.tokenizer import load_policy_tokenizer

    return load_policy_tokenizer(config.policy)


def _encode(
    records: Sequence[PromptRecord],
    tokenizer: PreTrainedTokenizerBase,
    config: DapoMegatronConfig,
    what: str,
) -> EncodedPrompts:
    encoded = encode_prompts(
        records,
        tokenizer,
        apply_chat_template=config.data.apply_chat_template,
        max_prompt_length=config.data.max_prompt_length,
        prompt_template=config.data.prompt_template,
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
    eos_token_id(tokenizer)  # fail before the data is encoded and any worker starts
    try:
        splits = build_datasets(config.data, seed=config.run.seed)
    except ConfigError:
        raise  # already names the key, the file and the line
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"data: {e}") from None
    train = _encode(splits.train.records, tokenizer, config, "training")
    val = None
    if splits.val is not None:
        records = splits.val.records[: config.validation.max_prompts or None]
        val = _encode(records, tokenizer, config, "validation")
    return RunContext(
        plan=plan,
        run_dir=plan.run_dir,
        checkpoint_dir=plan.checkpoint_dir,
        tokenizer=tokenizer,
        train=train,
        val=val,
        sampler=make_sampler(config, len(train.input_ids)),
        dynamic=make_dynamic_sampler(plan),
        skipper=make_skipper(config),
        verifier=VerifierPool(
            config.reward.verifier,
            num_workers=config.reward.num_workers,
            timeout_s=config.reward.timeout_s,
        ),
    )


def make_sampler(config: DapoMegatronConfig, num_prompts: int) -> PromptSampler:
    return PromptSampler(num_prompts, seed=config.run.seed, shuffle=config.data.shuffle)


def make_skipper(config: DapoMegatronConfig) -> PromptSkipper:
    """The skip rule of ``dapo.dynamic_sampling.skip_predicted`` (off: generate all); its
    random draws are seeded by run.seed."""
    sp = config.dapo.dynamic_sampling.skip_predicted
    if not sp.enabled:
        return PromptSkipper(None, seed=config.run.seed)
    rule = SkipRule(**{k: v for k, v in vars(sp).items() if k != "enabled"})
    return PromptSkipper(rule, seed=config.run.seed)


def make_dynamic_sampler(plan: RunPlan) -> DynamicSampler[RolloutGroup]:
    """The step's dynamic sampler. "auto" starts at 2 (capped by the maximum) before any keep
    rate is observed; the loop sets it from the observed keep rate after the first step."""
    config = plan.config
    ds = config.dapo.dynamic_sampling
    multiplier = (
        min(2.0, ds.max_batch_multiplier) if ds.batch_multiplier == "auto" else ds.batch_multiplier
    )
    return DynamicSampler(
        num_prompts_per_step=config.dapo.num_prompts_per_step,
        batch_multiplier=float(multiplier),
        max_gen_batches=ds.max_gen_batches,
        surplus=ds.surplus,
        max_carry_age=plan.max_group_age,
        enabled=ds.enabled,
        group_size=config.dapo.num_generations_per_prompt,
        auto_max_multiplier=ds.max_batch_multiplier if ds.batch_multiplier == "auto" else None,
        streaming=plan.overlapped,
    )


def round_seed(base: int, step: int, round_index: int) -> int:
    """A generation seed that depends only on (run seed, step, round): resumable."""
    return (base * 1_000_003 + step * 7919 + round_index * 104_729) % (2**31 - 1)
