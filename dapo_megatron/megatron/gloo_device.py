"""One gloo transport device for all the process groups a rank creates.

torch gives every gloo process group a transport device of its own
(``ProcessGroupGloo(store, rank, size, timeout)`` builds options with a fresh default
device), and each gloo TCP device runs an event-loop thread that wakes every 10 ms to
poll. Megatron's ``initialize_model_parallel`` creates about twenty groups (TP, PP, DP,
CP, their products, embeddings, the gloo DP copies), so a CPU rank carried ~20 such
threads, ~2,000+ wake-ups a second. Where ranks and engines share a few cores (this
project's CPU path, where the overlapped loop keeps both cores busy), every wake-up
preempts a rank's main thread: measured on the 2-core machine, ~12,000 context switches
in ~2 s per worker process, and ~35% of each worker's runnable time spent waiting for a core.

Inside ``one_gloo_device()`` every gloo group is built with options naming shared
devices, chosen exactly as torch's own constructor chooses them
(torch/csrc/distributed/c10d/init.cpp, ``ProcessGroupGloo(store, rank, size, timeout)``):
one per interface listed in ``GLOO_SOCKET_IFNAME`` (comma-separated; multi-node runs set
it to pick the NIC), else the default device (the hostname's address, or loopback), and
two worker threads per device. A gloo device is designed to serve many contexts: each group still
has its own context, store prefix, pairs and worker threads, so collectives and their
ordering are unchanged; only the listening socket and the polling thread are shared.
The groups are instances of a subclass of ``ProcessGroupGloo``, so torch's ``isinstance``
checks hold.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator

from torch.distributed import distributed_c10d

_DEFAULT_TIMEOUT = datetime.timedelta(seconds=1800)  # ProcessGroupGloo's own default


@contextlib.contextmanager
def one_gloo_device() -> Iterator[None]:
    """Gloo groups created inside share one transport device (module docstring)."""
    base = distributed_c10d.ProcessGroupGloo
    interfaces = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if len(interfaces) > 1:  # torch's test: a set, non-trivial value
        devices = [base.create_device(interface=name) for name in interfaces.split(",")]
    else:
        devices = [base.create_default_device()]

    class SharedDeviceGloo(base):  # type: ignore[misc, valid-type]
        """A ProcessGroupGloo on the shared device (same signature as torch's call)."""

        def __init__(
            self,
            store: object,
            rank: int,
            size: int,
            timeout: datetime.timedelta = _DEFAULT_TIMEOUT,
        ) -> None:
            options = base._Options()  # type: ignore[attr-defined]
            options._devices = devices
            options._timeout = timeout
            options._threads = 2 * len(devices)
            super().__init__(store, rank, size, options)

    distributed_c10d.ProcessGroupGloo = SharedDeviceGloo  # type: ignore[misc]
    try:
        yield
    finally:
        distributed_c10d.ProcessGroupGloo = base  # type: ignore[misc]
