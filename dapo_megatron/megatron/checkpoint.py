"""Crash-safe Megatron distributed checkpoints of the policy (model, optimizer, schedule, run state).

One checkpoint is a directory ``<root>/step_<step:06d>`` holding:

* Megatron's ``torch_dist`` checkpoint of the model and optimizer: every rank writes its own
  shards, and the files describe GLOBAL tensors, so a checkpoint loads into another TP/PP/DP
  layout (dist checkpointing reshards on load). The DistributedOptimizer's state uses the
  ``dp_reshardable`` format (bucket-space shards: reloadable at any DP size, but only at the
  TP/PP it was saved with); the plain optimizer's state is per parameter and reshards like
  the model;
* optionally the frozen KL reference model (``reference.``-prefixed keys, sharded like the
  model, so it too loads into another layout; ``"reference": true`` in the marker);
* the LR scheduler's state and each rank's RNG states (Python, NumPy, torch, Megatron's
  model-parallel RNG tracker), which make a resume at the same layout bit-exact;
* ``extra_state.pt``: a picklable dict owned by rank 0 (dataloader position, the dynamic
  sampling carry-over, the controller's RNG...), returned by ``load_checkpoint``;
* ``complete.json``: the marker, written last (step, layout, optimizer format, time, and the
  size and SHA-256 of every other file, which a resume verifies: ``find_resumable``).

Crash safety: everything is written into a sibling ``step_<step>.tmp-<random>`` directory,
and rank 0 renames it to its final name only after every rank has finished writing (a
barrier) and the marker is on disk. A kill at any moment therefore leaves either no
``step_<step>`` directory or a complete one; ``latest_checkpoint`` skips ``.tmp`` leftovers
and directories without the marker, and ``prune_checkpoints`` and
``remove_interrupted_saves`` remove them. A save that fails for an OS reason (disk full,
quota, permissions, I/O error) on any rank raises ``CheckpointSaveError`` naming the
checkpoint and the OS error, after removing its ``.tmp`` directory.

``save_checkpoint`` and ``load_checkpoint`` are collective: every rank of the policy calls
them together. ``latest_checkpoint`` and ``prune_checkpoints`` only read/change the file
system; they live in ``dapo_megatron.storage.checkpoint_dirs`` (no Megatron import, for the controller) and are
re-exported here. The checkpoint directory must be on a file system
that all ranks see (as for any Megatron checkpoint). The state dict itself (model chunks,
reference, optimizer, scheduler, RNG states) is described by ``checkpoint_state.py``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from torch.distributed.checkpoint import CheckpointException

from dapo_megatron.device import collectives
from dapo_megatron.megatron.checkpoint_state import (
    DIST_OPTIMIZER_SHARDING,
    REFERENCE_PREFIX,
    current_layout,
    is_distributed_optimizer,
    model_keys,
    restore_adam_steps,
    restore_rng_state,
    saved_adam_steps,
    sharded_state_dict,
    virtual_pipeline_rank,
)
from dapo_megatron.megatron.model import unwrap_model
from dapo_megatron.storage.checkpoint_dirs import (
    MARKER,
    CheckpointSaveError,
    checkpoint_files,
    checkpoint_name,
    describe_files,
    latest_checkpoint,
    prune_checkpoints,
    publish,
    read_marker,
    temporary_sibling,
    write_durably,
    write_marker,
)

__all__ = [
    "CheckpointSaveError",
    "checkpoint_name",
    "latest_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "read_marker",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bumped when the layout of a checkpoint directory changes incompatibly."""
EXTRA_STATE_FILE = "extra_state.pt"
# -------------------------------------------------------------------------- save


def _broadcast_from_rank0(value: Any) -> Any:
    holder = [value]
    collectives.broadcast_object_list(holder, src=0)
    return holder[0]


def save_checkpoint(
    directory: str | Path,
    *,
    model: Sequence[torch.nn.Module],
    optimizer: MegatronOptimizer | None,
    scheduler: OptimizerParamScheduler | None,
    extra_state: dict[str, Any],
    step: int,
    reference: torch.nn.Module | None = None,
) -> Path:
    """Write the checkpoint of optimizer step ``step`` under ``directory``; collective.

    Args:
        directory: the run's checkpoint root (created if missing; shared by all ranks).
        model: this rank's model chunks (DDP-wrapped GPTModels, one per virtual stage).
        optimizer: the Megatron optimizer of ``model`` (plain or distributed), or None.
        scheduler: the LR scheduler, or None.
        extra_state: picklable run state; only rank 0's is written.
        step: optimizer steps done so far; names the directory.
        reference: this rank's frozen KL reference model (same layout as ``model``), or
            None.

    Returns:
        ``directory / checkpoint_name(step)``, complete on every rank when this returns.
        An existing checkpoint of the same step is replaced.

    Raises:
        CheckpointSaveError: writing failed for an OS reason (disk full, quota, permissions,
            I/O error) on some rank: the one-line message names the checkpoint and the OS
            error, and the save's ``.tmp`` directory has been removed. Other failures (bugs)
            propagate unchanged, also without leaving the ``.tmp`` directory.

    The save is synchronous; the shards of each rank are written by short-lived forked
    writer processes (Megatron's ``FileSystemWriterAsync``), see ``_write_results_in_process``.
    Then every rank hashes a share of the files for the marker.
    """
    root = Path(directory)
    final = root / checkpoint_name(step)
    started = time.monotonic()
    tmp: Path | None = None
    with _write_results_in_process() as writer_errors:
        try:
            tmp = _make_temporary_dir(root, final)
            state = sharded_state_dict(
                model, optimizer, scheduler, is_loading=False, with_rng=True, reference=reference
            )
            dist_checkpointing.save(state, str(tmp))  # ends with a collective: shards written
            if dist.get_rank() == 0:
                write_durably(tmp / EXTRA_STATE_FILE, _pickle(extra_state))
            files = _describe_files_collectively(tmp)
            if dist.get_rank() == 0:
                metadata = _marker_metadata(step, model, optimizer, scheduler, reference)
                metadata["save_seconds"] = round(time.monotonic() - started, 3)
                write_marker(tmp, metadata, files)  # last: the checkpoint is complete
                publish(tmp, final)
        except CheckpointException as failure:
            # torch and Megatron raise it on every rank together, after a collective that
            # all ranks completed: they can still agree on one message.
            error = _agreed_save_error(final, tmp, failure, writer_errors)
            if error is None:
                raise
            raise error from failure
        except Exception as failure:
            error = _local_save_error(final, tmp, failure)
            if error is None:
                raise
            raise error from failure
    collectives.barrier()
    return final


def _make_temporary_dir(root: Path, final: Path) -> Path:
    """Rank 0 creates the save's ``.tmp-`` directory; every rank gets its path."""
    tmp = None
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        tmp = temporary_sibling(final)
        tmp.mkdir()
    return Path(_broadcast_from_rank0(str(tmp) if tmp else None))


def _marker_metadata(
    step: int,
    model: Sequence[torch.nn.Module],
    optimizer: MegatronOptimizer | None,
    scheduler: OptimizerParamScheduler | None,
    reference: torch.nn.Module | None,
) -> dict[str, Any]:
    """What ``load_checkpoint`` checks before loading (the file list is added to it)."""
    return {
        "format_version": FORMAT_VERSION,
        "step": step,
        "layout": current_layout(),
        "model_chunks": len(model),
        "optimizer": None
        if optimizer is None
        else (DIST_OPTIMIZER_SHARDING if is_distributed_optimizer(optimizer) else "per_parameter"),
        "scheduler": scheduler is not None,
        "reference": reference is not None,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _describe_files_collectively(directory: Path) -> dict[str, dict[str, Any]] | None:
    """Size and checksum of every file of the checkpoint, on rank 0 (None elsewhere).

    All ranks hash a share, in parallel: one process would take minutes for a large model's
    optimizer state (SHA-256 runs at ~1.5 GB/s per core). The files are dealt largest first,
    round-robin, so the shares hold similar numbers of bytes.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    names = None
    if rank == 0:
        names = sorted(checkpoint_files(directory), key=lambda n: -(directory / n).stat().st_size)
    names = _broadcast_from_rank0(names)
    mine = describe_files(directory, names[rank::world])
    shares: list[Any] | None = [None] * world if rank == 0 else None
    collectives.gather_object(mine, shares, dst=0)
    if shares is None:
        return None
    return dict(sorted((name, entry) for share in shares for name, entry in share.items()))


# ----------------------------------------------------------------- save failures

_PROBE_BYTES = 1 << 20


def _agreed_save_error(
    final: Path,
    tmp: Path | None,
    failure: BaseException,  # CheckpointException derives from BaseException
    writer_errors: list[BaseException],
) -> CheckpointSaveError | None:
    """The save error every rank raises for a CheckpointException (collective).

    Only the coordinator rank sees the other ranks' failures, and those arrive pickled,
    without the OSError that caused them; so each rank contributes the OS error it saw
    itself (its shard writers report theirs to ``writer_errors``) and the lowest rank's
    wins. None when no rank saw one (a bug: the original exception is re-raised).
    """
    mine = _find_os_error(failure) or _find_os_error(*writer_errors) or _probe_write(tmp)
    summary = None if mine is None else (mine.errno, mine.strerror or str(mine))
    everyone: list[Any] = [None] * dist.get_world_size()
    collectives.all_gather_object(everyone, summary)
    if dist.get_rank() == 0 and tmp is not None:  # every rank is done with it now
        shutil.rmtree(tmp, ignore_errors=True)
    found = next((s for s in everyone if s is not None), None)
    return None if found is None else CheckpointSaveError(final, *found)


def _local_save_error(
    final: Path, tmp: Path | None, failure: Exception
) -> CheckpointSaveError | None:
    """The save error of a failure on this rank alone (the others are left waiting in a
    collective until the controller stops the group), or None if it has no OS cause."""
    cause = _find_os_error(failure) or _probe_write(tmp)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return None if cause is None else CheckpointSaveError.from_os_error(final, cause)


def _find_os_error(*errors: BaseException) -> OSError | None:
    """The first OSError among ``errors``, their causes and contexts, and the per-rank
    failures a CheckpointException carries."""
    pending, seen = list(errors), set()
    while pending:
        error = pending.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, OSError):
            return error
        if isinstance(error, CheckpointException):
            # Each failure is a (exception, traceback) pair ("WRAPPED_EXCEPTION").
            pending.extend(f[0] for f in error.failures.values() if isinstance(f, tuple))
        pending.extend(e for e in (error.__cause__, error.__context__) if e is not None)
    return None


def _probe_write(directory: Path | None) -> OSError | None:
    """The OS error a 1 MiB write into ``directory`` gets now, if any.

    torch.save (``common.pt``) reports a full disk as a RuntimeError without errno
    (``unexpected pos ...``): asking the OS with a write of our own tells a disk full (or
    read-only, or gone) apart from a bug. Right after a failed write the disk is still as
    full as that write left it.
    """
    if directory is None or not directory.is_dir():
        return None
    probe = directory / f".write-probe-{os.getpid()}"
    try:
        write_durably(probe, bytes(_PROBE_BYTES))
    except OSError as e:
        return e
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    return None


class _RecordingQueue(queue.Queue[Any]):
    """A queue.Queue that also keeps every exception put into it: the shard writers' OS
    errors, which Megatron re-raises wrapped in a RuntimeError that loses them on its way
    to the coordinator rank."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[BaseException] = []

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if isinstance(item, BaseException):
            self.errors.append(item)
        super().put(item, block, timeout)


@contextlib.contextmanager
def _write_results_in_process() -> Iterator[list[BaseException]]:
    """Collect the shard writers' results in a plain queue instead of a Manager queue;
    yields the list of the exceptions they report.

    Megatron's torch_dist writer hands its results over through a module-level queue that
    it creates, on first use, as ``multiprocessing.get_context("spawn").Manager().Queue()``
    so that an ASYNC save (a writer in another process) can report back. That Manager is a
    server process which re-imports ``__main__`` (a script without a ``__main__`` guard
    deadlocks), costs ~2 s to start, and outlives a rank killed by a signal (it then holds
    the rank's stdout open, so whatever reads it, e.g. a CI runner, waits forever). A
    synchronous save puts and gets the results in the rank's own process (the forked
    writers report through their own fork queue), where a ``queue.Queue`` is enough.
    """
    if not hasattr(filesystem_async, "_results_queue"):  # another Megatron: its own default
        yield []
        return
    previous = filesystem_async._results_queue
    recording = _RecordingQueue()
    filesystem_async._results_queue = recording
    try:
        yield recording.errors
    finally:
        filesystem_async._results_queue = previous


def _pickle(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


# -------------------------------------------------------------------------- load


def load_checkpoint(
    path: str | Path,
    *,
    model: Sequence[torch.nn.Module],
    optimizer: MegatronOptimizer | None,
    scheduler: OptimizerParamScheduler | None,
    restore_rng: bool = True,
    reference: torch.nn.Module | None = None,
) -> dict[str, Any]:
    """Load a complete checkpoint into this rank's model, optimizer and scheduler; collective.

    The model may have another TP/PP/DP layout than the one saved (dist checkpointing
    reshards). Optimizer state: the plain optimizer's reshards like the model; the
    DistributedOptimizer's (``dp_reshardable``) loads at any DP size but only at the saved
    TP/PP, and not into a plain optimizer (nor the reverse). Pass ``optimizer=None`` to
    load weights only.

    Args:
        path: a checkpoint directory (e.g. from ``latest_checkpoint``).
        model: this rank's model chunks, built for the current layout.
        optimizer: the optimizer of ``model``, or None to skip optimizer state.
        scheduler: the LR scheduler, or None to skip it.
        restore_rng: restore each rank's RNG states, when the layout equals the saved one
            (other layouts have no rank-to-rank correspondence: the states are skipped).
        reference: a model of ``model``'s layout to fill with the saved KL reference
            (``read_marker(path)["reference"]`` says whether there is one), or None.

    Returns:
        The ``extra_state`` given to ``save_checkpoint`` (on every rank; unpickled: load
        only checkpoints you trust).

    Raises:
        FileNotFoundError: ``path`` is not a complete checkpoint.
        ValueError: the optimizer/scheduler/reference asked for is not in the checkpoint
            or its format cannot be loaded into ``optimizer`` at this layout.
    """
    path = Path(path)
    marker = read_marker(path)
    if marker is None:
        raise FileNotFoundError(
            f"{path} is not a complete checkpoint (no {MARKER}); use latest_checkpoint()"
        )
    _check_compatible(marker, path, model, optimizer, scheduler)
    if reference is not None and not marker.get("reference"):
        raise ValueError(f"{path} has no KL reference model; pass reference=None")
    same_layout = marker["layout"] == current_layout()
    with_rng = restore_rng and same_layout
    state = sharded_state_dict(
        model, optimizer, scheduler, is_loading=True, with_rng=with_rng, reference=reference
    )
    loaded = dist_checkpointing.load(state, str(path))
    for index, (key, chunk) in enumerate(zip(model_keys(model), model, strict=True)):
        with virtual_pipeline_rank(index, len(model)):
            unwrap_model(chunk).load_state_dict(loaded[key], strict=True)
    if reference is not None:
        weights = {k.removeprefix(REFERENCE_PREFIX): v for k, v in loaded["reference"].items()}
        with torch.no_grad():
            unwrap_model(reference).load_state_dict(weights, strict=True)
    if optimizer is not None:
        steps = saved_adam_steps(optimizer, loaded["optimizer"])
        # Loading copies into parameters and optimizer state in place: no autograd history.
        with torch.no_grad():
            optimizer.load_state_dict(loaded["optimizer"])
        restore_adam_steps(optimizer, steps)
    if scheduler is not None:
        scheduler.load_state_dict(loaded["scheduler"])
    extra_state: dict[str, Any] = torch.load(path / EXTRA_STATE_FILE, weights_only=False)
    if with_rng:
        # Last: building the loading state dict above may have drawn random numbers.
        restore_rng_state(loaded["rng_state"])
    elif restore_rng:
        logger.warning(
            "checkpoint %s was saved at layout %s, now %s: RNG states not restored",
            path,
            marker["layout"],
            current_layout(),
        )
    return extra_state


def _check_compatible(
    marker: dict[str, Any],
    path: Path,
    model: Sequence[torch.nn.Module],
    optimizer: MegatronOptimizer | None,
    scheduler: OptimizerParamScheduler | None,
) -> None:
    """Fail before any collective I/O, with a message that says what to change."""
    if marker.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: checkpoint format {marker.get('format_version')}, this code reads "
            f"{FORMAT_VERSION}"
        )
    if scheduler is not None and not marker["scheduler"]:
        raise ValueError(f"{path} has no scheduler state; pass scheduler=None")
    if optimizer is None:
        return
    saved = marker["optimizer"]
    if saved is None:
        raise ValueError(f"{path} has no optimizer state; pass optimizer=None (weights only)")
    wanted = DIST_OPTIMIZER_SHARDING if is_distributed_optimizer(optimizer) else "per_parameter"
    if saved != wanted:
        raise ValueError(
            f"{path} holds {saved} optimizer state, the optimizer expects {wanted}: set "
            f"use_distributed_optimizer as when it was saved, or pass optimizer=None"
        )
    # dp_reshardable state is a list of grad-buffer buckets, whose contents depend on the
    # parameters each rank holds: TP, PP and the model chunks (virtual pipeline stages).
    was = (marker["layout"]["tp"], marker["layout"]["pp"], marker["model_chunks"])
    now = (current_layout()["tp"], current_layout()["pp"], len(model))
    if saved == DIST_OPTIMIZER_SHARDING and was != now:
        raise ValueError(
            f"{path}: the distributed optimizer state was saved at (tp, pp, model chunks) = "
            f"{was} and loads only there (at any DP size); this run has {now}. Pass "
            f"optimizer=None to load the weights only"
        )
