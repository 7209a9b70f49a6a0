"""dapo-plan's "step time (estimate)" section: the step-time model's inputs from a run plan,
and its printout (step_time.py has the model and its basis)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dapo_megatron.config.run_plan import RunPlan
from dapo_megatron.planning.memory_terms import PRECISION_BYTES
from dapo_megatron.planning.roofline import compute_card
from dapo_megatron.planning.step_time import (
    DEFAULT_ASSUMPTIONS,
    MEASURED_GEMM_SHARE,
    Assumptions,
    StepInputs,
    StepTime,
    TracedRank,
    estimate,
)
from dapo_megatron.planning.summary import step_plan


def mean_sequence_length(run: RunPlan, assumptions: Assumptions) -> float:
    """Mean prompt + response tokens of a sample under `assumptions`, at most
    policy.max_total_sequence_length."""
    cfg = run.config
    tokens = (
        assumptions.prompt_fill * cfg.data.max_prompt_length
        + assumptions.response_fill * cfg.generation.max_response_length
    )
    return min(tokens, float(cfg.policy.max_total_sequence_length))


def logprob_passes(run: RunPlan) -> int:
    """Forward-only passes over a step's samples: the old logprobs' when a batch is several
    optimizer steps or policy.old_logprob_pass is always (controller/rollouts/steps.py
    needs_old_logprob_pass), the KL reference's when dapo.loss.kl_coef > 0."""
    cfg = run.config
    plan = step_plan(run)
    old = (
        cfg.policy.old_logprob_pass == "always"
        or plan.samples_per_step > cfg.policy.train_global_batch_size
    )
    return int(old) + int(cfg.dapo.loss.kl_coef > 0)


def step_inputs(run: RunPlan, assumptions: Assumptions = DEFAULT_ASSUMPTIONS) -> StepInputs:
    """The step-time model's inputs of a run plan with a known architecture."""
    cfg, p = run.config, run.config.policy
    plan = step_plan(run)
    return StepInputs(
        arch=run.require_arch(),
        dims=run.dims,
        precision_bytes=PRECISION_BYTES[p.precision],
        recompute=p.megatron.recompute_granularity,
        distributed_optimizer=p.megatron.use_distributed_optimizer,
        gpus_per_node=cfg.cluster.gpus_per_node,
        num_nodes=cfg.cluster.num_nodes,
        mean_seq_len=mean_sequence_length(run, assumptions),
        train_rows=p.train_global_batch_size,
        optimizer_steps=plan.optimizer_steps_per_step,
        step_rows=plan.samples_per_step,
        packed_tokens=p.max_tokens_per_microbatch,
        micro_batch_size=p.train_micro_batch_size,
        logprob_micro_batch_size=p.logprob_micro_batch_size,
        logprob_passes=logprob_passes(run),
        engine_tp=cfg.generation.engine.tensor_parallel_size,
        colocated=cfg.cluster.colocated,
        adam=p.optimizer.name == "adam",
    )


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s >= 1 else f"{s * 1000:.0f} ms"


def format_estimate(est: StepTime, inputs: StepInputs, assumptions: Assumptions) -> str:
    """The printed section of one estimate."""
    card, comm = est.card, est.comm_s
    comm_total = sum(comm.values())
    kinds = ", ".join(f"{k.upper()} {_seconds(v)}" for k, v in comm.items() if v > 0) or "none"
    runs = (
        f"runs {est.logprob_passes}x per step"
        if est.logprob_passes
        else "not run by this recipe: one optimizer step per batch"
    )
    basis = "ops traced from the real step" if est.basis == "traced" else "analytic op counts"
    lines = [
        f"step time (estimate, {card.name}: {card.peak_flops / 1e12:.0f} TFLOP/s bf16, "
        f"{card.hbm_bytes_per_s / 1e12:.2f} TB/s; no generation)",
        f"  train step     {_seconds(est.train_step_s)} per optimizer step ({est.micro_batches} "
        f"micro-batch(es) of ~{est.micro_batch_tokens:,.0f} tokens per DP rank; compute "
        f"{_seconds(est.compute_s)}, bubble {est.bubble:.1%}, optimizer "
        f"{_seconds(est.optimizer_s)}, comm {_seconds(comm_total)}: {kinds}); "
        f"x{inputs.optimizer_steps} = {_seconds(est.train_s)} per DAPO step",
        f"  logprob pass   {_seconds(est.logprob_s)} over the step's {inputs.step_rows} samples "
        f"({runs})",
        f"  refit          {_seconds(est.refit_s)} (whole model in bf16 to each engine GPU)",
        f"  throughput     {est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU in training, MFU "
        f"{est.mfu:.0%}",
        f"  basis: {basis}, each op at max(FLOPs/peak, bytes/HBM) (kernels at datasheet peak: "
        f"optimistic); comm on {card.intra_node.name} "
        f"{card.intra_node.bus_bytes_per_s / 1e9:.0f} GB/s and {card.inter_node.name} "
        f"{card.inter_node.bus_bytes_per_s / 1e9:.0f} GB/s bus bandwidth, "
        + (
            "not overlapped with compute"
            if assumptions.overlap == 0
            else f"{assumptions.overlap:.0%} overlapped with compute"
        )
        + f"; mean sequence {inputs.mean_seq_len:,.0f} tokens (prompts at "
        f"{assumptions.prompt_fill:.0%} of their cap, responses at "
        f"{assumptions.response_fill:.0%})",
    ]
    return "\n".join(lines)


def format_step_time(
    run: RunPlan,
    gpu_mem: str,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    traced: Sequence[TracedRank] = (),
) -> str:
    """dapo-plan's step-time section for the card `gpu_mem` names (--gpu-mem); one line
    for a CPU recipe or an unknown architecture."""
    if run.config.cluster.device == "cpu":
        return "step time: not estimated (the estimate is for GPU recipes)"
    if run.arch is None:
        return f"step time: not estimated, architecture unknown ({run.arch_source})"
    card, exact = compute_card(gpu_mem)
    inputs = step_inputs(run, assumptions)
    text = format_estimate(estimate(inputs, card, assumptions, traced), inputs, assumptions)
    if assumptions.peak_share == 1.0:
        slower = replace(assumptions, peak_share=MEASURED_GEMM_SHARE)
        est = estimate(inputs, card, slower, traced)
        text += (
            f"\n  at {MEASURED_GEMM_SHARE:.0%} of peak (cuBLAS's measured GEMM rate on the lent "
            f"H200): train step {_seconds(est.train_step_s)}, logprob pass "
            f"{_seconds(est.logprob_s)}, {est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU "
            f"{est.mfu:.0%}"
        )
    if not exact:
        text += (
            f"\n  (--gpu-mem {gpu_mem} names no card with compute figures: priced as {card.name})"
        )
    return text
