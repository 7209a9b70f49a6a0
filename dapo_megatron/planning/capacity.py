"""The memory a GPU really offers, and the safety margin a memory plan keeps below it.

A card's marketing size is not what PyTorch can allocate: an "80 GB" H100 carries 80 GiB
of HBM3, nvidia-smi shows 81559 MiB (79.6 GiB) of it, and ``torch.cuda.mem_get_info()``
(cudaMemGetInfo) reports a total of about 79.2 GiB: what the firmware and the driver
reserve never reaches the allocator. vLLM
sizes its budget as ``gpu_memory_utilization`` x that reported total, and every phase of a
plan must fit in it, so dapo-plan plans against the reported capacity (``CARDS``), not the
marketed one.

``CARDS`` are estimates of ``mem_get_info()``'s total, taken from nvidia-smi's totals less
the ~0.4-0.5 GiB the driver keeps, and from the "total capacity" PyTorch prints in its
out-of-memory messages on each card; a real card may differ by ~0.1-0.3 GiB (driver
version, ECC, MIG off). ``reported_cuda_gib`` measures it on a CUDA node instead.

The margin (``default_margin_gib``): a phase fits only when its modelled peak stays below
the capacity by at least max(5 % of the card, 2 GiB). Why both parts:

* 5 %: the modelled terms are estimates whose error grows with the working set: the caching
  allocator's fragmentation (blocks split and rounded to 2 MiB segments, a few % of what it
  reserves), vLLM's profile run against its real activations, Megatron's padding of its
  buffers. On an 80 GB card that is ~4 GiB.
* 2 GiB floor: the fixed-size terms (CUDA contexts, NCCL buffers, cuBLAS/TE workspaces,
  CUDA-graph pools, memory_terms.Overheads) are each good to a few hundred MiB and do not
  shrink with the card, so a 24 GB card keeps 2 GiB rather than 1.1.
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo_megatron.config.errors import ConfigError

GIB = 2**30
MARGIN_FRACTION = 0.05
"""Share of the card kept free by default (fragmentation, estimate errors that scale)."""
MARGIN_FLOOR_GIB = 2.0
"""Smallest default margin (fixed-size overheads whose error does not shrink with the card)."""


@dataclass(frozen=True)
class Card:
    """One GPU model as the allocator sees it."""

    name: str
    """The --gpu-mem name."""
    reported_gib: float
    """Total that ``torch.cuda.mem_get_info()`` reports, in GiB (estimate; module docstring)."""
    description: str
    """What the card is sold as, and where the number comes from."""


_CARD_LIST = (
    Card("h100-80gb", 79.2, "H100 SXM/PCIe 80GB HBM3: nvidia-smi 81559 MiB = 79.6 GiB"),
    Card("a100-80gb", 79.2, "A100 SXM4/PCIe 80GB: nvidia-smi 81920 MiB = 80.0 GiB"),
    Card("h200", 139.8, "H200 141GB HBM3e: nvidia-smi 143771 MiB = 140.4 GiB"),
    Card("a100-40gb", 39.4, "A100 SXM4/PCIe 40GB: nvidia-smi 40960 MiB = 40.0 GiB"),
    Card("rtx4090", 23.6, "GeForce RTX 4090 24GB: nvidia-smi 24564 MiB = 24.0 GiB"),
    Card("l4", 22.0, "L4 24GB: nvidia-smi 23034 MiB = 22.5 GiB"),
    Card("a10g", 22.0, "A10G 24GB (AWS g5): nvidia-smi 23028 MiB = 22.5 GiB"),
)
CARDS: dict[str, Card] = {c.name: c for c in _CARD_LIST}
"""Cards --gpu-mem accepts by name."""
_ALIASES = {"h100": "h100-80gb", "a100": "a100-80gb", "h200-141gb": "h200", "4090": "rtx4090"}
DEFAULT_CARD = "h100-80gb"
"""The card dapo-plan plans for without --gpu-mem (the recipes' 80 GB layout assumption)."""
DEFAULT_GPU_MEM_GIB = CARDS[DEFAULT_CARD].reported_gib
"""Its reported capacity: 79.2 GiB, not 80."""


def card_names() -> str:
    """The accepted names, for help and error messages."""
    return ", ".join(CARDS)


def parse_gpu_mem(text: str) -> tuple[float, str]:
    """(GiB, label) of a --gpu-mem value: a number of GiB, or a card name of ``CARDS``.

    The label says what was planned for ("h100-80gb, 79.2 GiB reported" or "40 GiB").
    Raises ConfigError for an unknown name or a capacity <= 0.
    """
    key = text.strip().lower()
    name = _ALIASES.get(key, key)
    if name in CARDS:
        card = CARDS[name]
        return card.reported_gib, f"{card.name}, {card.reported_gib:g} GiB reported"
    try:
        gib = float(key)
    except ValueError:
        raise ConfigError(
            f"--gpu-mem = {text!r}: give GiB (e.g. 79.2) or a card name: {card_names()}"
        ) from None
    if not gib > 0:  # also refuses nan
        raise ConfigError(f"--gpu-mem = {text}: must be > 0 GiB")
    return gib, f"{gib:g} GiB"


def default_margin_gib(capacity_gib: float) -> float:
    """The safety margin a phase keeps below the capacity: max(5 % of it, 2 GiB)."""
    return max(MARGIN_FRACTION * capacity_gib, MARGIN_FLOOR_GIB)


def reported_cuda_gib(device: int = 0) -> float | None:
    """The total ``torch.cuda.mem_get_info()`` reports for a visible CUDA device, in GiB;
    None without CUDA. Initialises a CUDA context in the calling process (~0.5 GiB on the
    device): call it from a process that will use the GPU anyway."""
    import torch  # only here: planning stays importable without torch

    if not torch.cuda.is_available():
        return None
    _, total = torch.cuda.mem_get_info(device)
    return total / GIB
