"""What the loader needs from the foreign-config translation, without importing it.

The translation (NeMo RL, SkyRL, RLinf and verl keys -> ours) lives in dapo_megatron/migrate/,
which sits above config/. The loader's "unknown key" error still names another system's key
and our equivalent: migrate/ registers its explainer here when it is imported (the
entry points import it), and with none registered the loader's plain message stands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Explainer = Callable[[Mapping[str, Any], str], "str | None"]
_EXPLAINERS: list[Explainer] = []


def register_foreign_explainer(explainer: Explainer) -> None:
    """Add `explainer(flat, source) -> message or None` (idempotent)."""
    if explainer not in _EXPLAINERS:
        _EXPLAINERS.append(explainer)


def explain_foreign(flat: Mapping[str, Any], source: str) -> str | None:
    """The first registered explainer's one-line error for a foreign key among `flat`
    (dotted key -> value), or None."""
    for explainer in _EXPLAINERS:
        message = explainer(flat, source)
        if message is not None:
            return message
    return None


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> {dotted key: leaf value}, in order (an empty mapping is a leaf)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat
