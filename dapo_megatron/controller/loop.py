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
from collections.abc import Callable
from typing import Any

import torch

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.controller.actors import node_loss, preemption
from dapo_megatron.controller.actors.cluster import gcs_address, start_ray
from dapo_megatron.controller.actors.generation_group import Engines, build_engines
from dapo_megatron.controller.actors.policy_group import PolicyGroup
from dapo_megatron.controller.actors.preemption import Preempted
from dapo_megatron.controller.actors.remote import RestartsExhausted, WorkerDied, set_call_timeout
from dapo_megatron.controller.context import RunContext, Workers, build_context
from dapo_megatron.controller.rollouts import steps
from dapo_megatron.controller.rollouts.rollout_groups import rollout_metrics, staleness_metrics
from dapo_megatron.controller.rollouts.rollout_source import (
    Rollouts,
    SyncRollouts,
    overlapped_rollouts,
    synchronous_rollouts,
)
from dapo_megatron.controller.rollouts.rollout_stream import RolloutStream
from dapo_megatron.controller.rollouts.startup_check import check_engine_logprobs
from dapo_megatron.data.fingerprint import DATA_STATE_KEY, data_fingerprint
from dapo_megatron.data.sampler import epochs_exhausted
from dapo_megatron.logging import MetricsLogger, StepProgress, keys, worker_log_dir
from dapo_megatron.logging.progress import format_val
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
    try:
        # Pre-flight compared the data's fingerprint; the prompt count also depends on
        # data.max_prompt_length: a user error, one line, not a traceback.
        ctx.sampler.load_state_dict(
            state["sampler"], allow_resize=ctx.config.checkpointing.allow_data_change
        )
    except ValueError as e:
        raise ConfigError(f"resuming from {path}: {e}") from None
    ctx.dynamic.load_state_dict(state["dynamic"])
    if ctx.skipper.enabled and "skip" in state:
        # A run that turns skipping on at a resume starts with an empty history.
        ctx.skipper.load_state_dict(state["skip"], num_prompts=len(ctx.train.input_ids))
    if "partial" in state:
        ctx.partials.load_state_dict(state["partial"])
    return state


def _save(ctx: RunContext, policy: PolicyGroup, step: int, rollouts: Rollouts) -> None:
    state = {
        "step": step,
        "sampler": ctx.sampler.state_dict(),
        "dynamic": ctx.dynamic.state_dict(),  # carry cache, counters, keep-rate average
        "rollout": rollouts.state(),  # overlapped: prompts drawn but not trained
        "skip": ctx.skipper.state_dict(),  # per-prompt outcome history of the skip rule
        "partial": ctx.partials.state_dict(),  # aborted samples to continue next round
        # What the sampler's indices point into: a resume on changed data is refused.
        DATA_STATE_KEY: data_fingerprint(ctx.config.data),
    }
    policy.save(str(ctx.checkpoint_dir), step, state)
    prune_checkpoints(ctx.checkpoint_dir, ctx.config.checkpointing.keep_last)


def _run_steps(ctx: RunContext, workers: Workers, logger: MetricsLogger) -> dict[str, float]:
    """Train from the last checkpoint (or from scratch) to max_num_steps, or until
    dapo.max_num_epochs passes over the prompts are used up."""
    config = ctx.config
    policy, engines = workers.policy, workers.engines
    state = _resume(ctx, policy)
    start_step: int = state.get("step", 0)
    if start_step == 0 and _epochs_done(ctx):
        raise ConfigError(
            f"dapo.max_num_epochs = {config.dapo.max_num_epochs}: that many passes over the "
            f"{ctx.sampler.num_items} training prompts hold fewer than one step of "
            f"dapo.num_prompts_per_step = {config.dapo.num_prompts_per_step}; nothing to train"
        )
    if start_step == 0 and config.sft_warmup.num_steps > 0:
        _sft_warmup(ctx, policy, logger)
    # Engines started from the HF checkpoint: give them the resumed / warmed-up weights.
    engines.refit(policy)
    if config.generation.backend == "vllm":
        # Their logprobs must now be the policy's (what vLLM decides differently on GPU).
        check_engine_logprobs(ctx, engines, policy)
    if preemption.requested():  # SIGTERM during start-up: the resumed state is saved
        preemption.stop_clock()
        raise Preempted(start_step, None)
    if start_step == 0 and config.validation.val_at_start:
        start_val = steps.validate(ctx, engines, 0)
        logger.log(0, start_val)
        if keys.VAL_ACC in start_val:  # the baseline the step lines' val_acc compares to
            acc = format_val(start_val[keys.VAL_ACC], start_val.get(keys.VAL_ACC_STDERR))
            print(f"[validation] before training: accuracy {acc}", flush=True)
    progress = StepProgress(
        _planned_steps(ctx, start_step), start_step=start_step, enabled=config.logger.progress_bar
    )
    pending = state.get("rollout", {}).get("pending_prompts", ())
    # The policy version of a step is its index: the optimizer updates before it.
    rollouts: Rollouts
    if ctx.plan.overlapped:
        rollouts = overlapped_rollouts(
            ctx, engines, policy, version=start_step, pending_prompts=pending
        )
    else:
        rollouts = synchronous_rollouts(ctx, engines, pending_prompts=pending)
    end = _StepEnd(ctx, workers, rollouts, logger, progress, start_step)
    try:
        if isinstance(rollouts, RolloutStream):
            _overlapped_steps(ctx, workers, rollouts, start_step, end)
        else:
            _synchronous_steps(ctx, workers, rollouts, start_step, end)
    finally:
        rollouts.close()  # overlapped: no new requests once the loop has stopped
        progress.close()  # on every exit path: a crash must not leave the bar drawn
    if config.checkpointing.export_hf:
        _export_final(ctx, policy, end.done)  # max_num_steps, unless the epochs ended first
    return end.last_metrics


def _epochs_done(ctx: RunContext) -> bool:
    """dapo.max_num_epochs's passes hold no further step (data/sampler.py epochs_exhausted;
    always False without the key). Asked of the synchronous loop only (validation refuses
    the key with overlapped rollouts), where no prompt of the next step is drawn yet."""
    d = ctx.config.dapo
    if d.max_num_epochs is None:
        return False
    return epochs_exhausted(ctx.sampler, d.max_num_epochs, d.num_prompts_per_step)


def _planned_steps(ctx: RunContext, start_step: int) -> int:
    """The progress bar's (and ETA's) total: max_num_steps, or fewer when dapo.max_num_epochs
    ends the run first: one step per num_prompts_per_step prompts left in the passes (exact
    without dynamic sampling, an estimate with it: its steps draw more prompts each)."""
    d = ctx.config.dapo
    if d.max_num_epochs is None:
        return d.max_num_steps
    left = ctx.sampler.prompts_left(d.max_num_epochs) // d.num_prompts_per_step
    return min(d.max_num_steps, start_step + left)


def _synchronous_steps(
    ctx: RunContext, workers: Workers, rollouts: SyncRollouts, start_step: int, end: _StepEnd
) -> None:
    """DAPO as the paper runs it (``rollout.max_staleness = 0``): generate the step's
    groups in dynamic-sampling rounds, train on them, give the engines the new weights."""
    policy, engines = workers.policy, workers.engines
    for step in range(start_step, ctx.config.dapo.max_num_steps):
        if _epochs_done(ctx):  # the last pass has no full step left: like drop_last
            break
        started = end.start()
        taken = steps.prepare(ctx, rollouts, step)
        metrics = _batch_metrics(ctx, taken, step)
        metrics.update(steps.passes_before_training(ctx, policy, taken.batch))
        metrics.update(steps.start_train(ctx, policy, taken.batch, step).result())
        done = step + 1
        metrics["timing/refit_s"] = engines.refit(policy)
        validate = _validation(ctx, engines, done)
        if validate is not None:  # on the refitted engines
            metrics.update(validate())
        end.finish(done, started, metrics, taken)


def _overlapped_steps(
    ctx: RunContext, workers: Workers, stream: RolloutStream, start_step: int, end: _StepEnd
) -> None:
    """Rollouts overlapped with training (``rollout.max_staleness = K >= 1``): the engines
    generate while the policy trains. While step s trains, the loop takes the batch of
    s + 1; the refit to s + 1 is queued behind the train step and the train step of s + 1
    behind the refit, so the policy goes from one step to the next without a controller
    round trip. ``stream.schedule`` holds that state (controller/rollouts/overlap.py)."""
    schedule = stream.schedule
    for step in range(start_step, ctx.config.dapo.max_num_steps):
        started = end.start()
        taken = schedule.batch(step)  # taken while the step before trained, or now
        metrics = _batch_metrics(ctx, taken, step)
        metrics.update(schedule.train(taken, step))
        done = step + 1
        # Validation runs on the refitted engines before they take the next request.
        validate = _validation(ctx, workers.engines, done)
        # The transfer may be queued as soon as the engines are done with their weights.
        schedule.arm(done, hold=validate is not None)
        if _prepares_next(ctx.plan, done):
            schedule.take_next(done)
        metrics.update(schedule.train_result())
        metrics.update(schedule.refit(done, then=validate))
        # A batch taken for the next step (or its queued training) is not in a checkpoint.
        end.finish(done, started, metrics, taken, safe=not schedule.holds_next)


class _StepEnd:
    """What every step ends with, in both loops: the refit and rate metrics, the log line,
    the progress bar, and the checkpoint when one is due."""

    def __init__(
        self,
        ctx: RunContext,
        workers: Workers,
        rollouts: Rollouts,
        logger: MetricsLogger,
        progress: StepProgress,
        start_step: int,
    ) -> None:
        self.ctx, self.workers, self.rollouts = ctx, workers, rollouts
        self.logger, self.progress = logger, progress
        self.last_metrics: dict[str, float] = {}
        self.done = start_step
        """The last policy version trained (the resumed one before any step)."""
        self._busy_before = 0.0

    def start(self) -> float:
        """A step starts: its clock, and the engines' busy time so far."""
        self._busy_before = self.rollouts.engine_busy_s()
        return time.perf_counter()

    def finish(
        self,
        done: int,
        started: float,
        metrics: dict[str, float],
        taken: steps.Prepared,
        *,
        safe: bool = True,
    ) -> None:
        """Policy version ``done`` is trained and in the engines: log it, checkpoint it.
        ``safe``: nothing is in flight that a checkpoint would miss, so a SIGTERM stops the
        run here (``Preempted``, after a save)."""
        config = self.ctx.config
        metrics.update(self.workers.engines.refit_metrics())
        metrics["generated_per_trained"] = taken.stats.num_samples_generated / len(taken.batch)
        metrics["timing/step_s"] = time.perf_counter() - started
        busy = self.rollouts.engine_busy_s() - self._busy_before
        metrics.update(_idle_fractions(metrics, busy))
        metrics["tokens_per_s"] = metrics["num_generated_tokens"] / metrics["timing/step_s"]
        self.logger.log(done, metrics)
        self.progress.update(done, metrics)
        self.last_metrics = metrics
        self.done = done
        # The epochs may end the run before max_num_steps: its last step is checkpointed too
        # (verl-recipe dapo_ray_trainer.py fit saves a missing last checkpoint after the loop).
        last = done == config.dapo.max_num_steps or _epochs_done(self.ctx)
        ckpt = config.checkpointing
        stop = safe and preemption.requested()
        saved = ckpt.enabled and (done % ckpt.save_period == 0 or last or stop)
        if saved:
            with self.rollouts.paused():
                _save(self.ctx, self.workers.policy, done, self.rollouts)
        if stop:
            checkpoint = latest_checkpoint(self.ctx.checkpoint_dir) if saved else None
            preemption.stop_clock(done, checkpoint)  # the exit is bounded from here
            raise Preempted(done, checkpoint)


def _batch_metrics(ctx: RunContext, taken: steps.Prepared, step: int) -> dict[str, float]:
    """A step's metrics known once its batch is taken: generation, dynamic sampling, the
    rollouts' rewards and lengths, and how many versions old they are."""
    metrics = {**taken.metrics, **taken.stats.to_metrics()}
    metrics.update(rollout_metrics(taken.groups, ctx.config))
    metrics.update(staleness_metrics(taken.groups, step))
    return metrics


def _validation(
    ctx: RunContext, engines: Engines, done: int
) -> Callable[[], dict[str, float]] | None:
    """Validation of policy version ``done`` when it is due (run on the refitted engines),
    else None."""
    period = ctx.config.validation.val_period
    if period and done % period == 0:
        return functools.partial(steps.validate, ctx, engines, done)
    return None


def _prepares_next(plan: RunPlan, done: int) -> bool:
    """Overlapped rollouts take the next step's batch while this step trains, except
    before a checkpoint (which must not hold a batch taken but not trained) and at the
    end."""
    if not plan.overlapped or done >= plan.config.dapo.max_num_steps:
        return False
    if preemption.requested():  # SIGTERM: this step's end is where the run stops
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


SFT_LINE_EVERY = 10
"""Without a terminal, the SFT warm-up prints one line per this many steps (and its last):
a 300-step warm-up is 30 lines of a log file, not 300."""


def _sft_warmup(ctx: RunContext, policy: PolicyGroup, logger: MetricsLogger) -> None:
    """The SFT warm-up, with its own progress bar (or a line per ``SFT_LINE_EVERY``
    steps) and its steps in sft_metrics.jsonl (its plot)."""
    cfg = ctx.config.sft_warmup
    with StepProgress(
        cfg.num_steps,
        start_step=0,
        enabled=ctx.config.logger.progress_bar,
        headline=(keys.SFT_NLL,),
        name="sft warm-up",
        line_every=SFT_LINE_EVERY,
    ) as progress:

        def log(index: int, metrics: dict[str, float]) -> None:
            logger.log_sft(index + 1, metrics)
            progress.update(index + 1, metrics)

        steps.sft_warmup(ctx, policy, log)


def plot_labels(config: DapoMegatronConfig) -> dict[str, str]:
    """Legend labels the plots cannot know from metrics.jsonl: how validation samples."""
    v = config.validation
    how = "greedy" if v.greedy else f"mean of {v.num_samples_per_prompt} samples per prompt"
    return {keys.VAL_ACC: f"validation accuracy ({how}, held-out prompts)"}


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
    # Every call to the workers times out (the ones in modules without the config too).
    set_call_timeout(config.run.call_timeout_s, config.run.collective_timeout_s)
    try:
        start_ray(config.cluster, device=plan.device)
        # Named once: the workers write their output there (logging/worker_logs.py).
        print(f"[setup] worker logs: {worker_log_dir(run_dir)}/", flush=True)
        preemption.reclaim_sigterm()
        preemption.watch_gcs(gcs_address())
        while True:
            if preemption.requested():  # SIGTERM between attempts: nothing new to save
                preemption.stop_clock()
                raise Preempted(0, None)
            ctx.reset_state()
            resume = (
                config.checkpointing.resume == "auto"
                and latest_checkpoint(ctx.checkpoint_dir) is not None
            )
            logger = MetricsLogger(
                config.logger,
                run_dir=run_dir,
                run_name=config.run.name,
                resume=resume,
                plot_labels=plot_labels(config),
            )
            failed = True  # until _run_steps returns: W&B / MLflow must see a crash as one
            nodes = node_loss.alive_nodes()  # a node lost from here stops or restarts the run
            try:
                workers = start_workers(plan)
                try:
                    metrics = _run_steps(ctx, workers, logger)
                finally:
                    workers.stop()  # on every exit path; a restart starts new workers
                failed = False
                return metrics
            except WorkerDied as failure:
                if preemption.requested():  # a worker lost while stopping: no restart
                    preemption.stop_clock()
                    raise Preempted(0, None) from failure
                # Check that the nodes left hold the layout before asking Ray to place it.
                lost = node_loss.check_restart(plan, nodes, failure)
                restarts += 1
                if restarts > config.run.max_restarts:
                    raise RestartsExhausted(failure, config.run.max_restarts) from failure
                print(
                    f"[restart {restarts}/{config.run.max_restarts}] {failure}{lost}; restarting "
                    f"from the last checkpoint",
                    flush=True,
                )
            finally:
                logger.close(failed=failed)
    finally:
        ctx.close()
