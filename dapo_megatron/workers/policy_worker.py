"""PolicyWorker: one Megatron rank of the policy as a Ray actor.

The class is plain Python (the controller wraps it with ``ray.remote``), so it also runs
in-process for debugging. Each worker is one torch.distributed rank; the controller calls
every method on every worker at once (the methods are collective) with the worker's
data-parallel share of the data. With the megatron generation backend the worker also
generates rollouts on its own model (colocated: nothing is copied for the refit).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo_megatron.config.run_plan import RefitTransport, RunPlan
from dapo_megatron.device.memory_release import release_cached_memory
from dapo_megatron.device.phase_memory import PhasePeaks
from dapo_megatron.logging.worker_logs import redirect_worker_output
from dapo_megatron.refit.buckets import BucketLayout, plan_buckets
from dapo_megatron.refit.group import GroupAddress
from dapo_megatron.refit.object_store import put_export
from dapo_megatron.refit.sender import PolicySender
from dapo_megatron.shared.batch import PolicyBatch
from dapo_megatron.shared.sampling import Sample, SamplingParams
from dapo_megatron.workers import ignore_expected_megatron_warnings

if TYPE_CHECKING:
    from dapo_megatron.megatron.inference import MegatronGenerationBackend
    from dapo_megatron.megatron.policy import MegatronPolicy


def free_port() -> int:
    """A TCP port that was free a moment ago on this node."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


class PolicyWorker:
    """One policy rank: Megatron model + optimizer, and (colocated) a generation engine."""

    def __init__(self, plan: RunPlan, *, rank: int, world_size: int, num_threads: int = 1) -> None:
        self.plan = plan
        self.config = plan.config
        self.rank = rank
        self.world_size = world_size
        # Before anything prints: Megatron's and Ray's notes of every rank go to a file
        # under the run directory, the console keeps the controller's lines.
        redirect_worker_output(plan.run_dir, f"policy_rank{rank}")
        # Several ranks share a few cores on CPU: one intra-op thread each avoids
        # oversubscription (a 2-core box with 2 ranks x 2 threads runs ~2x slower).
        torch.set_num_threads(max(1, num_threads))
        ignore_expected_megatron_warnings()
        self.policy: MegatronPolicy | None = None
        self.engine: MegatronGenerationBackend | None = None
        # This rank's end of the collective refit (dapo_megatron/refit/).
        self.refit_sender = PolicySender(rank, plan.device)
        # Per-phase CUDA peaks, reported with each train step (bench/gpu_run.py reads them).
        self.peaks = PhasePeaks(enabled=plan.device == "cuda")

    def address(self) -> tuple[str, int]:
        """(ip, free port) of this worker's node, for the rendezvous of rank 0."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str, master_port: int) -> dict[str, int]:
        """Join torch.distributed, build the model from the HF checkpoint; returns the layout."""
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            # Read where the process groups are created (megatron/distributed.py), as
            # the launcher variables above are.
            DAPO_COLLECTIVE_TIMEOUT_S=str(self.config.run.collective_timeout_s),
        )
        from dapo_megatron.megatron.distributed import parallel_ranks
        from dapo_megatron.megatron.policy import MegatronPolicy

        self.policy = MegatronPolicy(self.plan.policy())
        return {"rank": self.rank, **parallel_ranks()}

    def _engine(self) -> MegatronGenerationBackend:
        if self.engine is None:
            from dapo_megatron.megatron.decode_step import DecodeOptions
            from dapo_megatron.megatron.inference import MegatronGenerationBackend

            policy = self._require_policy()
            self.engine = MegatronGenerationBackend(
                policy.model[0],
                policy.arch,
                policy.dims,
                shares_policy_model=True,
                max_batch_size=self.config.generation.engine.max_num_seqs,
                max_model_len=self.config.policy.max_total_sequence_length,
                decode=DecodeOptions(cuda_graphs=not self.config.generation.engine.enforce_eager),
            )
        return self.engine

    def _require_policy(self) -> MegatronPolicy:
        if self.policy is None:
            raise RuntimeError("PolicyWorker.setup() must run before any other call")
        return self.policy

    def generate(
        self, prompts_token_ids: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        """Rollouts of this DP replica's prompts (TP ranks return identical samples)."""
        with self.peaks.track("generation"):
            return self._engine().generate([list(p) for p in prompts_token_ids], sampling)

    def generate_with(
        self, shard: tuple[Sequence[Sequence[int]], SamplingParams]
    ) -> list[list[Sample]]:
        """``generate`` of a shard that carries its own parameters (per-prompt caps)."""
        prompts_token_ids, sampling = shard
        return self.generate(prompts_token_ids, sampling)

    def logprobs(
        self, batch: PolicyBatch, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self.peaks.track("logprob"):
            return self._require_policy().logprobs(batch, compute_entropy=compute_entropy)

    def ref_logprobs(self, batch: PolicyBatch) -> torch.Tensor:
        """Logprobs [B, S] under the frozen KL reference (MegatronPolicy.ref_logprobs)."""
        return self._require_policy().ref_logprobs(batch)

    def train_step(self, batch: PolicyBatch) -> dict[str, float]:
        started = time.perf_counter()
        with self.peaks.track("train"):
            metrics = self._require_policy().train_step(batch)
        # The rank's own time: the controller's wait also holds queueing and transfers.
        metrics["timing/train_s"] = time.perf_counter() - started
        return {**metrics, **self.peaks.metrics()}

    def sft_step(self, batch: PolicyBatch, lr: float | None = None) -> dict[str, float]:
        return self._require_policy().sft_step(batch, lr=lr)

    def release_memory(self) -> dict[str, int]:
        """Return this rank's cached CUDA blocks (the training peak) to the driver before a
        colocated engine maps its weights or KV cache back on this GPU; the controller
        calls it before every wake (controller/actors/generation_group.py, device/memory_release.py)."""
        return release_cached_memory("policy: before the colocated engines wake")

    def refit(self) -> None:
        """Push the trained weights to the generation engine (shared model: nothing to do)."""
        if self.engine is not None:
            self.engine.update_weights(())

    def export_weights(self) -> list[Any] | None:
        """Full HF-named CPU tensors of the model: rank 0 returns ``[ObjectRef]`` of the
        list of ``(name, tensor)``, the other ranks None (they only join the gathers):
        the object-store transport's sender half (refit/object_store.py)."""
        return put_export(self._require_policy().export_weights(), self.rank)

    # ----------------------------------------------------------------------------------
    # Collective refit (dapo_megatron/refit/): every rank exports (the export's TP/PP
    # gathers need them all); this rank's sender half moves what it has to.

    def bucket_layout(self, bucket_bytes: int, dtype: str) -> list[Any]:
        """The bucket layout of this model's refit, as plain lists (BucketLayout.to_wire)."""
        specs = self._require_policy().hf_weight_specs()
        return plan_buckets(specs, getattr(torch, dtype), bucket_bytes).to_wire()

    def join_weight_group(self, address: GroupAddress, transport: RefitTransport) -> None:
        """Join the weight-update group as the transport needs (``PolicySender.join``)."""
        self.refit_sender.join(address, transport)

    def leave_weight_group(self) -> None:
        sender = getattr(self, "refit_sender", None)
        if sender is not None:
            sender.close()

    def share_buffer(self, layout_wire: list[Any], exporters: int) -> bytes | None:
        """ipc: ranks below ``exporters`` allocate a shareable bucket buffer (CUDA IPC on
        GPU, shared memory on CPU) and return its handle; others None."""
        return self.refit_sender.share(BucketLayout.from_wire(layout_wire), exporters)

    def unlink_shared_buffer(self) -> None:
        """ipc: every paired engine worker has mapped this rank's buffer, so its shm file
        needs no name any more (nothing left behind if this process dies)."""
        self.refit_sender.unlink()

    def send_weights(self, layout_wire: list[Any]) -> dict[str, float]:
        """Export the weights into the transport; this rank's transfer stats (empty for a
        rank that only takes part in the export)."""
        layout = BucketLayout.from_wire(layout_wire)
        stats = self.refit_sender.send(self._require_policy().export_weights(), layout)
        return {} if stats is None else stats.as_report()

    def export_hf(self, out_dir: str) -> str:
        """Write the current weights as an HF checkpoint (collective; rank 0 writes)."""
        from dapo_megatron.megatron.export_hf import export_policy

        return str(export_policy(self._require_policy(), out_dir))

    def device_ids(self) -> str:
        """Comma-separated accelerator ids Ray gave this worker ("" on CPU)."""
        import ray

        return ",".join(str(i) for i in ray.get_gpu_ids())

    def save(self, directory: str, step: int, extra_state: dict[str, Any]) -> str:
        return str(self._require_policy().save(Path(directory), step=step, extra_state=extra_state))

    def load(self, path: str) -> dict[str, Any]:
        return self._require_policy().load(Path(path))

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        self.leave_weight_group()
        if self.policy is not None:
            self.policy.shutdown()
            self.policy = None
