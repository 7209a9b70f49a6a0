"""Give a process's cached CUDA memory back to the driver at a colocated phase change.

PyTorch's caching allocator keeps every block it ever reserved after the tensors in it are
freed, for reuse by the same process only. When a vLLM engine shares a GPU with a policy
rank (``cluster.colocated``), the policy's training peak (activations, logits, workspaces)
would stay reserved while the engine maps its weights and KV cache back, and the engine's
leftovers would stay reserved while the policy trains: each phase must start with the
other process's cache returned. The memory plan (planning/memory.py) counts only what stays
allocated across the change (weights, grad buffer, optimizer states), which holds only
after this release.

The order matters: ``synchronize`` first (a block still used by a queued kernel is not
free yet), then ``gc.collect`` (tensors held only by reference cycles are freed, so their
blocks become releasable), then ``empty_cache`` (unmaps every segment without a live
block). Blocks in use stay: a segment with one live tensor is not returned.

Only a process that has initialised CUDA holds cached blocks, and only that one may call
``synchronize``: torch 2.13's ``torch.cuda.synchronize`` (torch/cuda/__init__.py) calls
``_lazy_init()`` first, which in a process without CUDA state creates a CUDA context on its
first visible device (~0.3-0.6 GiB outside the allocator) and frees nothing, whereas
``empty_cache`` (torch/cuda/memory.py) does nothing unless ``is_initialized()`` and
``memory_reserved`` reads ``memory_stats``, which is empty then. The colocated engine actor
is such a process when vLLM runs its engine core in child processes (the default on GPU:
VLLM_ENABLE_V1_MULTIPROCESSING=1, or the ``mp`` executor): its memory lives, and is
released by vLLM's own sleep, in those children. So a process whose
``torch.cuda.is_initialized()`` is False returns zeros and calls nothing.
"""

from __future__ import annotations

import gc
import logging

import torch

_log = logging.getLogger(__name__)


def release_cached_memory(reason: str) -> dict[str, int]:
    """Return this process's unused cached CUDA blocks to the driver (module docstring).

    Args:
        reason: the phase change, named in the debug log ("policy: before the
            colocated engines wake").

    Returns:
        ``reserved_before`` and ``reserved_after`` (bytes the caching allocator held on the
        current device before and after) and ``released`` (their difference); all zero
        without CUDA, where nothing is called (the CPU allocator caches nothing), and in a
        process that has not initialised CUDA, where nothing may be called: synchronize
        would create a CUDA context there (module docstring).
    """
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {"reserved_before": 0, "reserved_after": 0, "released": 0}
    before = int(torch.cuda.memory_reserved())
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    after = int(torch.cuda.memory_reserved())
    _log.debug("%s: %d of %d reserved bytes returned", reason, before - after, before)
    return {"reserved_before": before, "reserved_after": after, "released": before - after}
