"""dapo-prepare: fetch everything a recipe names on the Hugging Face hub, before the run.

On a cluster whose compute nodes have no internet, run this on a login node with the run's
recipe and overrides::

    dapo-prepare --config recipes/dapo-qwen3-8b-1n8g-tp4pp1cp1.yaml \\
        policy.model_name_or_path=Qwen/Qwen3-8B

It downloads the ``hf://`` datasets (data.train_path, data.val_path), converts them into
the layout of data.format (data/hub_datasets.py), downloads a hub model's config,
tokenizer and safetensors weights (policy.model_name_or_path, policy.tokenizer_name_or_path;
data/hub.py), all into the Hugging Face cache, and prints where each went and the
``key=path`` overrides that name the local copies. A run whose nodes share that cache
(HF_HOME / HF_HUB_CACHE on a shared file system) then finds them without the network; one
that does not can pass the printed overrides. Running it again downloads nothing.

The recipe is type-checked, not validated: fetching needs no layout that fits the devices
of the machine it runs on. Every input the recipe names is checked, local ones too: a
missing local data file is named (key and path) beside the hub ones, and a missing local
model directory named like a released model (``models/Qwen3-0.6B-Base``) gets the command
that fetches it by its hub id; any problem exits 2, one line each.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import dapo_megatron.migrate  # noqa: F401  (registers the foreign-key hints the loader prints)
from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.loader import display_path, load_config
from dapo_megatron.config.model_source import missing_local_model_hint
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.data.hub import fetch_model, hub_cache, is_hub_model_id
from dapo_megatron.data.hub_datasets import converted_root, is_hf_uri

USER_ERROR_EXIT = 2
DEFAULT_RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "dapo-tiny-cpu.yaml"


def fetch_data(config: DapoMegatronConfig) -> tuple[list[tuple[str, str, Path]], list[str]]:
    """Fetch and convert the hf:// data files, and check the local ones; ((key, value, local
    file) of each hub one, problems: one per file missing or unreadable, naming its key).

    The data check of the pre-flight does the fetching (so the converted files are also
    read through once, and a bad row is reported here, not on the cluster). Before, a recipe
    whose data were all local paths was "nothing on the hub" and exited 0 with its data
    missing, so the cluster run was the first to say so."""
    from dapo_megatron.data.datasets import check_data_files
    from dapo_megatron.data.hub_datasets import resolve_data_path

    data = config.data
    named = [(f"data.{k}", getattr(data, k)) for k in ("train_path", "val_path")]
    if not any(value for _, value in named):
        return [], []  # a generated task (data.format arithmetic) reads no file
    problems = check_data_files(data)
    named = [(key, value) for key, value in named if value and is_hf_uri(value)]
    if problems:
        return [], problems
    # Fetched and converted above: this finds the converted files in the cache.
    return [
        (key, value, resolve_data_path(value, data.format, what=key)) for key, value in named
    ], []


def fetch_models(
    config: DapoMegatronConfig, prepare_args: str = "--config RECIPE"
) -> tuple[list[tuple[str, str, Path]], list[str]]:
    """Fetch a hub model (and a hub tokenizer); ((key, value, snapshot) each, problems). A
    missing local model named like a released one is a problem naming the command that
    fetches it by its hub id (``prepare_args``: this command's recipe and overrides)."""
    from dapo_megatron.planning.preflight import model_will_be_created

    policy = config.policy
    path = policy.model_name_or_path
    if not is_hub_model_id(path) and not Path(path).exists() and not model_will_be_created(policy):
        hint = missing_local_model_hint("policy.model_name_or_path", path, prepare_args)
        if hint is not None:
            return [], [hint]
    wanted = [("policy.model_name_or_path", policy.model_name_or_path, False)]
    if policy.tokenizer_name_or_path:
        wanted.append(("policy.tokenizer_name_or_path", policy.tokenizer_name_or_path, True))
    fetched: list[tuple[str, str, Path]] = []
    problems: list[str] = []
    for key, value, tokenizer_only in wanted:
        if not is_hub_model_id(value):
            continue
        try:
            fetched.append(
                (key, value, fetch_model(value, what=key, tokenizer_only=tokenizer_only))
            )
        except ConfigError as e:
            problems.append(str(e))
    return fetched, problems


def prepare(
    config: DapoMegatronConfig, prepare_args: str = "--config RECIPE"
) -> tuple[list[tuple[str, str, Path]], list[str]]:
    """Fetch every hub input of ``config`` and check the local ones; ((key, value, local
    path) each, problems)."""
    data, data_problems = fetch_data(config)
    models, model_problems = fetch_models(config, prepare_args)
    return data + models, data_problems + model_problems


def main(argv: Sequence[str] | None = None) -> int:
    """dapo-prepare's entry point; 0 when everything was fetched (or nothing was named),
    2 with one line per problem otherwise."""
    parser = argparse.ArgumentParser(
        prog="dapo-prepare",
        description="Download the hub datasets (hf://Org/Name) and hub models (Org/Name) a "
        "recipe names into the Hugging Face cache, and print where they went.",
    )
    parser.add_argument(
        "--config", type=Path, default=None, help=f"recipe YAML (default: {DEFAULT_RECIPE.name})"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="the run's overrides (YAML values)"
    )
    args = parser.parse_intermixed_args(argv)
    try:
        recipe = args.config or DEFAULT_RECIPE
        config = load_config(recipe, args.overrides, validate=False).config
        prepare_args = shlex.join(
            ["--config", display_path(recipe)]
            + [o for o in args.overrides if not o.startswith("policy.model_name_or_path=")]
        )
        fetched, problems = prepare(config, prepare_args)
    except ConfigError as e:
        fetched, problems = [], [str(e)]
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return USER_ERROR_EXIT
    print(f"dapo-prepare: Hugging Face cache {hub_cache()}; converted datasets {converted_root()}")
    if not fetched:
        print(
            "dapo-prepare: the recipe names nothing on the hub (its data and model are local paths)"
        )
        return 0
    for key, value, local in fetched:
        print(f"  {key} = {value} -> {local}")
    print(
        "A run that shares this cache (HF_HOME / HF_HUB_CACHE) finds these without the network; "
        "elsewhere copy them and set:\n  " + " ".join(f"{key}={local}" for key, _, local in fetched)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
