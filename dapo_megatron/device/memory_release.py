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
        without CUDA, where nothing is called (the CPU allocator caches nothing).
    """
    if not torch.cuda.is_available():
        return {"reserved_before": 0, "reserved_after": 0, "released": 0}
    before = int(torch.cuda.memory_reserved())
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    after = int(torch.cuda.memory_reserved())
    _log.debug("%s: %d of %d reserved bytes returned", reason, before - after, before)
    return {"reserved_before": before, "reserved_after": after, "released": before - after}
