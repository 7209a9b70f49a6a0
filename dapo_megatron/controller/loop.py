"""The DAPO training loop, one readable function (docs/ARCHITECTURE.md walks through a step).

Algorithm choices, all from the config: rollouts are sampled n per prompt; the raw
verifier score is scaled and the soft overlong penalty added (Lmax = the engine's response
cap); dynamic sampling keeps prompt groups whose RAW score varies, over at most
max_gen_batches generation rounds, carrying surplus groups to the next step; truncated
responses may be filtered from the loss; advantages are group-normalised; the policy trains
on shuffled mini-batches with the clip-higher, token-level loss against old logprobs taken
before the step (by the training forward itself when the batch is a single optimizer step:
steps.needs_old_logprob_pass); then the generation engines receive the new weights.
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import torch

from dapo_megatron.algorithms.dynamic_sampling import DynamicSamplingStats
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.controller import steps
from dapo_megatron.controller.cluster import start_ray
from dapo_megatron.controller.context import RunContext, Workers, build_context
from dapo_megatron.controller.generation_group import build_engines
from dapo_megatron.controller.policy_group import PolicyGroup
from dapo_megatron.controller.remote import RestartsExhausted, WorkerDied
from dapo_megatron.controller.rollout import RolloutGroup, rollout_metrics, staleness_metrics
from dapo_megatron.controller.rollouts import Rollouts, make_rollouts
from dapo_megatron.controller.startup_check import check_engine_logprobs
from dapo_megatron.logging import MetricsLogger, StepProgress
from dapo_megatron.shared.batch import PolicyBatch
from dapo_megatron.storage.checkpoint_dirs import (
    find_resumable,
    latest_checkpoint,
    prune_checkpoints,
)


def _resume(ctx: RunContext, policy: PolicyGroup) -> dict[str, Any]:
    """Restore the newest complete checkpoint; returns the controller state (empty if none)."""
    if ctx.config.checkpointing.resume == "never":
        return {}
    # The newest checkpoint whose files match its marker; one line per newer one skipped.
    path, notes = find_resumable(ctx.checkpoint_dir)
    for line in notes:
        print(line, flush=True)
    if path is None:
        return {}
    print(f"[resume] {path}", flush=True)
    state = policy.load(str(path))
    ctx.sampler.load_state_dict(state["sampler"])
    ctx.dynamic.load_state_dict(state["dynamic"])
    return state


def _save(ctx: RunContext, policy: PolicyGroup, step: int, rollouts: Rollouts) -> None:
    state = {
        "step": step,
        "sampler": ctx.sampler.state_dict(),
        "dynamic": ctx.dynamic.state_dict(),  # carry cache, counters, keep-rate average
        "rollout": rollouts.state(),  # overlapped: prompts drawn but not trained
    }
    policy.save(str(ctx.checkpoint_dir), step, state)
    prune_checkpoints(ctx.checkpoint_dir, ctx.config.checkpointing.keep_last)


def _run_steps(ctx: RunContext, workers: Workers, logger: MetricsLogger) -> dict[str, float]:
    """Train from the last checkpoint (or from scratch) to max_num_steps."""
    config = ctx.config
    d = config.dapo
    policy, engines = workers.policy, workers.engines
    state = _resume(ctx, policy)
    start_step: int = state.get("step", 0)
    if start_step == 0 and config.sft_warmup.num_steps > 0:
        steps.sft_warmup(
            ctx,
            policy,
            lambda i, m: print(
                f"[sft] step {i + 1}/{config.sft_warmup.num_steps} nll={m['sft/nll']:.4f}",
                flush=True,
            ),
        )
    # Engines started from the HF checkpoint: give them the resumed / warmed-up weights.
    engines.refit(policy)
    if config.generation.backend == "vllm":
        # Their logprobs must now be the policy's (what vLLM decides differently on GPU).
        check_engine_logprobs(ctx, engines, policy)
    metrics: dict[str, float] = {}
    if start_step == 0 and config.validation.val_at_start:
        logger.log(0, steps.validate(ctx, engines, 0))
    progress = StepProgress(
        d.max_num_steps, start_step=start_step, enabled=config.logger.progress_bar
    )
    # The policy version of a step is its index: the optimizer updates before it.
    rollouts = make_rollouts(
        ctx,
        engines,
        version=start_step,
        pending_prompts=state.get("rollout", {}).get("pending_prompts", ()),
    )
    prepared: _Prepared | None = None  # overlapped: the next batch, taken while training
    queued: steps.PendingTrain | None = None  # overlapped: its train step, behind the refit
    try:
        for step in range(start_step, d.max_num_steps):
            started = time.perf_counter()
            busy_before = rollouts.engine_busy_s()
            groups, ds_stats, gen_metrics, batch = prepared or _prepare(ctx, rollouts, step)
            metrics = {**gen_metrics, **ds_stats.to_metrics(), **rollout_metrics(groups, config)}
            metrics.update(staleness_metrics(groups, step))
            if queued is None:
                metrics.update(_passes_before_training(ctx, policy, batch))
                queued = steps.start_train(ctx, policy, batch, step)
            else:
                metrics["timing/logprob_s"] = 0.0  # queued only when no pass is needed
            training, queued = queued, None
            done = step + 1
            # Validation runs on the refitted engines before they take the next request.
            validate = None
            if config.validation.val_period and done % config.validation.val_period == 0:
                validate = functools.partial(steps.validate, ctx, engines, done)
            # Overlapped: the transfer of the new weights may be queued behind the train
            # step as soon as the engines are done with their current ones.
            rollouts.arm_refit(policy, done, hold=validate is not None)
            refit = None
            prepared = None
            if _prepares_next(ctx.plan, done):
                # Overlapped: while this step trains, take the next batch, queue the refit
                # behind the train step and the next train step behind the refit, so the
                # policy goes from one to the next without a controller round trip.
                prepared = _prepare(ctx, rollouts, done)
                refit = rollouts.start_refit(policy, done, hold=validate is not None, early=True)
                if refit is not None:
                    queued = _queue_training(ctx, policy, prepared, done)
            metrics.update(training.result())
            if refit is None:
                refit = rollouts.start_refit(policy, done, hold=validate is not None)
                if prepared is not None:
                    queued = _queue_training(ctx, policy, prepared, done)
            metrics.update(rollouts.finish_refit(refit, then=validate))
            metrics.update(engines.refit_metrics())
            metrics["generated_per_trained"] = ds_stats.num_samples_generated / len(batch)
            metrics["timing/step_s"] = time.perf_counter() - started
            metrics.update(_idle_fractions(metrics, rollouts.engine_busy_s() - busy_before))
            metrics["tokens_per_s"] = metrics["num_generated_tokens"] / metrics["timing/step_s"]
            logger.log(done, metrics)
            progress.update(done, metrics)
            last = done == d.max_num_steps
            if config.checkpointing.enabled and (
                done % config.checkpointing.save_period == 0 or last
            ):
                with rollouts.paused():
                    _save(ctx, policy, done, rollouts)
    finally:
        rollouts.close()  # overlapped: no new requests once the loop has stopped
        progress.close()  # on every exit path: a crash must not leave the bar drawn
    if config.checkpointing.export_hf:
        _export_final(ctx, policy, d.max_num_steps)
    return metrics


class _Prepared(NamedTuple):
    """A step's rollouts and batch, with the generation metrics."""

    groups: list[RolloutGroup]
    stats: DynamicSamplingStats
    metrics: dict[str, float]
    batch: PolicyBatch


def _passes_before_training(
    ctx: RunContext, policy: PolicyGroup, batch: PolicyBatch
) -> dict[str, float]:
    """The forward passes a batch needs before its train step: old logprobs (only when
    it is more than one optimizer step) and the KL reference's logprobs."""
    config = ctx.config
    metrics: dict[str, float] = {}
    if _needs_old_logprobs(config, batch):
        metrics.update(steps.old_logprobs(policy, batch))
    else:
        metrics["timing/logprob_s"] = 0.0  # the train step reports the mismatch metrics
    if config.dapo.loss.kl_coef > 0:  # KL penalty vs the start-of-training policy
        metrics.update(steps.reference_logprobs(policy, batch))
    return metrics


def _queue_training(
    ctx: RunContext, policy: PolicyGroup, prepared: _Prepared, step: int
) -> steps.PendingTrain | None:
    """Submit the next step's training now (it runs after the refit just submitted) when
    its batch needs no pass first; else None (the loop runs the passes, then trains)."""
    if ctx.config.dapo.loss.kl_coef > 0 or _needs_old_logprobs(ctx.config, prepared.batch):
        return None
    return steps.start_train(ctx, policy, prepared.batch, step)


def _needs_old_logprobs(config: DapoMegatronConfig, batch: PolicyBatch) -> bool:
    return steps.needs_old_logprob_pass(
        len(batch), config.policy.train_global_batch_size, config.policy.old_logprob_pass
    )


def _prepare(ctx: RunContext, rollouts: Rollouts, step: int) -> _Prepared:
    """Take the step's rollouts (waiting for them: ``timing/rollout_wait_s``) and build its
    batch."""
    started = time.perf_counter()
    groups, stats, metrics = rollouts.take(step)
    metrics["timing/rollout_wait_s"] = time.perf_counter() - started
    metrics["dynamic_sampling/batch_multiplier"] = ctx.dynamic.batch_multiplier
    return _Prepared(groups, stats, metrics, steps.make_batch(ctx, groups))


def _prepares_next(plan: RunPlan, done: int) -> bool:
    """Overlapped rollouts take the next step's batch while this step trains, except
    before a checkpoint (which must not hold a batch taken but not trained) and at the
    end."""
    if not plan.overlapped or done >= plan.config.dapo.max_num_steps:
        return False
    ckpt = plan.config.checkpointing
    return not (ckpt.enabled and done % ckpt.save_period == 0)


def _idle_fractions(metrics: dict[str, float], engine_busy_s: float) -> dict[str, float]:
    """Shares of the step the policy ranks did not compute (their own time in the train
    step and the passes before it: waiting for a batch, in the refit, between calls count
    as idle) and the engines did not generate training rollouts (their own time)."""
    step_s = metrics["timing/step_s"]
    busy = (
        metrics["timing/train_s"]
        + metrics.get("timing/logprob_s", 0.0)
        + metrics.get("timing/ref_logprob_s", 0.0)
    )
    return {
        "timing/trainer_idle_frac": min(1.0, max(0.0, 1.0 - busy / step_s)),
        "timing/engine_idle_frac": max(0.0, 1.0 - engine_busy_s / step_s),
    }


def _export_final(ctx: RunContext, policy: PolicyGroup, step: int) -> None:
    """The final policy as an HF checkpoint in RUN_DIR/hf/step_N (written atomically by the
    exporter, so an existing directory is a complete earlier export: kept)."""
    out = ctx.run_dir / "hf" / f"step_{step:06d}"
    if out.exists():
        print(f"[export] {out} already exists; kept", flush=True)
        return
    started = time.perf_counter()
    policy.export_hf(str(out))
    print(
        f"[export] Hugging Face checkpoint of step {step}: {out} "
        f"({time.perf_counter() - started:.1f} s)",
        flush=True,
    )


def start_workers(plan: RunPlan) -> Workers:
    """The policy ranks, then the rollout engines placed for them (one training attempt's
    workers); the policy is stopped again when its engines fail to start."""
    policy = PolicyGroup(plan)
    try:
        engines = build_engines(plan, policy)
    except BaseException:
        policy.shutdown()
        raise
    return Workers(policy=policy, engines=engines)


def train(plan: RunPlan) -> dict[str, float]:
    """Run (or resume) a DAPO job in ``plan.run_dir``; restarts from the last checkpoint
    when a worker dies."""
    config, run_dir = plan.config, plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    # The controller's tensor work (batches of a few MB) gains nothing from intra-op
    # threads, and their spinning OpenMP barriers steal the cores the policy ranks and
    # engines compute on (on CPU runs the same cores), slowing the controller too.
    torch.set_num_threads(1)
    ctx = build_context(plan)
    restarts = 0
    try:
        start_ray(config.cluster, device=plan.device)
        while True:
            ctx.reset_state()
            resume = (
                config.checkpointing.resume == "auto"
                and latest_checkpoint(ctx.checkpoint_dir) is not None
            )
            logger = MetricsLogger(
                config.logger, run_dir=run_dir, run_name=config.run.name, resume=resume
            )
            failed = True  # until _run_steps returns: W&B / MLflow must see a crash as one
            try:
                workers = start_workers(plan)
                try:
                    metrics = _run_steps(ctx, workers, logger)
                finally:
                    workers.stop()  # on every exit path; a restart starts new workers
                failed = False
                return metrics
            except WorkerDied as failure:
                restarts += 1
                if restarts > config.run.max_restarts:
                    raise RestartsExhausted(failure, config.run.max_restarts) from failure
                print(
                    f"[restart {restarts}/{config.run.max_restarts}] {failure}; restarting "
                    f"from the last checkpoint",
                    flush=True,
                )
            finally:
                logger.close(failed=failed)
    finally:
        ctx.close()
