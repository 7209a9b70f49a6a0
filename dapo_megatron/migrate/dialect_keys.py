"""The mapping table: every NeMo RL, SkyRL, RLinf and verl key we translate, with its
converter and the semantic difference, joined from one module per system (nemo_keys.py,
skyrl_keys.py, rlinf_keys.py, verl_keys.py; the builders are in dialects.py), the sources'
defaults, and the lookups `foreign_key`, `all_foreign_keys` and `explain_foreign`.

docs/MIGRATING.md is this table rendered (`python -m dapo_megatron.migrate.import_config
--table`); tests/unit/migrate/test_dialects.py checks the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dapo_megatron.migrate.dialects import (
    DIALECTS,
    ForeignKey,
    Untranslatable,
    describe_settings,
)
from dapo_megatron.migrate.dialects import impact as tier_of
from dapo_megatron.migrate.nemo_keys import (
    NEMO_DEFAULTS,
    NEMO_KEYS,
    NEMO_TIERS,
)
from dapo_megatron.migrate.nemo_keys import inactive as nemo_inactive
from dapo_megatron.migrate.rlinf_keys import (
    RLINF_DEFAULTS,
    RLINF_KEYS,
    RLINF_TIERS,
)
from dapo_megatron.migrate.rlinf_keys import inactive as rlinf_inactive
from dapo_megatron.migrate.shared_keys import NEMO, RLINF, SKYRL, VERL
from dapo_megatron.migrate.skyrl_keys import (
    SKYRL_DEFAULTS,
    SKYRL_KEYS,
    SKYRL_TIERS,
)
from dapo_megatron.migrate.skyrl_keys import inactive as skyrl_inactive
from dapo_megatron.migrate.verl_keys import (
    VERL_DEFAULTS,
    VERL_KEYS,
    VERL_READS_UNRESOLVED,
    VERL_TIERS,
)
from dapo_megatron.migrate.verl_keys import inactive as verl_inactive
from dapo_megatron.shared.commands import tool_command

# ---------------------------------------------------------------------------------------
# The source's defaults for keys a config omits, and which parts of a config are live


SOURCE_DEFAULTS: dict[str, dict[str, Any]] = {
    NEMO: NEMO_DEFAULTS,
    SKYRL: SKYRL_DEFAULTS,
    RLINF: RLINF_DEFAULTS,
    VERL: VERL_DEFAULTS,
}
"""Per system, the value its code or base config gives a key that a config omits, for the
keys that change a run: an omitted key takes the source's default, never ours."""

KEY_TIERS: dict[str, dict[str, str]] = {
    NEMO: NEMO_TIERS,
    SKYRL: SKYRL_TIERS,
    RLINF: RLINF_TIERS,
    VERL: VERL_TIERS,
}
"""Per system, its keys classified by what the source does with them (dialects.impact)."""

_INACTIVE: dict[str, Callable[[Mapping[str, Any]], dict[str, str]]] = {
    NEMO: nemo_inactive,
    SKYRL: skyrl_inactive,
    RLINF: rlinf_inactive,
    VERL: verl_inactive,
}


READS_UNRESOLVED: dict[str, frozenset[str]] = {VERL: VERL_READS_UNRESOLVED}
"""Per system, keys whose converter reads a value holding an unresolved shell variable
itself (a peer's data file known by its name whatever the directory); any other key with
such a value is refused before its converter runs."""


def inactive_keys(dialect: str, flat: Mapping[str, Any]) -> dict[str, str]:
    """Source keys that are not live there (key -> why), by the system's own rule."""
    return _INACTIVE[dialect](flat)


def impact(key: str, dialect: str) -> str:
    """How much an untranslated key of `dialect` changes a run (dialects.impact)."""
    return tier_of(key, KEY_TIERS.get(dialect, {}))


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
            f"; {len(found) - 1} more {fk.system} key(s) follow: `{tool_command('dapo-import-config')} --from "
            f"{fk.dialect} FILE -o recipes/mine.yaml` translates a whole config"
        )
    try:
        tr = fk.convert(value, {})
    except Untranslatable as e:
        return f"{where}; it has no exact equivalent here: {e}{more}"
    return f"{where}; here it is {describe_settings(tr.settings, value)} ({tr.note}){more}"
