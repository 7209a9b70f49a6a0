"""What one side of a refit moved: the one transfer-statistics type of every transport.

Each sender half (policy rank) and receiver half (engine worker) fills one ``TransferStats``
and hands it back to the controller as ``as_report()``: plain floats, because the report
crosses Ray and vLLM's ``collective_rpc`` (msgpack), where a dataclass would not survive.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TransferStats:
    """What one side of a refit moved (for logs, tests and the refit bench)."""

    buckets: int = 0
    """Buckets sent or received."""
    bytes: int = 0
    """Bucket bytes sent or received (alignment padding included)."""
    tensors: int = 0
    """Tensors sent or received; a receiver checks it against the layout's count."""
    seconds: float = 0.0
    """Time in the transfer itself (a receiver's wait for the sender's handshake excluded)."""
    buffer_bytes: int = 0
    """Largest memory the transfer buffers held at once on this side."""
    names: list[str] = field(default_factory=list)
    """Names received, in order (receivers only; tests compare them with the layout)."""

    def as_report(self) -> dict[str, float]:
        """The plain-float report a worker returns to the controller (module docstring)."""
        return {
            "bytes": float(self.bytes),
            "buckets": float(self.buckets),
            "seconds": self.seconds,
            "buffer_bytes": float(self.buffer_bytes),
        }
