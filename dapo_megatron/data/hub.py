"""Files from the Hugging Face hub, found in its cache or downloaded once.

A recipe may name a dataset (``data.train_path: hf://BytedTsinghua-SIA/DAPO-Math-17k``,
data/hub_datasets.py) or a model (``policy.model_name_or_path: Qwen/Qwen3-8B``) by its hub
id. This module fetches the repository's files into huggingface_hub's cache (the layout it
writes: ``<cache>/datasets--Org--Name/refs/main`` holds the snapshot's commit,
``snapshots/<commit>/...`` the files; ``models--Org--Name`` for a model) and returns the
snapshot directory. The cache directory is model_source's (HF_HUB_CACHE, else HF_HOME/hub,
else ~/.cache/huggingface/hub), so the architecture lookup of config/model_source.py and
the downloads here share one cache.

A complete cached snapshot is used without asking the network: a run on a cluster without
internet starts from the cache a login node filled (``dapo-prepare``). When the files are not
cached and the hub cannot be reached (HF_HUB_OFFLINE=1, no network, huggingface_hub missing)
the error names the command to run where there is internet and the key to set instead.

`download_snapshot` is the one function that talks to the hub; tests replace it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.model_source import (
    hf_hub_cache_dir,
    hub_offline,
    hub_reachable,
    looks_like_hub_id,
    names_a_local_folder,
)
from dapo_megatron.shared.commands import tool_command

PREPARE_ARGS = "--config RECIPE"
"""dapo-prepare's arguments in a message that does not know the run's recipe."""


def prepare_command(prepare_args: str = PREPARE_ARGS) -> str:
    """What fetches a recipe's hub inputs on a machine with internet (dapo_megatron/prepare.py),
    spelled as the README shows it (shared/commands.py)."""
    return f"{tool_command('dapo-prepare')} {prepare_args}"


MODEL_PATTERNS = (
    "*.json",  # config.json, generation_config.json, the shard index, tokenizer configs
    "*.safetensors",
    "tokenizer*",
    "*.model",  # sentencepiece vocabularies
    "*.tiktoken",
    "merges.txt",
    "vocab.txt",
)
"""The files of a model repository a run reads: no .bin/.pth weights, no README images."""

TOKENIZER_PATTERNS = ("*.json", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.txt")
"""The files of a tokenizer-only fetch (policy.tokenizer_name_or_path as a hub id)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
"""One of these makes a snapshot's tokenizer complete enough to try (load_tokenizer checks)."""


def hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The huggingface_hub cache directory of this environment."""
    return hf_hub_cache_dir(os.environ if env is None else env, Path.home())


def is_hub_model_id(value: str) -> bool:
    """Whether a model/tokenizer path is meant as a hub id: ``Org/Name``, not a local path
    (nothing at it, and its first component is no local directory nor a conventional one:
    ``models/Qwen3-8B`` is a local checkpoint still to be copied there)."""
    return looks_like_hub_id(value) and not Path(value).exists() and not names_a_local_folder(value)


def cached_snapshot(
    repo_id: str, repo_type: str, cache_dir: Path, revision: str = "main"
) -> Path | None:
    """The snapshot directory of ``repo_id`` at ``revision`` in the cache, or None.

    ``repo_type`` is "model" or "dataset". The ref file holds the snapshot's commit; a
    revision that is a commit names the snapshot directly."""
    repo_dir = cache_dir / f"{repo_type}s--{repo_id.replace('/', '--')}"
    ref = repo_dir / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    except OSError:
        return None
    snapshot = repo_dir / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def offline_reason(env: Mapping[str, str] | None = None) -> str | None:
    """Why the hub cannot be asked now, or None when it can."""
    env = os.environ if env is None else env
    if hub_offline(env):
        return "HF_HUB_OFFLINE is set"
    try:
        import huggingface_hub  # noqa: F401 - only whether it is installed
    except ImportError:
        return "huggingface_hub is not installed (pip install huggingface_hub)"
    endpoint = env.get("HF_ENDPOINT") or "https://huggingface.co"
    if not hub_reachable(endpoint):
        return f"{endpoint} does not answer: no network on this machine?"
    return None


def download_snapshot(
    repo_id: str, repo_type: str, allow_patterns: Sequence[str], cache_dir: Path
) -> Path:
    """Download the files of ``repo_id`` that match ``allow_patterns`` into the cache and
    return the snapshot directory; huggingface_hub shows a progress bar per file and skips
    files already there (an interrupted download resumes). Tests replace this function."""
    from huggingface_hub import snapshot_download

    print(f"[hub] downloading {repo_type} {repo_id} ({', '.join(allow_patterns)})", flush=True)
    return Path(
        snapshot_download(
            repo_id,
            repo_type=repo_type,
            allow_patterns=list(allow_patterns),
            cache_dir=cache_dir,
        )
    )


def unavailable(
    what: str, value: str, reason: str, cache_dir: Path, *, partial: bool = False
) -> ConfigError:
    """The error of hub files that are neither cached nor downloadable here; ``partial``:
    the cache holds some of the repository's files (config.json alone, say), not all."""
    where = "not complete in" if partial else "not in"
    return ConfigError(
        f"{what} = {value}: {where} the Hugging Face cache {cache_dir} and not downloadable "
        f"here ({reason}). On a machine with internet access (a login node) run "
        f"`{prepare_command()}` with this run's recipe and overrides: it downloads everything "
        "the recipe names into that cache (share it with the compute nodes: HF_HOME or "
        f"HF_HUB_CACHE) and prints where each file went; or set {what} to a local path"
    )


def fetch_snapshot(
    repo_id: str,
    repo_type: str,
    allow_patterns: Sequence[str],
    *,
    what: str,
    value: str,
    complete: Callable[[Path], bool],
    env: Mapping[str, str] | None = None,
) -> Path:
    """The snapshot directory of ``repo_id`` with the files a run needs: the cached one when
    ``complete`` says it holds them (no network), else a download.

    Args:
        repo_id: ``Org/Name``.
        repo_type: "model" or "dataset".
        allow_patterns: the files to download (fnmatch patterns of repository paths).
        what, value: the config key and its value, for the messages.
        complete: whether a snapshot directory holds what the run reads.

    Raises:
        ConfigError: not cached and the hub cannot be reached (names `dapo-prepare`), or
            the download failed (no such repository, a gated one, a full disk).
    """
    cache_dir = hub_cache(env)
    cached = cached_snapshot(repo_id, repo_type, cache_dir)
    if cached is not None and complete(cached):
        return cached
    reason = offline_reason(env)
    if reason is not None:
        raise unavailable(what, value, reason, cache_dir, partial=cached is not None)
    try:
        snapshot = download_snapshot(repo_id, repo_type, allow_patterns, cache_dir)
    except Exception as e:  # noqa: BLE001 - every hub failure becomes one line with its fix
        raise ConfigError(
            f"{what} = {value}: downloading {repo_type} {repo_id} from the hub failed: "
            f"{_first_line(e)}. Check the name (https://huggingface.co/"
            f"{'datasets/' if repo_type == 'dataset' else ''}{repo_id}); a gated repository "
            "needs its license accepted and a token (HF_TOKEN or `hf auth login`)"
        ) from None
    if not complete(snapshot):
        raise ConfigError(
            f"{what} = {value}: the {repo_type} repository {repo_id} was downloaded to "
            f"{snapshot} but lacks the files a run reads ({', '.join(allow_patterns)})"
        )
    return snapshot


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__).rstrip(".")


# ----------------------------------------------------------------------------- models


def model_snapshot_complete(path: Path) -> bool:
    """Whether a model snapshot holds config.json, a tokenizer and every weight file (the
    shard index's files, else at least one *.safetensors)."""
    if not (path / "config.json").is_file() or not tokenizer_snapshot_complete(path):
        return False
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return any(path.glob("*.safetensors"))
    import json

    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return False  # a damaged index: download again (pre-flight names it if it stays)
    return bool(weight_map) and all((path / str(f)).is_file() for f in weight_map.values())


def tokenizer_snapshot_complete(path: Path) -> bool:
    """Whether a snapshot holds a tokenizer file load_tokenizer can start from."""
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def fetch_model(repo_id: str, *, what: str, tokenizer_only: bool = False) -> Path:
    """The local snapshot of a hub model (config, tokenizer, safetensors weights), downloaded
    into the HF cache when not there; ``tokenizer_only`` fetches the tokenizer files alone."""
    patterns = TOKENIZER_PATTERNS if tokenizer_only else MODEL_PATTERNS
    complete = tokenizer_snapshot_complete if tokenizer_only else model_snapshot_complete
    return fetch_snapshot(repo_id, "model", patterns, what=what, value=repo_id, complete=complete)
