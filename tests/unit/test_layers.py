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


# Inside controller/: the actors apart from rollout production, the run context and the loop
# above both (docs/ARCHITECTURE.md, "Layers"). A part is a subpackage or a top module.
CONTROLLER_ALLOWED: dict[str, set[str]] = {
    # the Ray actors and their groups know nothing of rollouts, the context or the loop
    "actors": set(),
    # rollout production drives the actors and reads the run's context
    "rollouts": {"actors", "context"},
    # the run's state: the actors' handles, and CONTEXT_HOLDS below
    "context": {"actors"},
    "loop": {"actors", "context", "rollouts"},
    "__init__": set(),
}
CONTEXT_HOLDS = {"rollouts.partial_rollouts", "rollouts.rollout_groups"}
"""Rollout production's state the run context holds; these import nothing of controller/,
so context -> rollouts -> context never closes a circle (checked below)."""


def controller_violations(package: Path = PACKAGE) -> list[str]:
    """One line per import inside controller/ that breaks ``CONTROLLER_ALLOWED``."""
    controller = package / "controller"
    problems = []
    for path in sorted(controller.rglob("*.py")):
        rel = path.relative_to(controller)
        part = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        name = ".".join((*rel.parts[:-1], rel.stem))
        for line, module in _imports(path, package):
            prefix = "dapo_megatron.controller."
            if not module.startswith(prefix):
                continue
            target_module = module.removeprefix(prefix)
            target = target_module.split(".")[0]
            where = f"dapo_megatron/controller/{rel}:{line} imports {module}"
            if target == part:
                continue
            if part not in CONTROLLER_ALLOWED:
                problems.append(f"{where}: controller part {part!r} has no rule")
            elif name in CONTEXT_HOLDS:
                problems.append(f"{where}: {name} is held by the context: no controller import")
            elif part == "context" and target_module in CONTEXT_HOLDS:
                continue
            elif target not in CONTROLLER_ALLOWED[part]:
                problems.append(f"{where}: controller/{part} may not import controller/{target}")
    return problems


def test_controller_parts_keep_to_their_rules() -> None:
    assert controller_violations() == []


def test_controller_rules_have_no_circle_and_every_part_has_one() -> None:
    controller = PACKAGE / "controller"
    parts = {p.stem if p.is_file() else p.name for p in controller.iterdir()}
    parts -= {"__pycache__"}
    assert sorted(parts - set(CONTROLLER_ALLOWED)) == []
    done: set[str] = set()

    def visit(part: str, path: tuple[str, ...]) -> None:
        if part in path:
            pytest.fail(f"circle in the controller rules: {' -> '.join((*path, part))}")
        if part not in done:
            for lower in CONTROLLER_ALLOWED[part]:
                visit(lower, (*path, part))
            done.add(part)

    for part in CONTROLLER_ALLOWED:
        visit(part, ())


def test_controller_is_shallow() -> None:
    # One level of subpackages: no module deeper than controller/<part>/<module>.py.
    root = PACKAGE / "controller"
    assert [str(p) for p in root.rglob("*.py") if len(p.relative_to(root).parts) > 2] == []


def test_a_controller_violation_is_caught(tmp_path: Path) -> None:
    # actors/ importing rollout production, and a module the context holds importing back.
    pkg = tmp_path / "dapo_megatron"
    for sub in ("controller/actors", "controller/rollouts"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "controller" / "__init__.py").write_text("")
    (pkg / "controller" / "actors" / "bad.py").write_text(
        "from dapo_megatron.controller.rollouts import steps\n"
    )
    (pkg / "controller" / "rollouts" / "rollout_groups.py").write_text(
        "from ..context import RunContext\n"
    )
    (pkg / "controller" / "context.py").write_text(
        "from dapo_megatron.controller.rollouts.rollout_groups import RolloutGroup\n"
    )
    assert controller_violations(pkg) == [
        "dapo_megatron/controller/actors/bad.py:1 imports dapo_megatron.controller.rollouts: "
        "controller/actors may not import controller/rollouts",
        "dapo_megatron/controller/rollouts/rollout_groups.py:1 imports "
        "dapo_megatron.controller.context: rollouts.rollout_groups is held by the context: "
        "no controller import",
    ]
