"""Where a model's architecture is read from: its config.json, found without loading a weight.

``policy.model_name_or_path`` is a local checkpoint directory or a Hugging Face hub id
(``Org/Name``). Its config.json is looked for, in order:

1. in the local directory;
2. in the Hugging Face cache, for a hub id (the layout huggingface_hub writes:
   ``<cache>/models--Org--Name/refs/main`` holds the snapshot's commit,
   ``<cache>/models--Org--Name/snapshots/<commit>/config.json`` the file), with the cache
   directory huggingface_hub uses (HF_HUB_CACHE, else HF_HOME/hub, else
   ~/.cache/huggingface/hub);
3. on the hub, for a hub id, only when huggingface_hub is installed, the hub is not
   switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) and its host answers within 2 s:
   config.json alone is downloaded (into the cache above), never a weight. Any failure (no
   network, no such repository, a gated one) is quiet: the caller falls back to a preset.
   A relative ``dir/Name`` whose ``dir`` exists here is a local path, never asked of the hub.

Without a config.json, the model's *name* may still name its architecture: the last path
component, lower-cased, less one suffix that keeps the architecture (-Base, -Instruct,
-Chat), is a preset name (``Qwen/Qwen3-8B-Base`` and ``models/Qwen3-8B-Base`` are
``qwen3-8b``). A trailing release suffix (``Qwen3-4B-Instruct-2507``) is deliberately NOT
stripped: such re-releases keep the weights' shapes but change the context length and RoPE
base (Qwen3-*-2507: 262144 positions, base 5e6, where the preset has 40960 and 1e6), which
the plan would then get wrong; their config.json gives them, or policy.model_arch names the
preset on purpose.

Everything here is a pure function of its arguments (paths, environment), except
``fetch_hub_config``, which tests replace.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from dapo_megatron.shared.commands import tool_command

ARCH_KEEPING_SUFFIXES = ("-base", "-instruct", "-chat")
"""Name suffixes of a checkpoint of the same architecture (the pretrained model, its chat
tune): stripped before a name is matched with a preset. Lower case; matched case-blind."""

_NAME_PREFIXES = ("meta-",)
"""Name prefixes a model family once carried (Meta-Llama-3.1-8B, now Llama-3.1-8B)."""

_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^{_HUB_PART}/{_HUB_PART}$")
_RELEASE_SUFFIX = re.compile(r"-(?:\d{4}|v\d+(?:\.\d+)*)$")

_TRUE = ("1", "true", "yes", "on")

LOCAL_MODEL_DIRS = ("models", "checkpoints", "ckpts", "weights")
"""First path components that mean a local folder, never a hub org, even before the folder
exists: the README tells a user to put the model in ``models/<HF name>``, and the hub was
asked for ``models/Qwen3-0.6B-Base`` (a 404, or offline an error naming the wrong id)."""

HUB_ORGS: tuple[tuple[str, str], ...] = (
    ("qwen", "Qwen"),  # Qwen2, Qwen2.5, Qwen2.5-Math, Qwen3, Qwen3-MoE
    ("meta-llama-", "meta-llama"),
    ("llama-", "meta-llama"),
    ("deepseek", "deepseek-ai"),
    ("mistral-", "mistralai"),
    ("mixtral-", "mistralai"),
    ("gemma", "google"),
    ("phi-", "microsoft"),
    ("olmo", "allenai"),
)
"""Lower-case name prefix -> the hub org that publishes that family, for the hint of a missing
local model (``models/Qwen3-0.6B-Base`` -> ``Qwen/Qwen3-0.6B-Base``)."""

_MODEL_SIZE = re.compile(r"(?:^|[-_.])\d+(?:\.\d+)?[bBmM](?:$|[-_.])")
"""A parameter count in a name (``-0.6B-``, ``-70B``, ``-A3B``'s ``3B``): the mark of a
released model's name, which ``model`` or ``step_000150`` lack."""


def model_basename(model_name_or_path: str) -> str:
    """The model's own name: the last component of a path or hub id
    (``Qwen/Qwen3-8B-Base`` -> ``Qwen3-8B-Base``; trailing slashes ignored)."""
    return PurePosixPath(model_name_or_path.rstrip("/")).name


def preset_for_name(model_name_or_path: str, preset_names: Iterable[str]) -> str | None:
    """The preset whose architecture the model's name names, or None.

    The basename, lower-cased, less one of ARCH_KEEPING_SUFFIXES (and a former family
    prefix such as ``Meta-``), must equal a preset name: ``Qwen3-30B-A3B-Base`` ->
    ``qwen3-30b-a3b``, ``Qwen2.5-Math-7B`` -> ``qwen2.5-math-7b``. Release suffixes
    (``-2507``) are not stripped (module docstring).
    """
    names = set(preset_names)
    base = model_basename(model_name_or_path).lower()
    candidates = [base]
    for suffix in ARCH_KEEPING_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            candidates.append(base[: -len(suffix)])
    for candidate in list(candidates):
        for prefix in _NAME_PREFIXES:
            if candidate.startswith(prefix):
                candidates.append(candidate[len(prefix) :])
    for candidate in candidates:
        if candidate in names:
            return candidate
    return None


def has_release_suffix(model_name_or_path: str) -> bool:
    """Whether the name ends in a release/date suffix (``-2507``, ``-v2``), which
    preset_for_name does not strip; for a hint in the error."""
    return _RELEASE_SUFFIX.search(model_basename(model_name_or_path)) is not None


def looks_like_hub_id(model_name_or_path: str) -> bool:
    """``Org/Name`` with the characters the hub allows (not ``/abs``, ``./rel``, ``a/b/c``)."""
    return _HUB_ID.match(model_name_or_path) is not None and ".." not in model_name_or_path


def names_a_local_folder(model_name_or_path: str) -> bool:
    """Whether an ``Org/Name``-shaped value is a local path: its first component is a folder
    here, or one of LOCAL_MODEL_DIRS (``models/Qwen3-8B`` before ``models/`` exists)."""
    first = model_name_or_path.split("/", 1)[0]
    return first.lower() in LOCAL_MODEL_DIRS or Path(first).is_dir()


def hub_org_for_name(name: str) -> str | None:
    """The hub org of a model family by its name's prefix (HUB_ORGS), or None."""
    lower = model_basename(name).lower()
    return next((org for prefix, org in HUB_ORGS if lower.startswith(prefix)), None)


def missing_local_model_hint(key: str, value: str, prepare_args: str) -> str | None:
    """One line for a local model path with nothing at it whose last component reads as a
    released model's name: the hub id it likely is and the dapo-prepare command that
    fetches it, or None for other names (``runs/x/model``).

    ``prepare_args``: the run's ``--config RECIPE`` and overrides, for the exact command."""
    name = model_basename(value)
    org = hub_org_for_name(name)
    if org is None and not _MODEL_SIZE.search(name):
        return None
    hub_id = f"{org or 'ORG'}/{name}"
    command = " ".join(p for p in (tool_command("dapo-prepare"), prepare_args) if p)
    command += f" {key}={hub_id}"
    known = (
        f"it names the hub model {hub_id}"
        if org
        else "if it is a hub model, its org is unknown here (ORG: its owner on huggingface.co)"
    )
    return (
        f"{key} = {value} does not exist; {known}: fetch it with `{command}` (where there is "
        f"internet) and run with {key}={hub_id}, or copy the model into {value}"
    )


def hf_hub_cache_dir(env: Mapping[str, str], home: Path) -> Path:
    """The cache huggingface_hub downloads into: HF_HUB_CACHE (or its old name
    HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ``home``/.cache/huggingface/hub."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else None
    return (xdg or home / ".cache") / "huggingface" / "hub"


def cached_config_json(repo_id: str, cache_dir: Path, revision: str = "main") -> Path | None:
    """config.json of ``repo_id`` at ``revision`` in a huggingface_hub cache, or None.

    The ref file (``refs/<revision>``) holds the snapshot's commit; a revision that is a
    commit itself names the snapshot directly."""
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    ref = repo_dir / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    except OSError:
        return None
    candidate = repo_dir / "snapshots" / commit / "config.json"
    return candidate if candidate.is_file() else None


def hub_offline(env: Mapping[str, str]) -> bool:
    """Whether the user switched the hub off (the variables huggingface_hub and
    transformers read)."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(env.get(k, "").strip().lower() in _TRUE for k in keys)


def hub_reachable(endpoint: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to the hub's host opens within ``timeout_s``: the "online"
    test before a download. hf_hub_download retries an unreachable host for ~25 s (and logs
    each retry), which every validation of an offline cluster would pay."""
    url = urlsplit(endpoint)
    if not url.hostname:
        return False
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@functools.lru_cache(maxsize=32)
def fetch_hub_config(repo_id: str) -> Path | None:
    """Download config.json (only) of ``repo_id`` from the hub into the HF cache; None when
    huggingface_hub is missing, the hub is unreachable, or the download fails for any other
    reason (no such or a gated repository). Cached per process: validation may run several
    times a command. Tests replace this function."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    if not hub_reachable(os.environ.get("HF_ENDPOINT") or "https://huggingface.co"):
        return None
    try:
        return Path(hf_hub_download(repo_id, "config.json", etag_timeout=10))
    except Exception:  # noqa: BLE001 - any hub failure means "not found", reported later
        return None


def locate_config_json(
    model_name_or_path: str, env: Mapping[str, str] | None = None, home: Path | None = None
) -> tuple[Path | None, str]:
    """The model's config.json (or None) and, for messages, where it was looked for.

    A local directory wins; a hub id is looked up in the HF cache and then (online only)
    fetched. A hub-id-shaped relative path whose first component is a local directory
    (``models/Qwen3-8B`` beside a ``models/`` folder) is a local path still to be filled:
    the hub is not asked about it.
    """
    env = os.environ if env is None else env
    local = Path(model_name_or_path) / "config.json"
    if local.is_file():
        return local, str(local)
    looked = [f"no {local}"]
    if not looks_like_hub_id(model_name_or_path):
        return None, "; ".join(looked)
    cache_dir = hf_hub_cache_dir(env, Path.home() if home is None else home)
    cached = cached_config_json(model_name_or_path, cache_dir)
    if cached is not None:
        return cached, str(cached)
    looked.append(f"not in the Hugging Face cache {cache_dir}")
    if names_a_local_folder(model_name_or_path):
        return None, "; ".join(looked)
    if hub_offline(env):
        looked.append("hub offline")
        return None, "; ".join(looked)
    fetched = fetch_hub_config(model_name_or_path)  # a module global: tests replace it
    if fetched is not None and fetched.is_file():
        return fetched, f"{fetched} (downloaded from the hub)"
    looked.append("not fetched from the hub")
    return None, "; ".join(looked)


def preset_applies(
    sources: Mapping[str, str], order: Iterable[str], *, created_from_preset: bool
) -> bool:
    """Whether ``policy.model_arch`` describes ``policy.model_name_or_path``.

    A preset set in an earlier layer than the model (a parent recipe in the `defaults:`
    chain, when the recipe or the command line names another model) was chosen for the
    parent's model, so it does not apply. It applies when set in the same layer as the model
    or a later one (``order``: the files read, base first, then the command line), when
    either key's layer is unknown, and always when the run creates the model from it
    (``created_from_preset``: init_model_if_missing and nothing at the path yet).
    """
    if created_from_preset:
        return True
    arch_src = sources.get("policy.model_arch")
    model_src = sources.get("policy.model_name_or_path")
    rank = {source: i for i, source in enumerate(order)}
    if arch_src not in rank or model_src not in rank:
        return True
    return rank[arch_src] >= rank[model_src]
