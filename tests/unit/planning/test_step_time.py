"""The step-time estimate (planning/roofline.py, step_time.py, step_time_summary.py):
roofline, communication and MFU by hand, the traced path against the analytic one, and
dapo-plan's printout."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dapo_megatron import cli
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.model_arch import ModelArch
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.planning.memory_terms import rank_params
from dapo_megatron.planning.roofline import COMPUTE_CARDS, OpCosts, compute_card, roofline_s
from dapo_megatron.planning.step_time import (
    Assumptions,
    MicroBatch,
    StepInputs,
    TracedRank,
    dp_comm_s,
    estimate,
    micro_batch_comm,
    model_flops_per_token,
    optimizer_ops,
    stage_ops,
)
from dapo_megatron.planning.step_time_summary import format_step_time, step_inputs

REPO = Path(__file__).resolve().parents[3]
H100 = COMPUTE_CARDS["H100 SXM"]
NVLINK, IB = 360e9, 40e9  # the bus bandwidths roofline.py assumes for H100 nodes


def test_gemm_roofline_by_hand() -> None:
    # [4096, 4096] x [4096, 4096] bf16: 2 x 4096^3 = 137438953472 FLOPs, 3 x 4096^2 x 2 =
    # 100663296 bytes: 138.97 us of compute against 30.05 us of HBM on an H100.
    flops, nbytes = 2 * 4096**3, 3 * 4096**2 * 2
    assert roofline_s(flops, nbytes, H100) == pytest.approx(137438953472 / 989e12)
    # A skinny one, [16, 4096] x [4096, 4096]: 536870912 FLOPs (0.54 us) but the weight's
    # 33554432 bytes + 2 x 131072 take 10.09 us: memory-bound.
    skinny = 2 * 16 * 4096 * 4096, (16 * 4096 * 2 + 4096 * 4096) * 2
    assert roofline_s(*skinny, H100) == pytest.approx(33816576 / 3.35e12)
    # H200: same compute, 4.8 TB/s.
    h200, exact = compute_card("h200")
    assert exact and roofline_s(*skinny, h200) == pytest.approx(33816576 / 4.8e12)


def test_op_costs_price_each_op_not_the_totals() -> None:
    ops = OpCosts()
    ops.add("gemm", 2 * 4096**3, 3 * 4096**2 * 2)
    ops.add("add", 0, 3 * 2**30, count=2)
    # Each op at its own bound: 138.97 us + 2 x 3 GiB / 3.35 TB/s (961.6 us each).
    expected = 137438953472 / 989e12 + 2 * 3 * 2**30 / 3.35e12
    assert ops.roofline_s(H100) == pytest.approx(expected)
    # Priced on the totals the GEMM's FLOPs would hide under the adds' bytes: less.
    assert roofline_s(ops.flops, ops.bytes, H100) < expected
    assert ops.ops == 3 and ops.by_op()["add"] == (2, 0, 6 * 2**30)
    twice = OpCosts()
    twice.extend(ops, 2)
    assert twice.roofline_s(H100) == pytest.approx(2 * expected)


def test_cards_by_gpu_mem_name() -> None:
    assert compute_card("h100-80gb") == (H100, True)
    assert compute_card("a100-80gb")[0].peak_flops == 312e12
    assert compute_card("a100-80gb")[0].hbm_bytes_per_s == 2.0e12
    assert compute_card("72") == (H100, False)  # GiB only: priced as an H100
    assert compute_card("l4")[0].peak_flops == 121e12  # 242 with 2:4 sparsity
    assert compute_card("rtx4090") == (H100, False)  # no compute figures here


ARCH = ModelArch(
    "llama",
    num_layers=4,
    hidden_size=1024,
    ffn_hidden_size=2048,
    num_attention_heads=8,
    num_query_groups=2,
    vocab_size=1024,
    max_position_embeddings=8192,
    rope_theta=10000.0,
    norm_epsilon=1e-6,
    tie_word_embeddings=False,
    add_qkv_bias=False,
)
"""h 1024, q 1024 (8 heads of 128), kv 256, f 2048, V 1024."""

# TP2 CP2 on 4-GPU nodes: TP and CP groups (4 consecutive ranks) on NVLink; DP (8 ranks
# per stage) and PP (16) cross nodes: InfiniBand.
DIMS = ParallelDims(tp=2, pp=2, cp=2, dp=2, sequence_parallel=True)
INPUTS = StepInputs(
    arch=ARCH,
    dims=DIMS,
    precision_bytes=2,
    recompute="none",
    distributed_optimizer=True,
    gpus_per_node=4,
    num_nodes=4,
    mean_seq_len=2048,
    train_rows=16,
    optimizer_steps=2,
    step_rows=32,
    packed_tokens=8192,
    micro_batch_size=1,
    logprob_micro_batch_size=1,
    logprob_passes=1,
    engine_tp=2,
    colocated=True,
)
# 16 rows / DP2 = 8 rows x 2048 = 16384 tokens per rank -> 2 packs of 8192, 4096 per CP rank.
MB = MicroBatch(n=4096, s=2048)


def test_micro_batch_comm_by_hand() -> None:
    comm = micro_batch_comm(INPUTS, MB, H100, train=True)
    # TP with SP: an [n, h] bf16 activation is 4096 x 1024 x 2 = 8 MiB; a ring all-gather
    # or reduce-scatter over 2 ranks moves half of it: 4194304 B / 360 GB/s.
    c = 8388608 / 2 / NVLINK
    # 4 per layer forward + 4 backward, 2 layers per stage, + the embedding's (or head's)
    # reduce-scatter forward and all-gather backward: 18 collectives.
    assert comm["tp"] == pytest.approx(18 * c)
    # CP2 ring: one K/V chunk of 4096 x 2 x 256 / 2 x 2 B = 2 MiB per layer forward, K/V
    # and dK/dV backward: 3 x 2 layers.
    assert comm["cp"] == pytest.approx(6 * 2097152 / NVLINK)
    # PP: the [n/sp, h] activation forward and its gradient backward, over IB.
    assert comm["pp"] == pytest.approx(2 * 2048 * 1024 * 2 / IB)
    assert comm["ep"] == 0
    # Without SP: all-reduces, twice the ring bytes each, half as many: the same total.
    no_sp = replace(INPUTS, dims=replace(DIMS, sequence_parallel=False))
    assert micro_batch_comm(no_sp, MB, H100, train=True)["tp"] == pytest.approx(18 * c)
    # Forward only: 4 per layer + the embedding's: 9.
    assert micro_batch_comm(INPUTS, MB, H100, train=False)["tp"] == pytest.approx(9 * c)


def test_dp_comm_by_hand() -> None:
    # Stage 0 at TP2: per layer qkv (1024 + 512)/2 x 1024 + proj 512 x 1024 + fc1 1024 x
    # 2048 + fc2 1024 x 1024 + two norms 2048 = 4458496; 2 layers + the embedding's 512
    # rows x 1024 = 9441280 elements.
    assert rank_params(ARCH, 2, 2, 0).total == 9441280
    # Distributed optimizer over DP x CP = 4 (across nodes): fp32 grads reduce-scattered,
    # bf16 params all-gathered, each moving 3/4 of the buffer.
    expected = 9441280 * 4 * 3 / 4 / IB + 9441280 * 2 * 3 / 4 / IB
    assert dp_comm_s(INPUTS, 0, H100) == pytest.approx(expected)
    # Without it: an fp32 all-reduce, 2 x 3/4 of the buffer.
    plain = replace(INPUTS, distributed_optimizer=False)
    assert dp_comm_s(plain, 0, H100) == pytest.approx(2 * 9441280 * 4 * 3 / 4 / IB)


def test_bubble_and_step_sum_by_hand() -> None:
    est = estimate(INPUTS, H100)
    assert est.micro_batches == 2 and est.micro_batch_tokens == 8192
    # 1F1B: m + PP - 1 = 3 slots for 2 micro-batches: bubble 1/3.
    assert est.bubble == pytest.approx(1 / 3)
    per_mb = max(stage_ops(INPUTS, MB, k, train=True).roofline_s(H100) for k in (0, 1))
    assert est.compute_s == pytest.approx(3 * per_mb)
    assert est.comm_s["tp"] == pytest.approx(3 * 18 * 8388608 / 2 / NVLINK)
    assert est.comm_s["dp"] == pytest.approx(max(dp_comm_s(INPUTS, k, H100) for k in (0, 1)))
    opt = max(optimizer_ops(INPUTS, k).roofline_s(H100) for k in (0, 1))
    assert est.train_step_s == pytest.approx(est.compute_s + opt + sum(est.comm_s.values()))
    assert est.train_s == pytest.approx(2 * est.train_step_s)  # two optimizer steps
    # Refit: 37757952 params x 2 B / engine TP2 on IB (4 nodes, the model-parallel group
    # TP2 x PP2 x CP2 = 8 spans two 4-GPU nodes).
    assert est.refit_s == pytest.approx(37757952 * 2 / 2 / IB)


def test_model_flops_and_mfu_by_hand() -> None:
    # Params: per layer attention 1024^2 + 2 x 1024 x 256 + 1024^2 = 2621440, MLP 3 x 1024
    # x 2048 = 6291456, norms 2048: 8914944 x 4 + embeddings 2 x 1024^2 + final norm 1024
    # = 37757952. Without the input embedding (a lookup): N = 36709376.
    assert ARCH.num_parameters() == 37757952
    # 6 N + causal attention 6 s q L = 6 x 2048 x 1024 x 4 = 50331648 per token.
    assert model_flops_per_token(ARCH, 2048) == 6 * 36709376 + 50331648 == 270587904
    est = estimate(INPUTS, H100)
    tokens = 16 * 2048  # one optimizer step's samples x mean length
    assert est.model_flops == 270587904 * tokens
    assert est.mfu == pytest.approx(est.model_flops / (est.train_step_s * 989e12 * 16))
    assert est.tokens_per_s_per_gpu == pytest.approx(tokens / est.train_step_s / 16)
    assert 0 < est.mfu < 1


def test_packed_attention_grows_with_the_sequence_not_the_pack() -> None:
    # Same tokens per micro-batch, twice the sequence length: only attention changes, by
    # 2 n s q / t per layer forward (x 2.5 backward, x 1 + 2.5 in all).
    base = stage_ops(INPUTS, MB, 0, train=True)
    longer = stage_ops(INPUTS, MicroBatch(n=4096, s=4096), 0, train=True)
    attention = 2 * 4096 * 2048 * 1024 / 2  # the extra 2048 tokens of span, per layer fwd
    assert longer.flops - base.flops == pytest.approx(2 * attention * 3.5, rel=1e-9)


def test_recompute_adds_a_forward() -> None:
    none = stage_ops(INPUTS, MB, 1, train=True)
    full = stage_ops(replace(INPUTS, recompute="full"), MB, 1, train=True)
    forward = stage_ops(INPUTS, MB, 1, train=False)
    head = 2 * 4096 * 1024 * 512  # the last stage's head runs once, not recomputed
    assert full.flops - none.flops == pytest.approx(forward.flops - head, rel=1e-9)


def test_traced_costs_give_the_analytic_estimate_back() -> None:
    # A "trace" whose ops are the analytic ones, at the plan's tokens: the same estimate.
    lp = MicroBatch(n=4096, s=2048)  # 32 rows / DP2 x 2048 = 32768 tokens: 4 packs of 8192
    traced = [
        TracedRank(
            stage=k,
            forward_backward=stage_ops(INPUTS, MB, k, train=True),
            train_tokens=8192,
            optimizer=optimizer_ops(INPUTS, k),
            logprob=stage_ops(INPUTS, lp, k, train=False),
            logprob_tokens=8192,
        )
        for k in (0, 1)
    ]
    analytic, from_trace = estimate(INPUTS, H100), estimate(INPUTS, H100, traced=traced)
    assert from_trace.basis == "traced" and analytic.basis == "analytic"
    assert from_trace.train_step_s == pytest.approx(analytic.train_step_s)
    assert from_trace.logprob_s == pytest.approx(analytic.logprob_s)
    # The trace process hands its ranks back as JSON.
    again = [TracedRank.from_json(json.loads(json.dumps(r.to_json()))) for r in traced]
    assert again == traced
    # A trace twice as costly per token doubles the compute only.
    slow = [replace(r, train_tokens=4096) for r in traced]
    assert estimate(INPUTS, H100, traced=slow).compute_s == pytest.approx(2 * analytic.compute_s)


def test_dapo_plan_prints_the_estimate_for_a_gpu_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    recipe = REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml"
    # Printed whether or not the memory plan fits (exit status 0 or 1).
    assert cli.plan_main(["--config", str(recipe)]) in (0, 1)
    out = capsys.readouterr().out
    section = out[out.index("step time (estimate, H100 SXM") :]
    for word in ("train step", "logprob pass", "tokens/s/GPU", "MFU", "basis: "):
        assert word in section
    assert cli.plan_main(["--config", str(recipe), "--gpu-mem", "h200"]) in (0, 1)
    assert "step time (estimate, H200: 989 TFLOP/s bf16, 4.80 TB/s" in capsys.readouterr().out


def test_dapo_plan_cpu_recipe_says_the_estimate_is_for_gpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.plan_main(["--config", str(REPO / "recipes" / "dapo-tiny-cpu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "step time: not estimated (the estimate is for GPU recipes)" in out
    assert "MFU" not in out


def test_a_lower_peak_share_slows_compute_not_mfu_basis() -> None:
    # At 70 % of the peak a compute-bound GEMM takes 1/0.7 as long; MFU stays on 989.
    at_peak = estimate(INPUTS, H100)
    slower = estimate(INPUTS, H100, Assumptions(peak_share=0.7))
    assert slower.compute_s > at_peak.compute_s
    assert slower.comm_s == at_peak.comm_s
    assert slower.card == H100
    assert slower.mfu == pytest.approx(slower.model_flops / (slower.train_step_s * 989e12 * 16))
    gemm = OpCosts()
    gemm.add("gemm", 2 * 4096**3, 3 * 4096**2 * 2)
    derated = replace(H100, peak_flops=0.7 * 989e12)
    assert gemm.roofline_s(derated) == pytest.approx(gemm.roofline_s(H100) / 0.7)


def test_refit_on_one_shared_gpu_is_a_copy_in_hbm() -> None:
    one = replace(
        INPUTS,
        dims=ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False),
        engine_tp=1,
        gpus_per_node=1,
        num_nodes=1,
    )
    # 37757952 params x 2 B read and written once: 2 x 75515904 B / 3.35 TB/s.
    assert estimate(one, H100).refit_s == pytest.approx(2 * 75515904 / 3.35e12)
    # Split on one node: over NVLink.
    split = replace(one, colocated=False)
    assert estimate(split, H100).refit_s == pytest.approx(75515904 / NVLINK)


def test_the_printout_names_a_traced_basis() -> None:
    run = load_config(REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml", []).require_plan()
    inputs = step_inputs(run)
    mb = MicroBatch(n=21504, s=inputs.mean_seq_len)  # CP1: a rank holds the whole pack
    rank = TracedRank(
        stage=0,
        forward_backward=stage_ops(inputs, mb, 0, train=True),
        train_tokens=21504,
        optimizer=None,
        logprob=stage_ops(inputs, mb, 0, train=False),
        logprob_tokens=21504,
    )
    text = format_step_time(run, "h100-80gb", traced=[rank])
    assert "basis: ops traced from the real step" in text
    assert "basis: analytic op counts" in format_step_time(run, "h100-80gb")
