"""Write a Hugging Face checkpoint of the policy: from a live policy or a dist checkpoint.

    export_policy(policy, out_dir)                         # the policy's current weights
    export_checkpoint(checkpoint_dir, out_dir, config=cfg)  # a step_NNNNNN checkpoint

Both are collective: every rank of the policy calls them together, because the weights
come from ``MegatronPolicy.export_weights`` (TP all-gathers, PP broadcasts). Global rank 0
writes; the other ranks only take part in the collectives. The result is an ordinary HF
model directory that ``AutoModelForCausalLM.from_pretrained`` (and vLLM, and
``policy.model_name_or_path`` of a new run) reads:

* ``config.json``: the HF config of the architecture (Qwen2, Llama, Qwen3..., built from
  ``ModelArch``; the token ids of the base model's config.json are carried over) with the
  dtype of the exported tensors;
* ``model.safetensors``, or shards ``model-0000i-of-0000n.safetensors`` of at most
  ``max_shard_size`` bytes (a tensor larger than that gets a shard of its own) with
  ``model.safetensors.index.json``, as ``save_pretrained`` lays them out. Tensors are
  written shard by shard: rank 0 holds at most one shard of tensors at a time;
* the tokenizer files of ``policy.tokenizer_name_or_path`` (default: the base model) and
  the base model's ``generation_config.json`` when it has one.

The directory is written as a temporary sibling (``.<name>.tmp-<random>``) renamed into
place at the end: a crash never leaves a half-written model under the final name, and an
existing non-empty directory is never overwritten.

``export_checkpoint`` builds a ``MegatronPolicy`` from the run's config (architecture, base
weights, precision) at the requested layout, loads the checkpoint's weights into it
(weights only: the optimizer and scheduler states are not read, so any TP/PP/DP layout
works) and exports them. ``export_launch.launch_export`` (``dapo-export``) starts the ranks
for it. This module imports Megatron only inside ``export_checkpoint``: the checks and the
writer are usable anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.model_arch import (
    HF_ARCHITECTURES,
    ModelArch,
    arch_from_hf_config,
)
from dapo_megatron.config.model_arch import hf_config as arch_hf_config
from dapo_megatron.storage.checkpoint_dirs import (
    MARKER,
    NoVerifiedCheckpointError,
    find_resumable,
    latest_checkpoint,
    read_marker,
    verify_checkpoint,
)

if TYPE_CHECKING:
    import transformers

    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.config.schema import DapoMegatronConfig
    from dapo_megatron.megatron.policy import MegatronPolicy

DEFAULT_MAX_SHARD_SIZE = 5 * 10**9
"""Bytes per safetensors shard (Hugging Face's default "5GB")."""
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
"""Files of a tokenizer directory that are copied when present."""
GENERATION_CONFIG = "generation_config.json"
_CARRIED_CONFIG_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
"""Fields of the base model's config.json kept in the export (ModelArch does not hold them)."""
_LLAMA3_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
"""The Llama 3 RoPE scaling constants ModelArch implies (see model_arch._rope)."""


class ExportError(ConfigError):
    """A user error found before any rank starts: a path, a layout or an architecture."""


# ------------------------------------------------------------------------------- checks


def check_checkpoint_dir(checkpoint_dir: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """The ``complete.json`` marker of a complete checkpoint directory whose files verify.

    ``verify``: check every file against the sizes and sha256 its marker records
    (``verify_checkpoint``, the resume's check), so that a damaged shard is refused before
    anything reads it instead of being exported as garbage or failing deep in
    ``torch.load``. The launcher verifies once; the ranks it starts pass False.

    Raises:
        ExportError: the directory is missing, is not a complete checkpoint (a save
            interrupted, a partial copy), or a file does not verify; the message names
            the file and the newest checkpoint that does verify.
    """
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise ExportError(
            f"checkpoint directory {path} does not exist; pass a RUN_DIR/checkpoints/"
            f"step_NNNNNN directory written by dapo-train"
        )
    marker = read_marker(path)
    if marker is None or not isinstance(marker.get("layout"), dict):
        latest = latest_checkpoint(path.parent)
        hint = (
            f"export the latest complete one, {latest}"
            if latest is not None
            else f"{path.parent} holds no complete checkpoint"
        )
        raise ExportError(
            f"{path} is not a complete checkpoint (no readable {MARKER}: an interrupted save "
            f"or a partial copy); {hint}"
        )
    problem = verify_checkpoint(path) if verify else None
    if problem is not None:
        try:
            good, _ = find_resumable(path.parent)
        except NoVerifiedCheckpointError:
            good = None
        hint = (
            f"restore its files, or export {good}, the newest checkpoint that verifies"
            if good is not None and good != path
            else f"restore its files ({path.parent} holds no checkpoint that verifies)"
        )
        raise ExportError(f"checkpoint {path} does not verify: {problem}; {hint}")
    return marker


def check_out_dir(out_dir: str | Path) -> None:
    """Refuse an existing non-empty output directory (an export never overwrites)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(
            f"output directory {out} exists and is not empty; choose a new path or delete it"
        )


def tokenizer_dir(config: DapoMegatronConfig) -> Path:
    """Where the run's tokenizer lives: tokenizer_name_or_path, else the base model."""
    return Path(config.policy.tokenizer_name_or_path or config.policy.model_name_or_path)


def tokenizer_files(directory: str | Path) -> list[Path]:
    """The tokenizer files (TOKENIZER_FILES) present in ``directory``.

    Raises:
        ExportError: there is none.
    """
    found = [
        Path(directory) / name for name in TOKENIZER_FILES if (Path(directory) / name).is_file()
    ]
    if not found:
        raise ExportError(
            f"policy.tokenizer_name_or_path: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}"
            f", ...) in {directory}; point it (or policy.model_name_or_path) at the run's "
            f"tokenizer directory"
        )
    return found


def base_arch(config: DapoMegatronConfig) -> tuple[ModelArch, dict[str, Any]]:
    """The architecture and parsed config.json of the run's base model.

    Raises:
        ExportError: the base model directory has no config.json.
    """
    config_json = Path(config.policy.model_name_or_path) / "config.json"
    if not config_json.is_file():
        raise ExportError(
            f"policy.model_name_or_path: {config_json} not found; the export builds the model "
            f"from the run's base model (architecture and weights): point "
            f"policy.model_name_or_path at it"
        )
    hf = json.loads(config_json.read_text(encoding="utf-8"))
    return arch_from_hf_config(hf, str(config_json)), hf


def check_layout(arch: ModelArch, tp: int, pp: int) -> None:
    """``arch`` must split over ``tp`` x ``pp`` ranks the way Megatron splits it."""
    problems = [
        f"num_layers {arch.num_layers} by pp {pp}" if arch.num_layers % pp else "",
        f"attention heads {arch.num_attention_heads} by tp {tp}"
        if arch.num_attention_heads % tp
        else "",
        f"query groups {arch.num_query_groups} by tp {tp}" if arch.num_query_groups % tp else "",
        f"ffn size {arch.ffn_hidden_size} by tp {tp}" if arch.ffn_hidden_size % tp else "",
    ]
    problems = [p for p in problems if p]
    if tp < 1 or pp < 1 or problems:
        raise ExportError(
            f"layout TP{tp} PP{pp} does not fit the model ({'; '.join(problems) or 'sizes < 1'}"
            f" not divisible); export at the layout the checkpoint was saved with"
        )


# ---------------------------------------------------------------------------- HF config


def hf_config(
    arch: ModelArch, *, dtype: torch.dtype | None = None, base_config: dict[str, Any] | None = None
) -> transformers.PretrainedConfig:
    """The Hugging Face config of ``arch`` (any family of ``HF_ARCHITECTURES``) for
    ``from_pretrained``.

    Args:
        arch: the architecture.
        dtype: the dtype of the weights (written as the config's dtype), or None.
        base_config: a parsed config.json whose token ids (bos, eos, pad) are kept.

    Raises:
        ExportError: ``arch`` has no HF equivalent (another family; a Llama with q/k/v
            bias, which HF's ``attention_bias`` would also put on o_proj; a config that does
            not read back as ``arch``).
    """
    extra: dict[str, Any] = {
        k: base_config[k] for k in _CARRIED_CONFIG_KEYS if base_config and k in base_config
    }
    if dtype is not None:
        extra["torch_dtype"] = str(dtype).removeprefix("torch.")
    if arch.rope_scaling_factor is not None:
        extra["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": arch.rope_scaling_factor,
            **_LLAMA3_ROPE,
        }
    if arch.family not in HF_ARCHITECTURES:
        raise ExportError(
            f"model family {arch.family!r} has no Hugging Face export; supported: "
            f"{', '.join(HF_ARCHITECTURES)}"
        )
    if arch.family == "llama" and arch.add_qkv_bias:
        raise ExportError(
            "a Llama with q/k/v bias has no HF Llama equivalent (attention_bias also "
            "biases o_proj, which this model does not have)"
        )
    config = arch_hf_config(arch, **extra)
    config.architectures = [HF_ARCHITECTURES[arch.family]]
    read_back = arch_from_hf_config(config.to_dict(), "the exported config")
    if read_back != arch:
        raise ExportError(
            f"the HF {arch.family} config of {arch} reads back as {read_back}: this "
            f"architecture cannot be exported faithfully"
        )
    return config


# ------------------------------------------------------------------------------- writer


def _standalone_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on CPU, contiguous and owning its whole storage (safetensors refuses
    tensors that share memory; exported q/k/v or gate/up may be views of one buffer)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    nbytes = tensor.numel() * tensor.element_size()
    if (
        not tensor.is_contiguous()
        or tensor.storage_offset() != 0
        or tensor.untyped_storage().nbytes() != nbytes
    ):
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """Streams named tensors into safetensors shards of at most ``max_shard_size`` bytes.

    ``add`` keeps tensors until the next one would overflow the shard, then writes the
    shard; ``finish`` writes the last one and names the files as ``save_pretrained`` does:
    one ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` plus the index.
    """

    def __init__(self, directory: str | Path, max_shard_size: int = DEFAULT_MAX_SHARD_SIZE) -> None:
        if max_shard_size < 1:
            raise ValueError(f"max_shard_size = {max_shard_size}: must be >= 1 byte")
        self.directory = Path(directory)
        self.max_shard_size = max_shard_size
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []
        self._names: set[str] = set()
        self.total_size = 0
        """Bytes of all tensors added."""
        self.dtypes: list[torch.dtype] = []
        """Distinct dtypes of the tensors added, in order of appearance."""

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queue one tensor (copied to CPU when needed); may write a full shard."""
        if name in self._names:
            raise ValueError(f"tensor {name!r} was already written")
        self._names.add(name)
        tensor = _standalone_cpu(tensor)
        size = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + size > self.max_shard_size:
            self._flush()
        self._pending[name] = tensor
        self._pending_bytes += size
        self.total_size += size
        if tensor.dtype not in self.dtypes:
            self.dtypes.append(tensor.dtype)

    def _flush(self) -> None:
        from safetensors.torch import save_file

        path = self.directory / f"shard-{len(self._shards) + 1:05d}.safetensors.partial"
        save_file(self._pending, str(path), metadata={"format": "pt"})
        _fsync(path)
        self._shards.append((path, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def finish(self) -> list[str]:
        """Write the last shard and give the files their final names; returns them."""
        if self._pending or not self._shards:
            self._flush()
        if len(self._shards) == 1:
            self._shards[0][0].rename(self.directory / SINGLE_FILE)
            return [SINGLE_FILE]
        count = len(self._shards)
        weight_map: dict[str, str] = {}
        names = []
        for index, (path, tensors) in enumerate(self._shards, start=1):
            name = f"model-{index:05d}-of-{count:05d}.safetensors"
            path.rename(self.directory / name)
            weight_map.update(dict.fromkeys(tensors, name))
            names.append(name)
        index_json = {"metadata": {"total_size": self.total_size}, "weight_map": weight_map}
        (self.directory / INDEX_FILE).write_text(
            json.dumps(index_json, indent=2) + "\n", encoding="utf-8"
        )
        return [*names, INDEX_FILE]


def write_hf_checkpoint(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    out_dir: str | Path,
    *,
    arch: ModelArch,
    tokenizer_dir: str | Path,
    base_model_dir: str | Path | None = None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write ``(hf_name, full tensor)`` pairs as an HF checkpoint at ``out_dir``, atomically.

    One process; ``named_tensors`` is consumed once, tensor by tensor. On any failure the
    temporary directory is removed and ``out_dir`` is left as it was.

    Raises:
        ExportError: ``out_dir`` exists and is not empty, or ``tokenizer_dir`` holds no
            tokenizer files, or ``arch`` has no HF config.
    """
    out = Path(out_dir)
    check_out_dir(out)
    tokenizer = tokenizer_files(tokenizer_dir)
    base_config = None
    if base_model_dir is not None and (Path(base_model_dir) / "config.json").is_file():
        base_config = json.loads((Path(base_model_dir) / "config.json").read_text("utf-8"))
    hf_config(arch, base_config=base_config)  # fail before writing anything
    out.parent.mkdir(parents=True, exist_ok=True)
    # A sibling of out_dir, so that the final rename stays on one file system (atomic).
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        writer = ShardWriter(tmp, max_shard_size)
        for name, tensor in named_tensors:
            writer.add(name, tensor)
        writer.finish()
        dtype = writer.dtypes[0] if len(writer.dtypes) == 1 else None
        hf_config(arch, dtype=dtype, base_config=base_config).save_pretrained(tmp)
        for path in tokenizer:
            shutil.copyfile(path, tmp / path.name)
        if base_model_dir is not None and (Path(base_model_dir) / GENERATION_CONFIG).is_file():
            shutil.copyfile(Path(base_model_dir) / GENERATION_CONFIG, tmp / GENERATION_CONFIG)
        # mkdtemp (and the safetensors writer) make owner-only entries; a model directory
        # is normally read by other users and jobs too.
        tmp.chmod(0o755)
        for path in tmp.iterdir():
            path.chmod(0o644)
            _fsync(path)
        try:
            os.rename(tmp, out)  # replaces an empty out_dir; fails on a non-empty one
        except OSError:
            check_out_dir(out)  # someone filled it meanwhile: say so
            raise
        _fsync(out.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- collective


def export_policy(
    policy: MegatronPolicy,
    out_dir: str | Path,
    *,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write ``policy``'s current weights as an HF checkpoint; collective over its ranks.

    Every rank of the policy calls it (the weights are gathered with TP/PP collectives);
    global rank 0 writes ``out_dir`` (on a file system rank 0 sees). The tokenizer comes
    from ``policy.tokenizer_name_or_path`` or the base model, the token ids and generation
    config from the base model (``policy.model_name_or_path``). Returns ``out_dir`` on every
    rank once it is complete.

    Raises:
        ExportError: on every rank, before the weights are gathered: ``out_dir`` exists and
            is not empty, no tokenizer files, no HF config for the architecture.
        Exception: rank 0's writing error on rank 0 (e.g. disk full); a RuntimeError
            naming it on the other ranks. The collectives are completed either way.
    """
    import torch.distributed as dist

    from dapo_megatron.device import collectives

    cfg = policy.config.policy
    out = Path(out_dir)
    tokenizer = tokenizer_dir(policy.config)
    # Rank 0 checks and tells every rank: a user error raises everywhere (no rank is left
    # waiting in a collective), and no rank looks at out_dir after rank 0 may have written it.
    verdict: list[str | None] = [None]
    if dist.get_rank() == 0:
        try:
            check_out_dir(out)
            tokenizer_files(tokenizer)
            hf_config(policy.arch)
        except ExportError as e:
            verdict = [str(e)]
    collectives.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise ExportError(verdict[0])
    weights = policy.export_weights()
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            write_hf_checkpoint(
                weights,
                out,
                arch=policy.arch,
                tokenizer_dir=tokenizer,
                base_model_dir=cfg.model_name_or_path,
                max_shard_size=max_shard_size,
            )
        except Exception as e:  # finish the collectives below, then raise
            error = e
    # Whatever rank 0 did not consume (all of it on other ranks, the rest after an error).
    for _ in weights:
        pass
    holder = [None if error is None else f"{type(error).__name__}: {error}"]
    collectives.broadcast_object_list(holder, src=0)
    if error is not None:
        raise error
    if holder[0] is not None:
        raise RuntimeError(f"the HF export to {out} failed on rank 0: {holder[0]}")
    return out


def default_dims(marker: dict[str, Any]) -> ParallelDims:
    """The saved TP and PP, CP 1, and DP filling WORLD_SIZE (the launcher's: DP 1)."""
    from dapo_megatron.config.parallel import ParallelDims

    tp, pp = int(marker["layout"]["tp"]), int(marker["layout"]["pp"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world % (tp * pp):
        raise ExportError(
            f"the checkpoint was saved at TP{tp} PP{pp}; WORLD_SIZE={world} is not a multiple "
            f"of {tp * pp}: launch {tp * pp} ranks (or pass dims)"
        )
    return ParallelDims(tp=tp, pp=pp, cp=1, dp=world // (tp * pp), sequence_parallel=False)


def export_checkpoint(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    *,
    config: DapoMegatronConfig,
    dims: ParallelDims | None = None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write the weights of a dist checkpoint as an HF checkpoint; collective.

    Every rank of the job calls it: it builds a ``MegatronPolicy`` of ``config`` (the run's
    config: base model, precision) at ``dims``, loads the checkpoint's model weights into it
    (weights only: optimizer and scheduler states are skipped, so any layout loads),
    exports them with ``export_policy`` and shuts the policy (and torch.distributed) down.

    Args:
        checkpoint_dir: a complete ``step_NNNNNN`` directory.
        out_dir: the HF directory to create (must not exist, or be empty).
        config: the run's config; only ``policy`` (and ``run.seed``) matter.
        dims: the layout of the ranks; default: the saved TP and PP, CP 1, DP =
            WORLD_SIZE / (TP * PP).
        max_shard_size: bytes per safetensors shard.

    Returns:
        ``out_dir`` (complete) on every rank.

    Raises:
        ExportError: on every rank, before Megatron starts: a path, the layout or the
            architecture is wrong.
    """
    # The launcher verified the files (export_launch.preflight); each rank hashing a
    # checkpoint of hundreds of GB again would multiply the export's start-up by the ranks.
    marker = check_checkpoint_dir(checkpoint_dir, verify=False)
    check_out_dir(out_dir)
    arch, _ = base_arch(config)
    tokenizer_files(tokenizer_dir(config))
    dims = dims or default_dims(marker)
    check_layout(arch, dims.tp, dims.pp)

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.checkpoint import load_checkpoint
    from dapo_megatron.megatron.policy import MegatronPolicy

    policy = MegatronPolicy(policy_plan(config, dims, arch))
    try:
        load_checkpoint(
            checkpoint_dir, model=policy.model, optimizer=None, scheduler=None, restore_rng=False
        )
        return export_policy(policy, out_dir, max_shard_size=max_shard_size)
    finally:
        policy.shutdown()
