"""tests/unit mirrors the package: tests/unit/<package>/test_<module>.py holds the tests of
dapo_megatron/<package>/<module>.py (or of the sub-package <module>/), and
tests/unit/bench/test_<script>.py those of bench/<script>.py. A module renamed without its
tests fails here, naming the test file. A test file at the top of tests/unit is one of
TOP_LEVEL, each with the reason it has no package.
"""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parent
REPO = UNIT.parents[1]
PACKAGE = REPO / "dapo_megatron"

TOP_LEVEL = {
    "test_cli.py": "dapo_megatron/cli.py, a module at the top of the package",
    "test_prepare.py": "dapo_megatron/prepare.py, a module at the top of the package",
    "test_layers.py": "the import contracts between all the package's layers",
    "test_te_abi.py": "one check across config/run_plan.py, megatron/model.py and "
    "scripts/setup_gpu.sh",
    "test_one_gpu_recipes.py": "the one-GPU recipes end to end: dapo-plan and a dry run",
    "test_recipe_launch_lines.py": "the recipes' launch lines against slurm/ray.sub",
    "test_checkout_guard.py": "tests/checkout_guard.py, a helper of the test suite",
    "test_shipped_recipes.py": "tests/shipped_recipes.py, a helper of the test suite",
    "test_docs.py": "README.md and docs/: the commands and recipe names they show",
    "test_shm_hygiene.py": "tests/shm_hygiene.py, a helper of the test suite",
    "test_waits.py": "tests/waits.py, a helper of the test suite",
    "test_layout.py": "this layout",
}

# Directories of tests/unit whose tests mirror something other than dapo_megatron/<dir>.
MIRRORS = {"bench": REPO / "bench"}
# tests/unit/migrate/test_<system>_files.py: the importer on every peer file of
# tests/data/foreign/<folder>/ (their outcomes and values), one file per system.
PEER_FILES = {"nemo": "nemo-rl", "verl": "verl", "skyrl": "skyrl", "rlinf": "rlinf"}


def test_every_test_file_names_its_module() -> None:
    stale = []
    for path in sorted(UNIT.rglob("test_*.py")):
        rel = path.relative_to(UNIT)
        if len(rel.parts) == 1:
            continue
        first, *middle = rel.parts[:-1]
        module = rel.name.removeprefix("test_").removesuffix(".py")
        system = module.removesuffix("_files")
        if first == "migrate" and module.endswith("_files") and system in PEER_FILES:
            if not (REPO / "tests" / "data" / "foreign" / PEER_FILES[system]).is_dir():
                stale.append(f"tests/unit/{rel}: no tests/data/foreign/{PEER_FILES[system]}/")
            continue
        base = MIRRORS.get(first, PACKAGE / first)
        where = base.joinpath(*middle, module)
        if not (where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()):
            shown = where.relative_to(REPO)
            stale.append(f"tests/unit/{rel}: no {shown}.py or {shown}/")
    assert stale == []


def test_top_level_test_files_are_the_listed_ones() -> None:
    top = {p.name for p in UNIT.glob("test_*.py")}
    assert top - set(TOP_LEVEL) == set(), "put these under tests/unit/<package>/"
    assert set(TOP_LEVEL) - top == set(), "listed but gone: drop them from TOP_LEVEL"


def test_every_test_directory_is_a_package() -> None:
    # tests/unit is the package `unit` (tests/ is on sys.path): test files in different
    # directories may share a basename (unit.config.test_x, unit.data.test_x).
    directories = {p.parent for p in UNIT.rglob("test_*.py")} | {UNIT}
    assert sorted(str(d) for d in directories if not (d / "__init__.py").is_file()) == []


def test_every_test_file_the_code_and_docs_name_exists() -> None:
    # A docstring that names a test file ("... compares them") must point at a file: tests
    # move with the modules they test, and a stale pointer hides where the check went.
    import re

    pattern = re.compile(r"tests/[a-z_/]+/test_[a-z0-9_]+\.py")
    texts = [REPO / "README.md", *PACKAGE.rglob("*.py"), *(REPO / "scripts").glob("*")]
    texts += [*(REPO / "docs").rglob("*.md"), *(REPO / "tests").rglob("*.py")]
    missing = sorted(
        f"{path.relative_to(REPO)}: {ref}"
        for path in texts
        if path.is_file()
        for ref in pattern.findall(path.read_text(encoding="utf-8", errors="replace"))
        if not (REPO / ref).is_file()
    )
    assert missing == []


# Paths the code and docs name that are other projects' files, in directories named like our
# packages (verl's workers/, NeMo RL's algorithms/ and data/, RLinf's rewards/), or files
# tests/unit/test_layers.py writes into a scratch copy of the package.
NOT_OURS = {
    "algorithms/grpo.py",  # NeMo RL
    "algorithms/utils.py",  # NeMo RL
    "data/datasets/processed_dataset.py",  # NeMo RL
    "data/processors.py",  # NeMo RL
    "data/utils.py",  # NeMo RL
    "rewards/math/__init__.py",  # RLinf
    "workers/actor/megatron_actor.py",  # verl
    "workers/actor/megatron_actor_worker.py",  # RLinf
    "workers/config/engine.py",  # verl
    "workers/megatron/megatron_model_wrapper.py",  # SkyRL
    "workers/reward_manager/dapo.py",  # verl
    "dapo_megatron/config/bad.py",  # test_layers.py's scratch module
    "dapo_megatron/controller/actors/bad.py",  # test_layers.py's scratch module
}


def test_every_module_the_code_and_docs_name_exists() -> None:
    # Docstrings point at modules by path, from the repository (dapo_megatron/config/loader.py)
    # or from the package (config/loader.py); a module moved without them leaves the reader
    # looking for a file that is gone (the importer once moved from config/ to migrate/).
    import re

    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    # Not after a `/`, `.` or word character: nemo_rl/algorithms/utils.py is NeMo RL's; not
    # megatron/core/..., Megatron-Core's own files.
    pattern = re.compile(
        r"(?<![\w/.-])(?:dapo_megatron/)?(?!megatron/core/)(?:"
        + "|".join(packages)
        + r")/(?:\w+/)*\w+\.py\b"
    )
    texts = [REPO / "README.md", REPO / "slurm" / "README.md", *PACKAGE.rglob("*.py")]
    texts += [*(REPO / "docs").rglob("*.md"), *(REPO / "tests").rglob("*.py")]
    texts += [*(REPO / "bench").rglob("*.py"), *(REPO / "scripts").glob("*")]
    texts += [*(REPO / "configs").glob("*.yaml"), *(REPO / "recipes").rglob("*.yaml")]

    def exists(ref: str) -> bool:
        rel = ref.removeprefix("dapo_megatron/")
        # A test file named from tests/unit (planning/test_memory.py) is a test's neighbour.
        return (PACKAGE / rel).is_file() or (UNIT / rel).is_file() or ref in NOT_OURS

    missing = sorted(
        f"{path.relative_to(REPO)}: {ref}"
        for path in texts
        if path.is_file()
        for ref in pattern.findall(path.read_text(encoding="utf-8", errors="replace"))
        if not exists(ref)
    )
    assert missing == []
