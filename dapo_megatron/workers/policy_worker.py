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

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.memory_release import release_cached_memory
from dapo_megatron.shared.batch import PolicyBatch
from dapo_megatron.shared.sampling import Sample, SamplingParams
from dapo_megatron.workers import ignore_expected_megatron_warnings

if TYPE_CHECKING:
    from dapo_megatron.megatron.policy import MegatronPolicy


def free_port() -> int:
    """A TCP port that was free a moment ago on this node."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class PolicyWorker:
    """One policy rank: Megatron model + optimizer, and (colocated) a generation engine."""

    def __init__(self, plan: RunPlan, *, rank: int, world_size: int, num_threads: int = 1) -> None:
        self.plan = plan
        self.config = plan.config
        self.rank = rank
        self.world_size = world_size
        # Several ranks share a few cores on CPU: one intra-op thread each avoids
        # oversubscription (a 2-core box with 2 ranks x 2 threads runs ~2x slower).
        torch.set_num_threads(max(1, num_threads))
        ignore_expected_megatron_warnings()
        self.policy: MegatronPolicy | None = None
        self.engine = None
        self._weight_group: Any = None
        self._shared: Any = None

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
        )
        from megatron.core import parallel_state

        from dapo_megatron.megatron.policy import MegatronPolicy

        self.policy = MegatronPolicy(self.plan.policy())
        return {
            "rank": self.rank,
            "dp_rank": parallel_state.get_data_parallel_rank(),
            "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
            "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
            "cp_rank": parallel_state.get_context_parallel_rank(),
        }

    def _engine(self):
        if self.engine is None:
            from dapo_megatron.megatron.inference import MegatronGenerationBackend

            policy = self._require_policy()
            self.engine = MegatronGenerationBackend(
                policy.model[0],
                policy.arch,
                policy.dims,
                shares_policy_model=True,
                max_batch_size=self.config.generation.engine.max_num_seqs,
                max_model_len=self.config.policy.max_total_sequence_length,
            )
        return self.engine

    def _require_policy(self):
        if self.policy is None:
            raise RuntimeError("PolicyWorker.setup() must run before any other call")
        return self.policy

    def generate(
        self, prompts_token_ids: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[list[Sample]]:
        """Rollouts of this DP replica's prompts (TP ranks return identical samples)."""
        return self._engine().generate([list(p) for p in prompts_token_ids], sampling)

    def logprobs(
        self, batch: PolicyBatch, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._require_policy().logprobs(batch, compute_entropy=compute_entropy)

    def ref_logprobs(self, batch: PolicyBatch) -> torch.Tensor:
        """Logprobs [B, S] under the frozen KL reference (MegatronPolicy.ref_logprobs)."""
        return self._require_policy().ref_logprobs(batch)

    def train_step(self, batch: PolicyBatch) -> dict[str, float]:
        started = time.perf_counter()
        metrics = self._require_policy().train_step(batch)
        # The rank's own time: the controller's wait also holds queueing and transfers.
        metrics["timing/train_s"] = time.perf_counter() - started
        return metrics

    def sft_step(self, batch: PolicyBatch, lr: float | None = None) -> dict[str, float]:
        return self._require_policy().sft_step(batch, lr=lr)

    def release_memory(self) -> dict[str, int]:
        """Return this rank's cached CUDA blocks (the training peak) to the driver before a
        colocated engine maps its weights or KV cache back on this GPU; the controller
        calls it before every wake (controller/generation_group.py, memory_release.py)."""
        return release_cached_memory("policy: before the colocated engines wake")

    def refit(self) -> None:
        """Push the trained weights to the generation engine (shared model: nothing to do)."""
        if self.engine is not None:
            self.engine.update_weights(())

    def export_weights(self) -> list[Any] | None:
        """Full HF-named CPU tensors of the model: rank 0 returns ``[ObjectRef]`` of the
        list of ``(name, tensor)``, the other ranks None (they only join the gathers)."""
        import ray

        exported = self._require_policy().export_weights()
        if self.rank != 0:
            for _ in exported:  # the collectives of the export need every rank
                pass
            return None
        weights = [(name, t.cpu()) for name, t in exported]
        # Wrapped in a list: Ray would otherwise resolve the reference on return.
        return [ray.put(weights)]

    # ----------------------------------------------------------------------------------
    # Collective refit (dapo_megatron.weight_sync): rank 0 exports into the weight group; the
    # other ranks only take part in the export's TP/PP gathers.

    def refit_plan(self, bucket_bytes: int, dtype: str) -> list:
        """The bucket plan of this model's refit, as plain lists (RefitPlan.to_wire)."""
        from dapo_megatron.weight_sync.buckets import plan_buckets

        specs = self._require_policy().hf_weight_specs()
        return plan_buckets(specs, getattr(torch, dtype), bucket_bytes).to_wire()

    def join_weight_group(self, address: Any, every_rank: bool = False) -> None:
        """Join the weight-update group with this rank's number: rank 0 only (broadcast:
        it hosts the store and sends), or every rank (handle transport: all ranks take part
        in the per-bucket barriers)."""
        self.leave_weight_group()
        if self.rank == 0 or every_rank:
            from dapo_megatron.weight_sync.group import WeightGroup

            self._weight_group = WeightGroup(address, self.rank)

    def leave_weight_group(self) -> None:
        group, self._weight_group = getattr(self, "_weight_group", None), None
        if group is not None:
            group.close()
        shared, self._shared = getattr(self, "_shared", None), None
        if shared is not None:
            shared.close()

    def share_buffer(self, plan_wire: list, exporters: int) -> bytes | None:
        """Handle transport: ranks below ``exporters`` allocate a shareable bucket buffer
        (CUDA IPC on GPU, shared memory on CPU) and return its handle; others None."""
        from dapo_megatron.weight_sync.buckets import RefitPlan
        from dapo_megatron.weight_sync.handles import SharedBuffer

        if self.rank >= exporters:
            return None
        device = "cuda" if torch.cuda.is_available() else "cpu"
        old = getattr(self, "_shared", None)
        if old is not None:  # engines restarted: they map a new buffer
            old.close()
        self._shared = SharedBuffer.create(RefitPlan.from_wire(plan_wire).max_bucket_bytes, device)
        return self._shared.handle

    def unlink_shared_buffer(self) -> None:
        """Handle transport: every paired engine worker has mapped this rank's buffer, so
        its shm file needs no name any more (nothing left behind if this process dies)."""
        shared = getattr(self, "_shared", None)
        if shared is not None:
            shared.unlink()

    def send_weights_shared(self, plan_wire: list) -> dict[str, float]:
        """Handle transport: every rank exports; ranks with a buffer pack each bucket into it."""
        from dapo_megatron.weight_sync.buckets import RefitPlan
        from dapo_megatron.weight_sync.handles import send_shared

        if self._weight_group is None:
            raise RuntimeError("send_weights_shared before join_weight_group")
        stats = send_shared(
            self._require_policy().export_weights(),
            RefitPlan.from_wire(plan_wire),
            self._weight_group,
            self._shared,
        )
        return {
            "bytes": float(stats.bytes),
            "buckets": float(stats.buckets),
            "seconds": stats.seconds,
            "buffer_bytes": float(stats.buffer_bytes),
        }

    def send_weights(self, plan_wire: list) -> dict[str, float]:
        """Export the weights; rank 0 broadcasts them bucket by bucket. Returns its stats."""
        from dapo_megatron.weight_sync.buckets import RefitPlan
        from dapo_megatron.weight_sync.stream import send_buckets

        exported = self._require_policy().export_weights()
        if self.rank != 0:
            for _ in exported:  # the export's collectives need every rank
                pass
            return {}
        if self._weight_group is None:
            raise RuntimeError("send_weights before join_weight_group")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        stats = send_buckets(
            exported, RefitPlan.from_wire(plan_wire), self._weight_group, device=device
        )
        return {
            "bytes": float(stats.bytes),
            "buckets": float(stats.buckets),
            "seconds": stats.seconds,
            "buffer_bytes": float(stats.buffer_bytes),
        }

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
