"""The layer rules of docs/ARCHITECTURE.md as import contracts, checked on every CI run.

Every `import` and `from ... import` of the package's modules is read with `ast` (imports
inside functions too: a lazy import still ties the layers together), and each must be one
its package may make. A new dependency that runs back up the layers fails here, naming the
file, the line and the rule, instead of being found later by drawing the graph.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dapo_megatron"

_LOW = {"shared"}
ALLOWED: dict[str, set[str]] = {
    # ground floor
    "shared": set(),
    "device": set(_LOW),
    # pure algorithms, then the configuration that validates with them
    "algorithms": set(_LOW),
    "config": _LOW | {"algorithms"},
    "storage": _LOW | {"config"},
    "data": _LOW | {"algorithms", "config"},
    "rewards": _LOW | {"algorithms", "config"},
    "logging": _LOW | {"config", "storage"},
    # foreign-config translation (dapo-import-config, which plans what it writes);
    # config/ and planning/ never import it
    "migrate": _LOW | {"config", "planning"},
    # the dry-run planner
    "planning": _LOW | {"algorithms", "config", "data", "storage"},
    # kernels and the weight transports
    "kernels": _LOW | {"algorithms", "device"},
    "refit": _LOW | {"config", "device", "storage"},
    # the engines behind one interface (the Megatron engine lives in megatron/)
    "generation": _LOW
    | {"algorithms", "config", "data", "device", "kernels", "refit", "rewards", "storage"},
    # planning: the memory tracer's rank side (megatron/fake_trace/) records op costs in
    # planning's types; planning reaches megatron/ only through a subprocess.
    "megatron": _LOW
    | {"algorithms", "config", "data", "device", "kernels", "logging", "refit", "rewards"}
    | {"storage", "planning"},
}
_BELOW_RAY = set(ALLOWED)
ALLOWED["workers"] = _BELOW_RAY | {"megatron", "generation"}
ALLOWED["controller"] = (_BELOW_RAY - {"megatron"}) | {"workers"}  # never megatron
ENTRY_POINTS = {"cli", "prepare", "gpu_check", "__init__"}
"""Packages (and top-level modules) that may import anything."""

THIRD_PARTY: dict[str, tuple[str, ...]] = {
    # Megatron-Core only under megatron/ (the controller and the config never pay its import).
    "megatron": ("megatron/",),
    # vLLM only in the vLLM backend modules.
    "vllm": ("generation/vllm",),
    # Ray only where actors live and are driven, and the Ray object-store transport.
    "ray": ("workers/", "controller/", "refit/object_store.py", "logging/worker_logs.py"),
}
"""Top-level third-party package -> the module path prefixes (under dapo_megatron/) that may
import it."""


def _imports(path: Path, package: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``; relative imports resolved."""
    here = list(path.relative_to(package.parent).parts[:-1])  # the module's package
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            elif node.module:
                yield node.lineno, node.module


def layer_violations(package: Path = PACKAGE) -> list[str]:
    """One line per import that breaks a rule above."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        layer = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for line, module in _imports(path, package):
            top, _, rest = module.partition(".")
            where = f"dapo_megatron/{rel}:{line} imports {module}"
            if top == "dapo_megatron":
                target = rest.split(".")[0]
                if layer in ENTRY_POINTS or target == layer or not target:
                    continue
                if layer not in ALLOWED:
                    problems.append(f"{where}: package {layer!r} has no layer rule")
                elif target not in ALLOWED[layer]:
                    problems.append(f"{where}: {layer}/ may not import {target}/")
            elif (
                top in THIRD_PARTY
                and layer not in ENTRY_POINTS
                and not str(rel).startswith(THIRD_PARTY[top])
            ):
                problems.append(f"{where}: only {', '.join(THIRD_PARTY[top])} may")
    return problems


def test_every_import_keeps_to_the_layers() -> None:
    assert layer_violations() == []


def test_every_package_has_a_rule() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(packages - set(ALLOWED) - ENTRY_POINTS) == []


def test_the_layer_rules_have_no_circle() -> None:
    # Allowed edges must form a DAG, or two packages could import each other within the rules.
    state: dict[str, int] = {}

    def visit(layer: str, path: tuple[str, ...]) -> None:
        if state.get(layer) == 1:
            pytest.fail(f"circle in the rules: {' -> '.join((*path, layer))}")
        if state.get(layer) == 2:
            return
        state[layer] = 1
        for lower in ALLOWED.get(layer, ()):
            visit(lower, (*path, layer))
        state[layer] = 2

    for layer in ALLOWED:
        visit(layer, ())


def test_a_violation_is_caught(tmp_path: Path) -> None:
    # A copy of two layers where config/ imports the controller and ray: both named.
    pkg = tmp_path / "dapo_megatron"
    (pkg / "config").mkdir(parents=True)
    (pkg / "controller").mkdir()
    (pkg / "config" / "__init__.py").write_text("")
    (pkg / "controller" / "__init__.py").write_text("")
    (pkg / "config" / "bad.py").write_text(
        "from dapo_megatron.controller import loop\n\ndef f():\n    import ray\n"
    )
    (pkg / "controller" / "ok.py").write_text("from ..config import bad\nimport ray\n")
    found = layer_violations(pkg)
    assert found == [
        "dapo_megatron/config/bad.py:1 imports dapo_megatron.controller: "
        "config/ may not import controller/",
        "dapo_megatron/config/bad.py:4 imports ray: only workers/, controller/, "
        "refit/object_store.py, logging/worker_logs.py may",
    ]
