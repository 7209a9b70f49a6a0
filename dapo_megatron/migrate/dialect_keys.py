"""The mapping table: every NeMo RL, SkyRL, RLinf and verl key we translate, with its
converter and the semantic difference, joined from one module per system (nemo_keys.py,
skyrl_keys.py, rlinf_keys.py, verl_keys.py; the builders are in dialects.py), the sources'
defaults, and the lookups `foreign_key`, `all_foreign_keys` and `explain_foreign`.

docs/MIGRATING.md is this table rendered (`python -m dapo_megatron.migrate.import_config
--table`); tests/unit/migrate/test_dialects.py checks the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    DIALECTS,
    ForeignKey,
    Untranslatable,
    describe_settings,
)
from dapo_megatron.migrate.nemo_keys import NEMO_KEYS
from dapo_megatron.migrate.rlinf_keys import RLINF_KEYS
from dapo_megatron.migrate.shared_keys import NEMO, RLINF, SKYRL, VERL
from dapo_megatron.migrate.skyrl_keys import SKYRL_KEYS
from dapo_megatron.migrate.verl_keys import VERL_ACTOR, VERL_KEYS, VERL_ROLLOUT

# ---------------------------------------------------------------------------------------
# The source's defaults for keys a config omits, and which parts of a config are live


SOURCE_DEFAULTS: dict[str, dict[str, Any]] = {
    # verl/trainer/config/_generated_ppo_megatron_trainer.yaml (actor, rollout, trainer) and
    # verl-recipe dapo/config/dapo_trainer.yaml (filter_groups, overlong_buffer_cfg).
    VERL: {
        f"{VERL_ACTOR}.clip_ratio_low": 0.2,
        f"{VERL_ACTOR}.clip_ratio_high": 0.2,
        f"{VERL_ACTOR}.clip_ratio_c": 3.0,
        f"{VERL_ACTOR}.loss_agg_mode": "token-mean",
        f"{VERL_ACTOR}.entropy_coeff": 0,
        f"{VERL_ACTOR}.use_kl_loss": False,
        f"{VERL_ACTOR}.optim.lr": 1.0e-6,
        f"{VERL_ACTOR}.optim.lr_warmup_steps": -1,
        f"{VERL_ACTOR}.optim.lr_warmup_steps_ratio": 0.0,
        f"{VERL_ACTOR}.optim.weight_decay": 0.01,
        f"{VERL_ACTOR}.optim.clip_grad": 1.0,
        f"{VERL_ACTOR}.ppo_epochs": 1,
        f"{VERL_ACTOR}.ppo_mini_batch_size": 256,
        f"{VERL_ROLLOUT}.n": 1,
        f"{VERL_ROLLOUT}.temperature": 1.0,
        f"{VERL_ROLLOUT}.top_p": 1.0,
        f"{VERL_ROLLOUT}.top_k": -1,
        f"{VERL_ROLLOUT}.val_kwargs.n": 1,
        f"{VERL_ROLLOUT}.val_kwargs.temperature": 0,
        f"{VERL_ROLLOUT}.val_kwargs.top_p": 1.0,
        f"{VERL_ROLLOUT}.val_kwargs.do_sample": False,
        "data.train_batch_size": 1024,
        "data.max_prompt_length": 512,
        "data.max_response_length": 512,
        "algorithm.filter_groups.enable": False,
        "reward.reward_kwargs.overlong_buffer_cfg.enable": False,
        "trainer.save_freq": -1,
        "trainer.test_freq": -1,
    },
    # skyrl/train/config/config.py (the dataclass defaults).
    SKYRL: {
        "trainer.algorithm.eps_clip_low": 0.2,
        "trainer.algorithm.eps_clip_high": 0.2,
        "trainer.algorithm.policy_loss_type": "regular",
        "trainer.algorithm.loss_reduction": "token_mean",
        "trainer.algorithm.dynamic_sampling.type": None,
        "trainer.policy.optimizer_config.lr": 1.0e-6,
        "trainer.policy.optimizer_config.num_warmup_steps": 0,
        "generator.apply_overlong_filtering": False,
        "generator.sampling_params.max_generate_length": 1024,
    },
    # RLinf: rlinf/workers/actor/megatron_actor_worker.py reads clip_ratio_low/high with
    # .get() (absent = null = ratio_clip_eps).
    RLINF: {
        "algorithm.clip_ratio_low": None,
        "algorithm.clip_ratio_high": None,
    },
    # NeMo RL: examples/configs/grpo_math_1B.yaml is the parent of its recipes and sets
    # these itself; nothing is added for a config read with its parent.
    NEMO: {},
}
"""Per system, the value its code or base config gives a key that a config omits, for the
keys that change a run: an omitted key takes the source's default, never ours."""


def inactive_keys(dialect: str, flat: Mapping[str, Any]) -> dict[str, str]:
    """Source keys that are not live there (key -> why): NeMo RL reads policy.megatron_cfg
    only with megatron_cfg.enabled true, and then neither dtensor_cfg nor policy.optimizer
    / policy.scheduler (the Megatron worker builds its optimizer from megatron_cfg); RLinf
    reads actor.model's Megatron layout only with actor.training_backend megatron. NeMo
    RL's reward_shaping.max_response_length is read only by the shaping (reward_functions.py)
    and caps nothing while grpo.reward_shaping.enabled is not true; ours is the engine's cap."""
    dead: dict[str, str] = {}
    if dialect == NEMO:
        shaping = "grpo.reward_shaping.max_response_length"
        if shaping in flat and flat.get("grpo.reward_shaping.enabled") is not True:
            dead[shaping] = "not live: grpo.reward_shaping.enabled is not true"
        megatron = flat.get("policy.megatron_cfg.enabled") is True
        for key in flat:
            if megatron and key.startswith(
                ("policy.dtensor_cfg.", "policy.optimizer.", "policy.scheduler.")
            ):
                dead[key] = "not live: policy.megatron_cfg.enabled is true (Megatron's optimizer)"
            elif megatron and key in ("policy.optimizer", "policy.scheduler"):
                dead[key] = "not live: policy.megatron_cfg.enabled is true"
            elif not megatron and key.startswith("policy.megatron_cfg."):
                dead[key] = "not live: policy.megatron_cfg.enabled is not true"
    return dead


FOREIGN_KEYS: tuple[ForeignKey, ...] = NEMO_KEYS + SKYRL_KEYS + RLINF_KEYS + VERL_KEYS
"""The whole table, NeMo RL first: a key two systems share is explained as the first's."""


# ---------------------------------------------------------------------------------------
# Lookups


def _index(keys: Iterable[ForeignKey]) -> dict[tuple[str, str], ForeignKey]:
    index: dict[tuple[str, str], ForeignKey] = {}
    for fk in keys:
        if fk.dialect not in DIALECTS:
            raise ValueError(f"{fk.key}: unknown dialect {fk.dialect!r}")
        if (fk.dialect, fk.key) in index:
            raise ValueError(f"{fk.system} key {fk.key} is in the table twice")
        index[(fk.dialect, fk.key)] = fk
    return index


def foreign_key(key: str, dialect: str | None = None) -> ForeignKey | None:
    """The table entry of a foreign dotted key (Hydra's `+`/`++` prefix ignored); with no
    dialect, the first system that has it."""
    bare = key.lstrip("+")
    for fk in FOREIGN_KEYS:
        if fk.key == bare and (dialect is None or fk.dialect == dialect):
            return fk
    return None


def all_foreign_keys() -> tuple[ForeignKey, ...]:
    """The whole table, checked for duplicates."""
    _index(FOREIGN_KEYS)
    return FOREIGN_KEYS


def explain_foreign(flat: Mapping[str, Any], source: str) -> str | None:
    """The one-line error for the first foreign key among `flat` (dotted key -> value, the
    unknown part of a recipe or one override), or None when none is known.

    Translated: `KEY in SOURCE is SYSTEM's name; here it is OURS (note)`; no exact
    equivalent: `...; it has no exact equivalent here: what differs; what to set`.
    """
    found = [(k, v, fk) for k, v in flat.items() if (fk := foreign_key(k)) is not None]
    if not found:
        return None
    key, value, fk = found[0]
    where = f"{key.lstrip('+')} in {source} is {fk.system}'s name"
    more = ""
    if len(found) > 1:
        more = (
            f"; {len(found) - 1} more {fk.system} key(s) follow: `dapo-import-config --from "
            f"{fk.dialect} FILE -o recipes/mine.yaml` translates a whole config"
        )
    try:
        tr = fk.convert(value, {})
    except Untranslatable as e:
        return f"{where}; it has no exact equivalent here: {e}{more}"
    return f"{where}; here it is {describe_settings(tr.settings, value)} ({tr.note}){more}"
