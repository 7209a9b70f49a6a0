"""One Megatron rank of the policy: the API the Ray PolicyWorker wraps (usable under torchrun).

    policy = MegatronPolicy(plan)              # parallel init, model from HF, DDP, optimizer
    lp, ent = policy.logprobs(batch)            # forward only, token-aligned [B, S]
    ref_lp = policy.ref_logprobs(batch)         # the same under the frozen KL reference
    metrics = policy.train_step(mini_batch)     # DAPO loss, one optimizer step
    metrics = policy.sft_step(batch)            # NLL warm-up through the same path
    policy.save(dir, step=..., extra_state=...) / policy.load(path)
    for name, tensor in policy.export_weights(): ...   # full HF tensors, for the refit

Every method is collective: all ranks of the job call it together, each with its
data-parallel shard of the batch (identical on the TP/PP/CP ranks of one DP replica).

KL reference (``dapo.loss.kl_coef > 0``): a second GPTModel of the same layout, frozen (no
DDP, no gradients, no optimizer state), holding the weights of the policy just before its
first DAPO update, i.e. after the SFT warm-up. Memory: one extra copy of this rank's
weights in the parameter dtype, on the policy's device. It is saved in every checkpoint
(sharded like the model, so it reloads into any TP/PP/DP layout): a resumed run keeps the
reference of its start instead of taking the resumed weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch

from dapo_megatron.config.run_plan import PolicyPlan
from dapo_megatron.megatron import checkpoint as ckpt
from dapo_megatron.megatron.checkpoint_state import capture_rng_state, restore_rng_state
from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
from dapo_megatron.megatron.hf_weights import (
    export_hf_weights,
    hf_weight_specs,
    load_hf_checkpoint,
)
from dapo_megatron.megatron.model import build_model
from dapo_megatron.megatron.optimizer import (
    ScheduleClock,
    build_optimizer,
    build_scheduler,
    wrap_ddp,
)
from dapo_megatron.megatron.policy_step import (
    StepContext,
    compute_logprobs,
    sft_step,
    train_step,
)
from dapo_megatron.shared.batch import PolicyBatch

logger = logging.getLogger(__name__)


class MegatronPolicy:
    """The policy model of one rank with its optimizer and schedule."""

    def __init__(self, plan: PolicyPlan, *, load_weights: bool = True) -> None:
        """Initialise torch.distributed + Megatron and load the HF checkpoint.

        Args:
            plan: this rank's slice of the run plan (config, layout, architecture, loss);
                ``RunPlan.policy()`` in a run, ``run_plan.policy_plan`` elsewhere.
            load_weights: False keeps the random init (the memory tracer, fake_trace/, which
                has shapes but no checkpoint).
        """
        self.config = config = plan.config
        self.dims = plan.dims
        self.arch = arch = plan.arch
        self.loss = plan.loss
        self._moe = plan.moe
        policy = config.policy
        initialize_parallel(self.dims, seed=config.run.seed)
        packed = policy.max_tokens_per_microbatch is not None
        model = build_model(
            arch,
            self.dims,
            policy.precision,
            recompute=policy.megatron.recompute_granularity,
            packed=packed,
            allow_local_spec=policy.allow_local_spec,
            moe=plan.moe,
        )
        if load_weights:
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
            total_optimizer_steps=plan.total_optimizer_steps,
            optimizer_steps_per_train_step=plan.optimizer_steps_per_train_step,
        )
        self._clock = ScheduleClock(policy.scheduler.unit, plan.optimizer_steps_per_train_step)
        self.ctx = StepContext(
            dims=self.dims,
            vocab_size=arch.vocab_size,
            temperature=config.generation.temperature,
            max_tokens_per_microbatch=policy.max_tokens_per_microbatch,
        )
        self._reference: torch.nn.Module | None = None
        """The frozen KL reference model (``snapshot_reference``), None until taken."""

    # ----------------------------------------------------------------------------------
    # KL reference

    def _build_reference(self) -> torch.nn.Module:
        """An empty frozen GPTModel of this rank's layout (collective: PP ties embeddings).

        Building draws random init weights; the RNG states are restored afterwards, so a
        run with the reference draws the same random numbers as one without, and a resume
        that builds it at another moment stays bit-exact.
        """
        rng = capture_rng_state()
        reference = build_model(
            self.arch,
            self.dims,
            self.config.policy.precision,
            packed=self.ctx.max_tokens_per_microbatch is not None,
            allow_local_spec=self.config.policy.allow_local_spec,
            moe=self._moe,
        )
        restore_rng_state(rng)
        reference.config.calculate_per_token_loss = True  # as the policy's (forward only)
        reference.requires_grad_(False)
        reference.eval()
        # GPTModel is Any to mypy (Megatron-Core ships no types); it is an nn.Module.
        return cast(torch.nn.Module, reference)

    def snapshot_reference(self) -> None:
        """Freeze the current weights as the KL reference; nothing when one is held already.

        Called by ``ref_logprobs`` and, with ``kl_coef > 0``, by ``train_step`` before the
        update: the reference is the policy before its first DAPO update (after the SFT
        warm-up), unless ``load`` restored the one of the run's start. Costs one copy of
        this rank's weights (parameter dtype, same device) for the rest of the run.
        """
        if self._reference is not None:
            return
        reference = self._build_reference()
        with torch.no_grad():
            reference.load_state_dict(self._gpt.state_dict(), strict=True)
        self._reference = reference

    def ref_logprobs(self, batch: PolicyBatch) -> torch.Tensor:
        """Token-aligned logprobs [B, S] of this rank's DP shard under the frozen reference
        (taken now if there is none yet, see ``snapshot_reference``)."""
        self.snapshot_reference()
        assert self._reference is not None
        lp, _ = compute_logprobs(
            [self._reference],
            batch,
            self.ctx,
            micro_batch_size=self.config.policy.logprob_micro_batch_size,
        )
        return lp

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
        if self.loss.kl_coef > 0:
            self.snapshot_reference()  # before the first update: the reference's definition
        return train_step(
            self.model,
            self.optimizer,
            self.scheduler,
            batch,
            self.ctx,
            self.loss,
            micro_batch_size=self.config.policy.train_micro_batch_size,
            advance_schedule=self._clock.tick(),
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
        """Write a complete checkpoint atomically (with the KL reference, if taken);
        returns its directory."""
        return ckpt.save_checkpoint(
            directory,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            extra_state=extra_state,
            step=step,
            reference=self._reference,
        )

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore model, optimizer and schedule; returns extra_state. Weights load into any
        TP/PP layout; distributed-optimizer state reshards across DP only.

        With ``kl_coef > 0`` the checkpoint's KL reference is restored too (the weights of
        the run's start, not the resumed ones); a checkpoint without one (saved with
        ``kl_coef: 0``) leaves the reference to be taken from the resumed weights.
        """
        marker = ckpt.read_marker(Path(path)) or {}
        reference = None
        if self.loss.kl_coef > 0:
            if marker.get("reference"):
                reference = self._reference or self._build_reference()
            else:
                logger.warning(
                    "checkpoint %s has no KL reference: the resumed weights become it", path
                )
        state = ckpt.load_checkpoint(
            path,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            reference=reference,
        )
        self._reference = reference
        return state

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors, one at a time (all ranks must iterate together)."""
        return export_hf_weights(self._gpt, self.arch, self.dims)

    def hf_weight_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every tensor of ``export_weights``, in order, without exporting."""
        return hf_weight_specs(self.arch, self.dims)

    def shutdown(self) -> None:
        """Tear down Megatron's groups and torch.distributed."""
        destroy_parallel()
