"""GenerationWorker: one rollout engine as a Ray actor, for engines the policy does not own.

Used when the engines are separate from the policy ranks: split mode (engines on devices
of their own) and, on GPU, colocated vLLM engines (an engine process next to the policy
ranks on the same devices, asleep while they train). The colocated Megatron engine needs
no worker: it runs inside the policy ranks on their own model (workers/policy_worker.py).

Backends (``generation.backend``):

* ``vllm``: ``VllmGenerationBackend`` on the HF checkpoint, with the engine's tensor
  parallel size (vLLM starts its own rank processes for TP > 1).
* ``megatron``: a Megatron-Core model of its own in a private one-process
  torch.distributed world (TP1), loaded from the HF checkpoint and refitted from the
  policy's exported HF tensors.

Refit: the worker joins the run's weight-update group with ``weight_ranks()`` members (every
vLLM engine worker, or the one Megatron process) and receives the policy's buckets in place
(``receive_weights``), through the backend's typed refit methods (``GenerationBackend``;
both engines receive with ``dapo_megatron.refit.receiver``). ``update_weights`` is the
object-store fallback; the worker counts how often each path delivered weights, so a run
(and its tests) can show which one did.

Like PolicyWorker, the class is plain Python (the controller wraps it with ``ray.remote``)
so it can run in-process for debugging.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ray
import torch

from dapo_megatron.config.refit_transport import RefitTransport
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.device import shm_files
from dapo_megatron.device.memory_release import release_cached_memory
from dapo_megatron.generation.base import GenerationBackend
from dapo_megatron.logging.worker_logs import redirect_worker_output
from dapo_megatron.refit.group import GroupAddress
from dapo_megatron.shared.sampling import Sample, SamplingParams
from dapo_megatron.workers import ignore_expected_megatron_warnings

VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def apply_visible_devices(visible_devices: str | None) -> None:
    """Show this process (and the engine processes it starts) exactly these devices.

    Must run before CUDA is initialised in the process; vLLM's multiprocessing workers are
    started later, as children, and inherit the variable (controller/actors/placement.py)."""
    if visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices


def _engine_died(error: BaseException) -> bool:
    """vLLM's signs of an engine whose core or worker processes are gone (vllm/v1/engine/
    exceptions.py EngineDeadError; v1/engine/core.py "Executor failed.")."""
    return type(error).__name__ == "EngineDeadError" or "Executor failed" in str(error)


def _exit_worker(error: BaseException, what: str) -> None:
    """End this actor: the controller then sees a dead worker and restarts the run from the
    last checkpoint, as for any other lost worker (an engine cannot be repaired in place)."""
    print(f"[generation worker] {what} failed: {error!r}; this engine exits", flush=True)
    os._exit(1)


def engine_memory_in_process(backend: GenerationBackend) -> bool:
    """Whether the backend's device memory is in this actor's process: a vLLM backend says
    so itself (``VllmGenerationBackend.memory_in_process``); the Megatron engine always is."""
    return bool(getattr(backend, "memory_in_process", True))


class GenerationWorker:
    """One generation engine (all of its ranks when the backend spawns them itself)."""

    def __init__(
        self,
        plan: RunPlan,
        *,
        engine_index: int,
        num_threads: int = 1,
        visible_devices: str | None = None,
    ) -> None:
        """Args:
        plan: the run plan (generation.*, policy model path, precision, architecture).
        engine_index: this engine's index (its seed offset, and its name in errors).
        num_threads: torch intra-op threads (CPU).
        visible_devices: CUDA_VISIBLE_DEVICES for the engine, set before any CUDA call:
            a colocated engine with TP > 1 must see the devices of several policy ranks,
            while Ray shows an actor only the device of its own bundle.
        """
        self.plan = plan
        self.config = plan.config
        self.engine_index = engine_index
        # Before anything prints (the engine's, vLLM's and Ray's notes): a file under the
        # run directory, not the user's console.
        redirect_worker_output(plan.run_dir, f"generation_engine{engine_index}")
        torch.set_num_threads(max(1, num_threads))
        apply_visible_devices(visible_devices)
        ignore_expected_megatron_warnings()
        self.backend: GenerationBackend | None = None
        # Deliveries per path, reported with every refit (tests assert on them).
        self.refit_counts = {"collective": 0, "object_store": 0, "bytes_received": 0}

    def setup(self) -> dict[str, Any]:
        """Start the engine on the policy's HF checkpoint; returns a description."""
        config = self.config
        engine, policy = config.generation.engine, config.policy
        shm_before = shm_files.listing()
        if config.generation.backend == "vllm":
            from dapo_megatron.generation.vllm_backend import VllmGenerationBackend

            self.backend = VllmGenerationBackend(
                policy.model_name_or_path,
                tensor_parallel_size=engine.tensor_parallel_size,
                gpu_memory_utilization=engine.gpu_memory_utilization,
                max_num_seqs=engine.max_num_seqs,
                enforce_eager=engine.enforce_eager,
                max_model_len=policy.max_total_sequence_length,
                seed=config.run.seed + self.engine_index,
                dtype=VLLM_DTYPES[policy.precision],
                sampling_seeds=self.plan.sampling_seeds,
            )
        else:
            self.backend = self._megatron_engine()
        return {
            "engine": self.engine_index,
            "backend": config.generation.backend,
            "pid": os.getpid(),
            # What a kill of this engine would leave in /dev/shm: the controller removes
            # them after a death, on this node (device/shm_files.py).
            "shm_files": shm_files.engine_files(shm_before),
            "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
        }

    def _megatron_engine(self) -> GenerationBackend:
        from dapo_megatron.config.parallel import ParallelDims
        from dapo_megatron.megatron.decode_step import DecodeOptions
        from dapo_megatron.megatron.distributed import initialize_parallel
        from dapo_megatron.megatron.hf_weights import load_hf_checkpoint
        from dapo_megatron.megatron.inference import MegatronGenerationBackend
        from dapo_megatron.megatron.model import build_model

        policy = self.config.policy
        arch = self.plan.require_arch()
        # A world of its own: the engine never joins the policy's collectives.
        for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            os.environ.pop(name, None)
        dims = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)
        initialize_parallel(dims, seed=self.config.run.seed + self.engine_index)
        # Built here rather than by MegatronGenerationBackend.from_hf_checkpoint: the layer
        # spec follows the policy's (policy.allow_local_spec on a CUDA machine without TE).
        model = build_model(
            arch,
            dims,
            policy.precision,
            allow_local_spec=policy.allow_local_spec,
            moe=self.plan.moe,  # routing replay: the engine records what the policy replays
        )
        load_hf_checkpoint(model, policy.model_name_or_path, arch, dims)
        return MegatronGenerationBackend(
            model,
            arch,
            dims,
            max_batch_size=self.config.generation.engine.max_num_seqs,
            max_model_len=policy.max_total_sequence_length,
            refit_device=self.plan.device,
            decode=DecodeOptions(cuda_graphs=not self.config.generation.engine.enforce_eager),
        )

    def _require_backend(self) -> GenerationBackend:
        if self.backend is None:
            raise RuntimeError("GenerationWorker.setup() must run before any other call")
        return self.backend

    def generate(
        self, prompts_token_ids: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        try:
            return self._require_backend().generate([list(p) for p in prompts_token_ids], sampling)
        except Exception as error:
            if _engine_died(error):
                _exit_worker(error, "generation")
            raise

    def generate_timed(
        self, prompts_token_ids: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> tuple[list[list[Sample]], float]:
        """``generate`` and the engine's own seconds in it (the caller's wait also holds
        queueing behind earlier calls, such as a refit waiting for the trainer)."""
        started = time.perf_counter()
        samples = self.generate(prompts_token_ids, sampling)
        return samples, time.perf_counter() - started

    def weight_ranks(self) -> int:
        """Members this engine adds to the weight-update group."""
        return self._require_backend().num_weight_ranks

    def join_weight_group(
        self, address: GroupAddress, rank_offset: int, transport: RefitTransport
    ) -> list[int]:
        """Join the weight-update group (all engine processes, ranks from ``rank_offset``)
        for the run's ``transport``, which every later ``receive_weights`` uses."""
        return self._require_backend().join_weight_group(address, rank_offset, transport)

    def attach_shared(self, handles: list[bytes]) -> None:
        """ipc transport: map the exporter buffers (``handles[i]`` for engine process i)."""
        self._require_backend().attach_shared(handles)

    def receive_weights(self, layout_wire: list[Any]) -> dict[str, int]:
        """Receive one refit's buckets into the engine in place, through the transport
        the group was joined for; returns the counters."""
        from dapo_megatron.refit.buckets import BucketLayout

        backend = self._require_backend()
        try:
            stats = backend.receive_weights(BucketLayout.from_wire(layout_wire))
        except Exception as error:
            # Whatever failed (a dead peer, a dead engine process), the engine now holds
            # partly old, partly new weights: it must not generate again.
            _exit_worker(error, "a refit")
        self.refit_counts["collective"] += 1
        self.refit_counts["bytes_received"] += int(sum(s["bytes"] for s in stats))
        return dict(self.refit_counts)

    def update_weights(self, weights: list[Any]) -> dict[str, int]:
        """Object-store fallback: load the policy's full HF-named tensors.

        ``weights`` is either ``[ObjectRef]`` of the list of ``(name, tensor)`` pairs (from
        the controller: wrapped, so that Ray hands over the reference and each engine
        fetches the one stored copy itself) or the list of pairs (in-process use).
        """
        from dapo_megatron.refit.object_store import fetch_weights

        self._require_backend().update_weights(fetch_weights(weights))
        self.refit_counts["object_store"] += 1
        return dict(self.refit_counts)

    def sleep(self) -> dict[str, int]:
        """Put the engine to sleep, then return this process's cached CUDA blocks (what the
        engine's requests left in PyTorch's allocator) before the policy trains on the
        same GPU (device/memory_release.py); returns the reserved bytes before and after.

        Only where the engine's memory lives in this process (``engine_memory_in_process``):
        a vLLM engine core in child processes (the GPU default) holds it all there, and its
        own sleep released it; releasing here would only open a CUDA context in this
        process, on the policy's GPU, while the policy trains."""
        backend = self._require_backend()
        backend.sleep()
        if not engine_memory_in_process(backend):
            return {"reserved_before": 0, "reserved_after": 0, "released": 0}
        return release_cached_memory("engine: asleep, before the policy trains")

    def wake(self) -> None:
        self._require_backend().wake()

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        if self.backend is not None:
            self.backend.shutdown()
            self.backend = None
