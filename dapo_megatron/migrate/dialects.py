"""The foreign vocabularies: NeMo RL, SkyRL, RLinf and verl keys, and what they are here.

This module holds the entry builders and the tier classifier; the table (`FOREIGN_KEYS`) and
its lookups are in dialect_keys.py. One table serves both the loader's "unknown key" errors
(`explain_foreign`, registered with config/foreign_hint.py) and `dapo-import-config`
(`translate`), so an error and an import can never disagree. Each entry converts a foreign value into our settings; where the meaning
differs the converter changes the value (and says how), and where there is no exact
equivalent it raises `Untranslatable` with what differs and what to set instead.

Semantic notes were read from the peers' code, not only their docs: e.g. NeMo RL counts a
generation round before checking `rounds <= dynamic_sampling_max_gen_batches`, so N allows
N + 1 rounds.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dapo_megatron.config.foreign_hint import flatten
from dapo_megatron.config.model_arch import preset_for_model

DIALECTS: dict[str, str] = {
    "nemo-rl": "NeMo RL",
    "skyrl": "SkyRL",
    "rlinf": "RLinf",
    "verl": "verl",
}
"""Dialect id (the --from value) -> the system's name as its users write it."""


class Untranslatable(Exception):
    """A foreign value with no exact equivalent here; the message says what differs and
    what to set instead."""


@dataclass(frozen=True)
class Translation:
    """Our settings for one foreign key's value."""

    settings: tuple[tuple[str, Any], ...]
    """(our dotted key, our value) pairs, in the order they should be written."""
    note: str
    """Why these values: "same meaning: ..." or what was converted and how."""


Converter = Callable[[Any, Mapping[str, Any]], Translation]
"""(foreign value, every foreign key of the same source, flat) -> our settings; raises
Untranslatable. The mapping lets a converter read a sibling key (verl's gen_batch_size needs
train_batch_size); the loader's errors pass an empty one."""


@dataclass(frozen=True)
class ForeignKey:
    """One key of a peer system's config and how it maps to ours."""

    dialect: str
    """Dialect id, a key of DIALECTS."""
    key: str
    """The foreign dotted key as that system's configs write it."""
    ours: str
    """Our key(s) it sets, for the migration table; a description when there is none."""
    difference: str
    """The semantic difference, for the migration table ("same meaning" when none)."""
    convert: Converter
    """The value converter."""

    @property
    def system(self) -> str:
        """The system's display name."""
        return DIALECTS[self.dialect]


# ---------------------------------------------------------------------------------------
# Entry builders: the table reads as data, the converters stay small and typed.


def _fill(text: str, value: Any, out: Any = None) -> str:
    """A note with its placeholders filled: {v} = the foreign value, {out} = ours."""
    return text.replace("{v}", _show(value)).replace("{out}", _show(out))


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def same(dialect: str, key: str, ours: str, why: str = "same meaning") -> ForeignKey:
    """A key whose value means the same here: copied unchanged. A null is refused unless
    our key takes null too: a null there means whatever that system falls back to, which
    is a table entry of its own (e.g. RLinf's clip_ratio_low), never "our default"."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        if value is None and ours not in nullable_keys():
            raise Untranslatable(
                f"null there means {DIALECTS[dialect]}'s own fallback, which this importer "
                f"does not know for this key; set {ours} by hand"
            )
        return Translation(((ours, value),), _fill(why, value))

    return ForeignKey(dialect, key, ours, _table_text(why, key, ours), convert)


def mapped(
    dialect: str,
    key: str,
    ours: str,
    difference: str,
    fn: Callable[[Any, Mapping[str, Any]], Any],
) -> ForeignKey:
    """A key whose value is converted by `fn` (which may raise Untranslatable)."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        out = fn(value, ctx)
        return Translation(((ours, out),), _fill(difference, value, out))

    return ForeignKey(dialect, key, ours, _table_text(difference, key, ours), convert)


def choice(
    dialect: str, key: str, ours: str, table: Mapping[Any, Any], difference: str = "same meaning"
) -> ForeignKey:
    """A key whose values are names: each known name maps to ours, others are refused."""

    def fn(value: Any, ctx: Mapping[str, Any]) -> Any:
        if isinstance(value, Hashable) and value in table:
            return table[value]
        known = ", ".join(_show(k) for k in table)
        raise Untranslatable(f"{_show(value)} has no counterpart here (known: {known})")

    names = ", ".join(f"{_show(k)} -> {_show(v)}" for k, v in table.items())
    return mapped(dialect, key, ours, f"{difference} ({names})", fn)


def custom(dialect: str, key: str, ours: str, difference: str, convert: Converter) -> ForeignKey:
    """A key with a converter of its own (several settings, a sibling key, a refusal)."""
    return ForeignKey(dialect, key, ours, _table_text(difference, key, ours), convert)


def as_here(
    dialect: str,
    key: str,
    feature: str,
    accept: Callable[[Any, Mapping[str, Any]], bool],
    here: str,
) -> ForeignKey:
    """A key of a feature whose values in `accept` do what we always do (the feature off,
    or its setting equal to our fixed behaviour): carried with nothing to set. Any other
    value needs `feature`, which we lack: refused naming the feature. `here` says what we
    do instead (shown in the note and the table)."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        if accept(value, ctx):
            return Translation((), f"same as here: {here}")
        raise Untranslatable(f"needs {feature}, which dapo-megatron lacks (here: {here})")

    return custom(dialect, key, f"(none: {feature})", f"only values that mean: {here}", convert)


def off(*values: Any) -> Callable[[Any, Mapping[str, Any]], bool]:
    """An `as_here` predicate: the value is one of `values` (compared by type and value,
    so 0 never matches False)."""

    def accept(value: Any, ctx: Mapping[str, Any]) -> bool:
        return any(type(value) is type(v) and value == v for v in values)

    return accept


def _table_text(text: str, key: str, ours: str) -> str:
    """A note as the migration table shows it: placeholders become the keys' names."""
    leaf = ours.split(" ")[0].rsplit(".", 1)[-1]
    return text.replace("{v}", f"`{key.rsplit('.', 1)[-1]}`").replace("{out}", f"`{leaf}`")


# ---------------------------------------------------------------------------------------
# Converters several systems share


def as_int(value: Any) -> int:
    """An int (not a bool), or Untranslatable."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Untranslatable(f"{value!r} is not an integer")
    return value


_MODEL_NAME = re.compile(r"(~|\.{1,2})?/?[\w.+-]+(/[\w.+-]+)*/?")
"""A hub id (`org/name`) or a path without spaces or a URL scheme: anything else (e.g.
NeMo RL's placeholder "Follow instructions in https://...") is text, not a model."""


UNSUPPORTED_FAMILIES: tuple[tuple[str, str], ...] = (
    ("deepseek", "the DeepSeek-V2/V3 architecture (multi-head latent attention, shared experts)"),
    ("moonlight", "the DeepSeek-V3 architecture of Moonlight (multi-head latent attention)"),
    ("kimi", "the DeepSeek-V3 architecture of Kimi (multi-head latent attention)"),
    ("nemotron", "the Nemotron-H hybrid Mamba architecture"),
    ("gpt-oss", "the gpt-oss architecture (attention sinks, MXFP4 experts)"),
    ("glm", "the GLM architecture"),
    ("qwen3.5", "the Qwen3.5 architecture (gated delta-net attention)"),
    ("qwen3.6", "the Qwen3.6 architecture (gated delta-net attention)"),
    ("qwen3-next", "the Qwen3-Next architecture (gated delta-net attention)"),
    ("qwen3next", "the Qwen3-Next architecture (gated delta-net attention)"),
    ("qwen3-vl", "vision-language models (Qwen3-VL)"),
    ("qwen2.5-vl", "vision-language models (Qwen2.5-VL)"),
    ("qwen2_5_vl", "vision-language models (Qwen2.5-VL)"),
    ("omni", "audio/vision models (Omni)"),
    ("mimo", "the MiMo architecture (multi-token prediction layers)"),
    ("gemma", "the Gemma architecture"),
    ("mistral", "the Mistral architecture"),
    ("mixtral", "the Mixtral architecture"),
    ("phi", "the Phi architecture"),
)
"""Name fragments of model families the policy cannot be built from (config/model_arch.py
SUPPORTED_FAMILIES are Qwen2/2.5, Llama 3, Qwen3 and Qwen3-MoE), with the feature each
needs: an import of such a model is refused naming it, never planned as another model."""


def unsupported_family(name: str) -> str | None:
    """The feature a model of this name needs that we lack, or None."""
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    if "distill-qwen" in base or "distill-llama" in base:
        return None  # DeepSeek-R1's distilled models are Qwen2 and Llama checkpoints
    for fragment, feature in UNSUPPORTED_FAMILIES:
        if fragment in base:
            return feature
    return None


def hub_model(key: str, dialect: str) -> ForeignKey:
    """A Hugging Face hub id or a local path, the same here: a hub id is downloaded by the
    first `dapo-train` (or `dapo-prepare` on a cluster without internet,
    docs/guides/data.md), and a matching architecture preset lets dapo-plan plan it before.
    A model of a family the policy cannot be built from is refused naming that family."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        if not isinstance(value, str) or not _MODEL_NAME.fullmatch(value):
            raise Untranslatable(
                f"{_show(value)!r} is neither a hub id (org/name) nor a path; "
                "set policy.model_name_or_path by hand"
            )
        lacking = unsupported_family(value)
        if lacking is not None:
            raise Untranslatable(
                f"{value} needs {lacking}, which dapo-megatron lacks (the policy is built for "
                "Qwen2/2.5, Llama 3, Qwen3 and Qwen3-MoE)"
            )
        settings: list[tuple[str, Any]] = [("policy.model_name_or_path", value)]
        if value.startswith(("/", ".", "~")):
            note = "same meaning: a local checkpoint directory"
        else:
            note = (
                "same meaning: a hub id, downloaded by the first dapo-train "
                "(dapo-prepare where there is no internet)"
            )
        preset = _preset(value.rstrip("/").rsplit("/", 1)[-1])
        if preset is not None:
            settings.append(("policy.model_arch", preset))
            note += f"; preset {preset} plans the run before the checkpoint is there"
        return Translation(tuple(settings), note)

    return custom(
        dialect,
        key,
        "policy.model_name_or_path (+ policy.model_arch)",
        "same meaning (a hub id is downloaded by the first dapo-train); the architecture "
        "preset of that name when there is one; a family we cannot build is refused",
        convert,
    )


def _preset(base: str) -> str | None:
    """The preset a hub model's name names: the matcher dapo-plan and dapo-train use
    (config/model_source.py), so an imported recipe plans the model its name says."""
    return preset_for_model(base)


def kl_estimator(dialect: str, key: str) -> ForeignKey:
    return choice(
        dialect,
        key,
        "dapo.loss.kl_estimator",
        {"low_var_kl": "k3", "k3": "k3", "kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2"},
        "same estimators (Schulman's k1/k2/k3; low_var_kl is k3, clamped to [-10, 10] "
        "there, not here); `abs` and `full` have none",
    )


def same_agg(dialect: str, key: str) -> ForeignKey:
    names = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
    return choice(
        dialect, key, "dapo.loss.loss_agg_mode", {n: n for n in names}, "same names, same meaning"
    )


def policy_mini_batch(dialect: str, key: str, n_key: str) -> ForeignKey:
    """Their mini-batch counts prompts; ours (train_global_batch_size) counts samples."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        prompts = as_int(value)
        n = ctx.get(n_key)
        if not isinstance(n, int) or isinstance(n, bool):
            raise Untranslatable(
                f"{dialect} counts this mini-batch in prompts, ours "
                f"(policy.train_global_batch_size) in samples: set it to {prompts} x {n_key}"
            )
        return Translation(
            (("policy.train_global_batch_size", prompts * n),),
            f"converted: {prompts} prompts x {n} samples ({n_key}); ours counts samples",
        )

    return custom(
        dialect,
        key,
        "policy.train_global_batch_size",
        f"prompts there, samples here: converted to {{v}} x `{n_key.rsplit('.', 1)[-1]}`",
        convert,
    )


def kl_coef(dialect: str, key: str, switch: str) -> ForeignKey:
    """A KL loss coefficient that only applies while the system's KL-loss switch is on."""

    def convert(value: Any, ctx: Mapping[str, Any]) -> Translation:
        if ctx.get(switch, True) is False:
            # Not live there: the switch's own entry writes kl_coef 0.
            return Translation((), f"not live: {switch} is false (no KL loss, as here)")
        return Translation(
            (("dapo.loss.kl_coef", value),),
            "same meaning: a KL loss term against the reference policy",
        )

    return custom(
        dialect,
        key,
        "dapo.loss.kl_coef",
        f"same meaning while `{switch.rsplit('.', 1)[-1]}` is true",
        convert,
    )


def kl_switch(dialect: str, key: str) -> ForeignKey:
    def fn(value: Any, ctx: Mapping[str, Any]) -> Any:
        if value is True:
            raise Untranslatable(
                "here the KL loss is on when dapo.loss.kl_coef > 0: set dapo.loss.kl_coef"
            )
        return 0.0

    return mapped(dialect, key, "dapo.loss.kl_coef", "false: dapo.loss.kl_coef = 0", fn)


def sampling_top_k(value: Any, ctx: Mapping[str, Any]) -> int:
    return -1 if value is None or value == 0 else as_int(value)


def warmup_in_optimizer_steps(
    dialect: str, unit: str, iters: int, per_unit: Callable[[], tuple[int, str]]
) -> tuple[int, str]:
    """A warm-up of `iters` `unit`s of a system that steps its lr schedule once per unit,
    after that unit's optimizer steps, as our policy.scheduler.lr_warmup_steps with the
    note. The import writes policy.scheduler.unit train_step for such a system
    (import_config.SCHEDULE_PER_TRAIN_STEP), so the count carries over unchanged and each
    of a unit's k optimizer steps (`per_unit()`: k and k in words) trains at one lr, as
    there (megatron/optimizer.py ScheduleClock)."""
    if iters < 0:
        raise Untranslatable(f"{iters}: a warm-up length cannot be negative")
    if iters == 0:
        return 0, "no warm-up, as here"
    k, per_step = per_unit()
    if k == 1:
        return iters, f"same count: {iters} {unit}s, each one optimizer step ({per_step})"
    return iters, (
        f"same count: {iters} {unit}s of {k} optimizer steps each ({per_step}); one lr over "
        f"each {unit}'s {k} steps, as {DIALECTS[dialect]} (policy.scheduler.unit train_step)"
    )


# ---------------------------------------------------------------------------------------
# Our keys that take null, and how much an untranslated key changes a run


@functools.cache
def nullable_keys() -> frozenset[str]:
    """Our keys whose base value is null (null is a meaning of ours there)."""
    base = Path(__file__).resolve().parents[2] / "configs" / "dapo_base.yaml"
    tree = yaml.safe_load(base.read_text(encoding="utf-8"))
    return frozenset(k for k, v in flatten(tree).items() if v is None)


IMPACT_ALGORITHM = "algorithm"
IMPACT_LAYOUT = "layout"
IMPACT_HARMLESS = "harmless"
IMPACT_TITLES = {
    IMPACT_ALGORITHM: "changes the algorithm, the data or the model (what is learned)",
    IMPACT_LAYOUT: "changes the layout, speed or memory (not what is learned)",
    IMPACT_HARMLESS: "logging, naming and bookkeeping only (or not live in the source)",
}
"""Tiers of an untranslated key, most important first; the first two refuse the import."""

_HARMLESS = re.compile(
    r"(^|[._])(logger|logging|log_dir|log_\w+|wandb\w*|tensorboard\w*|mlflow\w*|swanlab\w*|"
    r"project_name|experiment_name|run_name|tags?|notes|print\w*|profil\w*|nsys\w*|"
    r"debug\w*|timeline\w*|dump\w*|trace\w*|ray_init|runtime_env|num_cpus|"
    r"dataloader_num_workers|num_workers|max_ckpt_to_keep|max_actor_ckpt_to_keep|"
    r"max_critic_ckpt_to_keep|del_local_ckpt_after_load|resume_\w+|resume|hdfs_dir|"
    r"default_hdfs_dir|val_only|log_val_generations|log_prob_\w*|progress\w*|"
    r"monitor\w*|metrics?\w*|save_\w*path|output_dir|hf_cache\w*|cache_dir|"
    r"checkpoint_must_save_by|keep_top_k|higher_is_better|metric_name|model_save_format|"
    r"save_optimizer|save_consolidated|validate\w*|use_torch_compile|seed)($|[._])"
)
"""No bare `name`: `model_name`, `dataset_name`, `tokenizer.name`, `optimizer.name` and
`adv_estimator.name` choose what is learned; a run's name is caught by logger, wandb,
project_name, experiment_name or run_name."""
_LAYOUT = re.compile(
    r"(parallel|_tp_|tp_size|pp_size|cp_size|ep_size|megatron|fsdp|dtensor|offload|"
    r"micro_batch|max_token_len|token_len_per_gpu|gpu_memory|memory|dtype|precision|"
    r"recompute|activation_checkpointing|gradient_checkpointing|sequence_packing|"
    r"dynamic_batch|use_dynamic_bsz|use_remove_padding|placement|num_nodes|nnodes|gpus|"
    r"n_gpus|colocat|enforce_eager|cuda_graph|max_num_seqs|max_num_batched_tokens|"
    r"chunked_prefill|fused|kernel|async|overlap|bucket|nccl|backend|engine|"
    r"world_size|ulysses|num_engines|load_format|free_cache|prefix_caching|"
    r"sharding|distributed_optimizer|flash_attn|attn_implementation|liger|"
    r"make_sequence_length_divisible_by|weight_sync|refit|batch_size_per_gpu|"
    r"logprob_batch_size|forward_micro|enable_chunked|disable_log|timeout)",
    re.I,
)


def impact(key: str, tiers: Mapping[str, str]) -> str:
    """How much a source key changes a run: its entry in `tiers` (a system's own
    classification, key or subtree ending in ".") when it has one, else IMPACT_HARMLESS for
    logging, names and bookkeeping, IMPACT_LAYOUT for parallelism, memory and speed knobs,
    else IMPACT_ALGORITHM (a key not recognised is assumed to change what is learned)."""
    for known, tier in tiers.items():
        if key == known or (known.endswith(".") and key.startswith(known)):
            return tier
    if _HARMLESS.search(key):
        return IMPACT_HARMLESS
    if _LAYOUT.search(key):
        return IMPACT_LAYOUT
    return IMPACT_ALGORITHM


def describe_settings(settings: tuple[tuple[str, Any], ...], value: Any) -> str:
    """`our.key` when the value carries over unchanged, else `our.key=value` pairs."""
    if len(settings) == 1 and settings[0][1] == value and type(settings[0][1]) is type(value):
        return settings[0][0]
    return " and ".join(f"{k}={_show(v)}" for k, v in settings)
