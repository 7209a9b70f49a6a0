"""Card and interconnect figures, and the roofline cost of a list of ops (no torch).

The step-time estimate (step_time.py) prices every op at the card's peak:
``max(flops / peak FLOP/s, bytes / HBM bandwidth)``, summed over the ops, one op at a time
(an elementwise op's bytes do not hide under a GEMM's FLOPs: they are separate kernels).
``OpCosts`` keeps the ops both the analytic model (step_time.py) and the tracer's
dispatch mode (trace/op_cost.py) produce, so the two are priced by the same function.

Peak figures are the vendors' datasheet numbers: dense bf16 tensor-core FLOP/s (without
the 2:4 sparsity doubling) and HBM bandwidth. Kernels at datasheet peak is optimistic:
large bf16 GEMMs reach ~70-80 % of it on H100, attention and small GEMMs less.

Collectives are priced on a per-GPU *bus bandwidth* (nccl-tests' busbw: a ring
all-gather / reduce-scatter of S bytes over g ranks moves S (g - 1) / g bytes per rank, in
S (g - 1) / g / busbw seconds; an all-reduce twice that), an achievable figure below the
link's line rate, named with its reason in each ``Link``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Card:
    """One GPU's peak compute and memory bandwidth (datasheet figures)."""

    name: str
    """Short name, as dapo-plan prints it."""
    peak_flops: float
    """Dense bf16 tensor-core FLOP/s (no sparsity)."""
    hbm_bytes_per_s: float
    """HBM bandwidth, bytes/s."""
    intra_node: Link
    """The link between GPUs of one node (tensor, context and expert parallel groups that
    fit a node)."""
    inter_node: Link
    """The link between nodes (one NIC per GPU)."""
    source: str
    """Where the figures come from."""


@dataclass(frozen=True)
class Link:
    """An interconnect and the bus bandwidth a collective achieves on it."""

    name: str
    """What it is."""
    line_bytes_per_s: float
    """Line rate per GPU per direction, bytes/s."""
    bus_bytes_per_s: float
    """Assumed achievable nccl-tests bus bandwidth per GPU for large messages, bytes/s."""
    why: str
    """Why that figure."""


GB = 1e9
TB = 1e12

NVLINK4 = Link(
    "NVLink 4 (NVSwitch)",
    450 * GB,
    360 * GB,
    "H100/H200 SXM: 18 links x 25 GB/s = 450 GB/s per direction (900 GB/s bidirectional, "
    "NVIDIA H100 datasheet); ring collectives use one direction per link and NCCL reaches "
    "~80 % of it at the 10-100 MB sizes of per-layer TP collectives (nccl-tests all_gather "
    "busbw on DGX H100 without NVLS ~350-370 GB/s)",
)
NVLINK3 = Link(
    "NVLink 3 (NVSwitch)",
    300 * GB,
    240 * GB,
    "A100 SXM: 12 links x 25 GB/s = 300 GB/s per direction (600 GB/s bidirectional, NVIDIA "
    "A100 datasheet); ~80 % achievable, as for NVLink 4",
)
IB_NDR = Link(
    "InfiniBand NDR 400 Gb/s per GPU",
    50 * GB,
    40 * GB,
    "DGX H100/H200: one ConnectX-7 NDR 400 Gb/s NIC per GPU = 50 GB/s line rate; ~80 % "
    "achievable by NCCL across nodes (protocol and ring overheads)",
)
IB_HDR = Link(
    "InfiniBand HDR 200 Gb/s per GPU",
    25 * GB,
    20 * GB,
    "DGX A100: one ConnectX-6 HDR 200 Gb/s NIC per GPU = 25 GB/s line rate; ~80 % achievable",
)
PCIE4 = Link(
    "PCIe Gen4 x16",
    32 * GB,
    24 * GB,
    "cards without NVLink (L4): 16 GT/s x 16 lanes = ~32 GB/s per direction; ~75 % "
    "achievable through the host bridge",
)
ETHERNET_100G = Link(
    "100 Gb/s Ethernet per node",
    12.5 * GB,
    10 * GB,
    "a typical L4 cloud node's network (no InfiniBand): 12.5 GB/s line rate; ~80 % achievable",
)

_CARD_LIST = (
    Card(
        "H100 SXM",
        989 * TB,
        3.35 * TB,
        NVLINK4,
        IB_NDR,
        "NVIDIA H100 datasheet (SXM5): 989 TFLOP/s dense bf16, 3.35 TB/s HBM3",
    ),
    Card(
        "H200",
        989 * TB,
        4.8 * TB,
        NVLINK4,
        IB_NDR,
        "NVIDIA H200 datasheet (SXM): 989 TFLOP/s dense bf16 (the H100's compute), 4.8 TB/s HBM3e",
    ),
    Card(
        "A100 80GB",
        312 * TB,
        2.0 * TB,
        NVLINK3,
        IB_HDR,
        "NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOP/s dense bf16, 2.0 TB/s HBM2e (2,039 GB/s)",
    ),
    Card(
        "A100 40GB",
        312 * TB,
        1.555 * TB,
        NVLINK3,
        IB_HDR,
        "NVIDIA A100 datasheet (SXM4 40GB): 312 TFLOP/s dense bf16, 1,555 GB/s HBM2",
    ),
    Card(
        "L4",
        121 * TB,
        0.3 * TB,
        PCIE4,
        ETHERNET_100G,
        "NVIDIA L4 datasheet: 242 TFLOP/s bf16 with 2:4 sparsity = 121 dense, 300 GB/s GDDR6",
    ),
)
COMPUTE_CARDS: dict[str, Card] = {c.name: c for c in _CARD_LIST}
"""Cards with compute figures, by name."""

_BY_CAPACITY_NAME = {
    "h100-80gb": "H100 SXM",
    "h100": "H100 SXM",
    "h200": "H200",
    "h200-141gb": "H200",
    "a100-80gb": "A100 80GB",
    "a100": "A100 80GB",
    "a100-40gb": "A100 40GB",
    "l4": "L4",
}
DEFAULT_COMPUTE_CARD = "H100 SXM"
"""The card the estimate uses when --gpu-mem names no card it has figures for (a number of
GiB, or a card such as an L4): the recipes' 80 GB layout assumption."""


def compute_card(gpu_mem: str) -> tuple[Card, bool]:
    """(card, exact) for a dapo-plan --gpu-mem value: the card it names, else H100 SXM with
    exact False (a number of GiB, or a card without compute figures here)."""
    name = _BY_CAPACITY_NAME.get(gpu_mem.strip().lower())
    if name is None:
        return COMPUTE_CARDS[DEFAULT_COMPUTE_CARD], False
    return COMPUTE_CARDS[name], True


def roofline_s(flops: float, nbytes: float, card: Card) -> float:
    """One op's time at the card's peak: the slower of its compute and its memory traffic."""
    return max(flops / card.peak_flops, nbytes / card.hbm_bytes_per_s)


OpKey = tuple[str, int, int]
"""(op name, FLOPs, bytes read + written) of one op."""


@dataclass
class OpCosts:
    """FLOPs and bytes of a sequence of ops, kept per distinct (op, FLOPs, bytes) with a
    count: the roofline takes each op's own max, and the ops of a transformer repeat
    (every layer, every micro-batch), so ~1e5 traced ops collapse to ~1e3 keys."""

    counts: dict[OpKey, int] = field(default_factory=dict)
    """How many times each (op name, FLOPs, bytes) ran."""

    def add(self, op: str, flops: int, nbytes: int, count: int = 1) -> None:
        """Record `count` runs of one op."""
        key = (op, int(flops), int(nbytes))
        self.counts[key] = self.counts.get(key, 0) + count

    def extend(self, other: OpCosts, times: int = 1) -> None:
        """Add every op of `other`, `times` over."""
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n * times

    @property
    def flops(self) -> int:
        """Total FLOPs."""
        return sum(f * n for (_, f, _), n in self.counts.items())

    @property
    def bytes(self) -> int:
        """Total bytes read and written."""
        return sum(b * n for (_, _, b), n in self.counts.items())

    @property
    def ops(self) -> int:
        """Ops recorded."""
        return sum(self.counts.values())

    def roofline_s(self, card: Card) -> float:
        """Seconds on `card` with every op at its roofline: sum of max(flops / peak, bytes
        / bandwidth) per op."""
        return sum(n * roofline_s(f, b, card) for (_, f, b), n in self.counts.items())

    def to_rows(self) -> list[list[str | int]]:
        """[[op, FLOPs, bytes, count], ...]: JSON for a trace process's result."""
        return [[name, f, b, n] for (name, f, b), n in self.counts.items()]

    @classmethod
    def from_rows(cls, rows: list[list[str | int]]) -> OpCosts:
        """The inverse of ``to_rows``."""
        out = cls()
        for name, f, b, n in rows:
            out.add(str(name), int(f), int(b), int(n))
        return out

    def by_op(self) -> dict[str, tuple[int, int, int]]:
        """Op name -> (count, FLOPs, bytes), largest FLOPs first."""
        out: dict[str, tuple[int, int, int]] = {}
        for (name, f, b), n in self.counts.items():
            c0, f0, b0 = out.get(name, (0, 0, 0))
            out[name] = (c0 + n, f0 + f * n, b0 + b * n)
        return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))
