"""The bucket protocol of the weight refit: which tensors travel together, and where.

A refit streams the policy's HF-named tensors to the engines in buckets: each bucket is one
flat byte buffer holding several whole tensors at aligned offsets. The layout (names, shapes,
dtypes, offsets) is computed once from the model architecture on the sending side and given
to every receiver before the first byte moves, so a bucket carries only raw bytes and both
ends agree on its layout without any per-bucket metadata message.

The same layout serves every transport (NCCL or gloo broadcast, CUDA-IPC or shared-memory
handles): only how a bucket's bytes get from the sender's buffer to the receivers differs.

A tensor larger than the bucket size travels alone in a bucket of its own size, so no
tensor is ever split and the receiver can hand vLLM whole tensors; the peak memory of a
bucket is therefore ``max(bucket_bytes, largest tensor)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Offsets are multiples of this: any dtype view of a slice is then aligned, and on GPU each
# tensor starts on a cache-line/transaction boundary.
ALIGN_BYTES = 64


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _align(n: int) -> int:
    return (n + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives inside its bucket."""

    name: str
    """HF parameter name (what vLLM's ``load_weights`` expects)."""
    dtype: str
    """torch dtype name without "torch." (e.g. "bfloat16")."""
    shape: tuple[int, ...]
    """Full (unsharded) shape."""
    offset: int
    """Byte offset of the first element in the bucket buffer (a multiple of ALIGN_BYTES)."""

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclass(frozen=True)
class Bucket:
    """Tensors that travel together in one flat buffer."""

    slots: tuple[TensorSlot, ...]
    """The tensors, in send order."""
    nbytes: int
    """Buffer size in bytes (the end of the last slot, aligned)."""


@dataclass(frozen=True)
class BucketLayout:
    """The layout of every bucket of one model's refit (identical on all ranks)."""

    buckets: tuple[Bucket, ...]
    """Buckets in send order; their concatenated slots are the export order."""

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data (without alignment padding)."""
        return sum(s.nbytes for b in self.buckets for s in b.slots)

    @property
    def max_bucket_bytes(self) -> int:
        return max((b.nbytes for b in self.buckets), default=0)

    @property
    def num_tensors(self) -> int:
        return sum(len(b.slots) for b in self.buckets)

    def to_wire(self) -> list[list[list[Any]]]:
        """Plain lists (msgpack/pickle safe: crosses vLLM's collective_rpc unchanged)."""
        return [
            [[s.name, s.dtype, list(s.shape), s.offset] for s in b.slots] + [[b.nbytes]]
            for b in self.buckets
        ]

    @classmethod
    def from_wire(cls, wire: Sequence[Sequence[Sequence[Any]]]) -> BucketLayout:
        buckets = []
        for raw in wire:
            *slots, (nbytes,) = raw
            buckets.append(
                Bucket(
                    tuple(
                        TensorSlot(n, d, tuple(int(x) for x in sh), int(o)) for n, d, sh, o in slots
                    ),
                    int(nbytes),
                )
            )
        return cls(tuple(buckets))


def plan_buckets(
    tensors: Iterable[tuple[str, Sequence[int]]], dtype: torch.dtype, bucket_bytes: int
) -> BucketLayout:
    """Greedy buckets of at most ``bucket_bytes`` (a bigger tensor gets a bucket alone).

    What it returns is a ``BucketLayout``, the one name of the layout on both sides of the
    Ray boundary (``to_wire`` / ``from_wire``; ``layout_wire`` where it travels as lists);
    the function keeps a verb's name because it is where the buckets are planned.

    Args:
        tensors: (HF name, full shape) in the exporter's order.
        dtype: the wire dtype of every tensor (the engine's weight dtype).
        bucket_bytes: target bucket size in bytes (> 0).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    name = _dtype_name(dtype)
    size = torch.empty((), dtype=dtype).element_size()
    buckets: list[Bucket] = []
    slots: list[TensorSlot] = []
    end = 0
    for tensor_name, shape in tensors:
        numel = 1
        for s in shape:
            numel *= int(s)
        nbytes = numel * size
        start = _align(end)
        if slots and start + nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(slots), _align(end)))
            slots, start = [], 0
        slots.append(TensorSlot(tensor_name, name, tuple(int(s) for s in shape), start))
        end = start + nbytes
    if slots:
        buckets.append(Bucket(tuple(slots), _align(end)))
    return BucketLayout(tuple(buckets))


def pack(bucket: Bucket, tensors: Sequence[tuple[str, torch.Tensor]], buffer: torch.Tensor) -> None:
    """Copy ``tensors`` (the bucket's, in order) into ``buffer`` (uint8, >= bucket.nbytes).

    Converts to the wire dtype and device of the buffer on the way (one copy per tensor).

    Raises:
        ValueError: a tensor's name or shape differs from the layout (the exporter and the
            layout disagree: a bug, never silently loaded into the wrong parameter).
    """
    if len(tensors) != len(bucket.slots):
        raise ValueError(f"bucket of {len(bucket.slots)} tensors given {len(tensors)}")
    for slot, (name, tensor) in zip(bucket.slots, tensors, strict=True):
        if name != slot.name or tuple(tensor.shape) != slot.shape:
            raise ValueError(
                f"bucket layout expects {slot.name} {list(slot.shape)} here, the exporter "
                f"produced {name} {list(tensor.shape)}"
            )
        view(buffer, slot).copy_(tensor)


def view(buffer: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    """The slot's tensor as a view into the bucket buffer (no copy)."""
    raw = buffer[slot.offset : slot.offset + slot.nbytes]
    return raw.view(getattr(torch, slot.dtype)).view(slot.shape)


def unpack(bucket: Bucket, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(name, view) of every tensor of a received bucket; the views share ``buffer``."""
    return [(slot.name, view(buffer, slot)) for slot in bucket.slots]
