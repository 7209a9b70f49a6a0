"""Start the ranks that export a dist checkpoint to Hugging Face format (dapo-export).

``launch_export(checkpoint_dir, out_dir, config)`` checks the paths and the layout in this
process (clear ``ExportError`` messages, nothing started), then spawns one process per rank
of the checkpoint's TP x PP layout on this machine, each calling
``export_hf.export_checkpoint``, and waits for them. The ranks rendezvous over loopback
(gloo on CPU; nccl with one GPU per rank when the run's ``cluster.device`` is cuda, since a
checkpoint of Transformer Engine layers must be read by the same layers).

A rank that fails makes the launch raise with the rank's traceback; the other ranks are
killed (they would otherwise wait in a collective forever). Megatron is imported in the
ranks only.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.megatron.export_hf import (
    DEFAULT_MAX_SHARD_SIZE,
    ExportError,
    base_arch,
    check_checkpoint_dir,
    check_layout,
    check_out_dir,
    tokenizer_dir,
    tokenizer_files,
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the processes spawned inside (restored after)."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


EXPECTED_RANK_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # Megatron at import, on a machine without TE/Apex: the export reads and writes
    # tensors, it runs no fused kernel, so the fallbacks change nothing it does.
    (UserWarning, "Transformer Engine and Apex are not installed", r"megatron\.core\."),
    (UserWarning, "Apex is not installed", r"megatron\.core\."),
    # A default Megatron's TransformerConfig sets itself; no graph is captured here.
    (UserWarning, "full scope is deprecated", r"megatron\.core\.transformer\."),
    # Megatron's dist-checkpoint loader calls torch's old name for the load, and torch warns
    # about the ShardedTensor it is handed: both Megatron's code, nothing a user can change.
    (FutureWarning, "`load_state_dict` is deprecated", r"megatron\.core\.dist_checkpointing\."),
    (FutureWarning, "Please use DTensor instead", r"torch\.distributed\.checkpoint\."),
)
"""(category, message start, issuing module) of the third-party warnings every export rank
printed (dapo-export's console held nine of them for two lines of its own); each is matched
by all three, so any other warning of these libraries still shows."""


def quiet_expected_warnings() -> None:
    """Ignore EXPECTED_RANK_WARNINGS in this process: called first in each export rank, a
    process of the export's own, so no other code's warnings filter changes."""
    import warnings

    for category, message, module in EXPECTED_RANK_WARNINGS:
        warnings.filterwarnings(
            "ignore", message=re.escape(message), category=category, module=module
        )


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    checkpoint_dir: str,
    out_dir: str,
    config: DapoMegatronConfig,
    tp: int,
    pp: int,
    max_shard_size: int,
    threads: int,
) -> None:
    """One rank (spawned): the launcher variables, then the collective export."""
    quiet_expected_warnings()
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.megatron.export_hf import export_checkpoint

    dims = ParallelDims(tp=tp, pp=pp, cp=1, dp=1, sequence_parallel=False)
    export_checkpoint(
        checkpoint_dir, out_dir, config=config, dims=dims, max_shard_size=max_shard_size
    )


def _device(config: DapoMegatronConfig) -> str:
    """cluster.device, with auto resolved as the run plan resolves it (``plan.device``)."""
    from dapo_megatron.config.run_plan import resolve_device

    return resolve_device(config.cluster)


def preflight(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    config: DapoMegatronConfig,
    *,
    tp: int | None = None,
    pp: int | None = None,
) -> tuple[int, int, dict[str, Any]]:
    """Check everything an export needs without starting it: ``(tp, pp, marker)``.

    ``tp``/``pp`` default to the saved layout's.

    Raises:
        ExportError: missing or incomplete checkpoint, non-empty output directory, no base
            model config or tokenizer, a layout the model does not split into.
    """
    marker = check_checkpoint_dir(checkpoint_dir)
    check_out_dir(out_dir)
    arch, _ = base_arch(config)
    tokenizer_files(tokenizer_dir(config))
    tp = int(tp or marker["layout"]["tp"])
    pp = int(pp or marker["layout"]["pp"])
    check_layout(arch, tp, pp)
    return tp, pp, marker


def launch_export(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    config: DapoMegatronConfig,
    *,
    tp: int | None = None,
    pp: int | None = None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    timeout: float | None = None,
) -> Path:
    """Export ``checkpoint_dir`` to ``out_dir`` with tp x pp local ranks; returns ``out_dir``.

    Args:
        checkpoint_dir: a complete ``step_NNNNNN`` checkpoint directory.
        out_dir: the HF directory to create.
        config: the run's config (base model, precision, cluster.device).
        tp, pp: the export's layout; default: the one the checkpoint was saved with.
        max_shard_size: bytes per safetensors shard.
        timeout: seconds before the ranks are killed (None: no limit).

    Raises:
        ExportError: a user error, found before any rank starts.
        torch.multiprocessing.ProcessRaisedException: a rank failed (holds its traceback).
        torch.multiprocessing.ProcessExitedException: a rank died (signal, exit code).
        TimeoutError: ``timeout`` ran out.
    """
    import torch
    import torch.multiprocessing as mp

    tp, pp, _ = preflight(checkpoint_dir, out_dir, config, tp=tp, pp=pp)
    world_size = tp * pp
    env: dict[str, str] = {}
    threads = 0
    if _device(config) == "cuda":
        available = torch.cuda.device_count()
        if available < world_size:
            raise ExportError(
                f"the export at TP{tp} PP{pp} needs {world_size} GPUs (cluster.device = cuda), "
                f"this machine has {available}; run it where the layout fits"
            )
    else:
        # Hide GPUs: the ranks build the CPU model (gloo, local layer spec) the run used.
        env["CUDA_VISIBLE_DEVICES"] = ""
        threads = max(1, (os.cpu_count() or 1) // world_size)
    args = (
        world_size,
        _free_port(),
        str(checkpoint_dir),
        str(out_dir),
        config,
        tp,
        pp,
        max_shard_size,
        threads,
    )
    with _environ(**env):
        context = mp.start_processes(
            _rank_main, args=args, nprocs=world_size, join=False, start_method="spawn"
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        # join() raises when a rank fails, after terminating the others.
        while not context.join(timeout=1.0):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"the export of {checkpoint_dir} ran over {timeout} s; ranks killed"
                )
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join()
    return Path(out_dir)
