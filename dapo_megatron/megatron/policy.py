"""One Megatron rank of the policy: the API the Ray PolicyWorker wraps (usable under torchrun).

    policy = MegatronPolicy(config)            # parallel init, model from HF, DDP, optimizer
    lp, ent = policy.logprobs(batch)            # forward only, token-aligned [B, S]
    metrics = policy.train_step(mini_batch)     # DAPO loss, one optimizer step
    metrics = policy.sft_step(batch)            # NLL warm-up through the same path
    policy.save(dir, step=..., extra_state=...) / policy.load(path)
    for name, tensor in policy.export_weights(): ...   # full HF tensors, for the refit

Every method is collective: all ranks of the job call it together, each with its
data-parallel shard of the batch (identical on the TP/PP/CP ranks of one DP replica).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dapo_megatron.config.model_arch import ModelArch, resolve_arch
from dapo_megatron.config.parallel import ParallelDims, parallel_dims
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.data.batch import PolicyBatch
from dapo_megatron.megatron import checkpoint as ckpt
from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
from dapo_megatron.megatron.hf_weights import (
    export_hf_weights,
    hf_weight_specs,
    load_hf_checkpoint,
)
from dapo_megatron.megatron.model import build_model
from dapo_megatron.megatron.optimizer import build_optimizer, build_scheduler, wrap_ddp
from dapo_megatron.megatron.policy_step import (
    StepContext,
    compute_logprobs,
    sft_step,
    train_step,
)


def total_optimizer_steps(config: DapoMegatronConfig) -> int:
    """Optimizer steps of the whole run (the lr schedule's horizon)."""
    d = config.dapo
    per_step = d.num_prompts_per_step * d.num_generations_per_prompt
    return d.max_num_steps * max(1, per_step // config.policy.train_global_batch_size)


class MegatronPolicy:
    """The policy model of one rank with its optimizer and schedule."""

    def __init__(
        self,
        config: DapoMegatronConfig,
        *,
        dims: ParallelDims | None = None,
        arch: ModelArch | None = None,
    ) -> None:
        """Initialise torch.distributed + Megatron and load the HF checkpoint.

        Args:
            config: the run config (policy, generation temperature, loss).
            dims: parallel layout; default: derived from the config's cluster.
            arch: model architecture; default: read from the checkpoint's config.json.
        """
        self.config = config
        self.dims = dims or parallel_dims(config)
        policy = config.policy
        if arch is None:
            arch, _ = resolve_arch(policy.model_name_or_path, None)
            if arch is None:
                raise FileNotFoundError(
                    f"policy.model_name_or_path: no config.json in {policy.model_name_or_path}"
                )
        self.arch = arch
        initialize_parallel(self.dims, seed=config.run.seed)
        model = build_model(
            arch, self.dims, policy.precision, recompute=policy.megatron.recompute_granularity
        )
        load_hf_checkpoint(model, policy.model_name_or_path, arch, self.dims)
        # Our losses carry the global normaliser themselves: Megatron must only sum
        # gradients over micro-batches and DP/CP ranks (see policy_step's docstring).
        model.config.calculate_per_token_loss = True
        self._gpt = model  # unwrapped, for the weight export
        distributed_optimizer = policy.megatron.use_distributed_optimizer
        self.model = [
            wrap_ddp(model, model.config, use_distributed_optimizer=distributed_optimizer)
        ]
        self.optimizer = build_optimizer(
            self.model,
            policy.optimizer,
            precision=policy.precision,
            use_distributed_optimizer=distributed_optimizer,
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            policy.optimizer,
            policy.scheduler,
            total_optimizer_steps=total_optimizer_steps(config),
        )
        self.ctx = StepContext(
            dims=self.dims, vocab_size=arch.vocab_size, temperature=config.generation.temperature
        )

    def logprobs(
        self, batch: PolicyBatch, *, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token-aligned logprobs (and entropies) [B, S] of this rank's DP shard."""
        return compute_logprobs(
            self.model,
            batch,
            self.ctx,
            compute_entropy=compute_entropy,
            micro_batch_size=self.config.policy.logprob_micro_batch_size,
        )

    def train_step(self, batch: PolicyBatch) -> dict[str, float]:
        """One optimizer step of the DAPO loss on this rank's share of a mini-batch."""
        return train_step(
            self.model,
            self.optimizer,
            self.scheduler,
            batch,
            self.ctx,
            self.config.dapo.loss,
            micro_batch_size=self.config.policy.train_micro_batch_size,
            max_response_length=self.config.generation.max_response_length,
        )

    def sft_step(self, batch: PolicyBatch, *, lr: float | None = None) -> dict[str, float]:
        """One optimizer step of token-mean NLL on the loss-masked tokens (at `lr` if given,
        outside the DAPO schedule)."""
        return sft_step(
            self.model,
            self.optimizer,
            self.scheduler,
            batch,
            self.ctx,
            micro_batch_size=self.config.policy.train_micro_batch_size,
            lr=lr,
        )

    def save(self, directory: str | Path, *, step: int, extra_state: dict[str, Any]) -> Path:
        """Write a complete checkpoint atomically; returns its directory."""
        return ckpt.save_checkpoint(
            directory,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            extra_state=extra_state,
            step=step,
        )

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore model, optimizer and schedule; returns extra_state. Weights load into any
        TP/PP layout; distributed-optimizer state reshards across DP only."""
        return ckpt.load_checkpoint(
            path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
        )

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors, one at a time (all ranks must iterate together)."""
        return export_hf_weights(self._gpt, self.arch, self.dims)

    def hf_weight_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every tensor of ``export_weights``, in order, without exporting."""
        return hf_weight_specs(self.arch, self.dims)

    def shutdown(self) -> None:
        """Tear down Megatron's groups and torch.distributed."""
        destroy_parallel()
