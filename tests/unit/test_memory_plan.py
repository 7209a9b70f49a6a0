"""The per-GPU memory planner: exact parameter splits, hand-derived bytes, knobs, dapo-plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dapo_megatron.cli import plan_main
from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.memory_plan import (
    GIB,
    EngineInputs,
    MemoryInputs,
    Overheads,
    engine_memory,
    logits_bytes,
    plan_memory,
    rank_params,
    stage_memory,
)

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
SEVENTY_B = REPO / "recipes" / "dapo-llama-3.1-70b-16n8g-tp8pp4cp2.yaml"
NO_OVERHEAD = Overheads(0.0, 0.0, 0.0, 0.0, 0)


def _unique_params(arch_name: str, tp: int, pp: int) -> int:
    """Parameters of the HF model recovered from every rank's count: drop padded vocabulary
    rows and the tied copy, and count TP-replicated norms once per stage."""
    arch = PRESETS[arch_name]
    total = 0
    for pp_rank in range(pp):
        ranks = [rank_params(arch, tp, pp, pp_rank, tp_rank) for tp_rank in range(tp)]
        total += sum(r.total - r.vocab_padding - r.tied_copy for r in ranks)
        total -= (tp - 1) * ranks[0].replicated
    return total


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 2), (4, 7), (2, 4)])
def test_qwen2_5_7b_split_adds_up_to_the_published_count(tp, pp):
    assert _unique_params("qwen2.5-7b", tp, pp) == 7_615_616_512


@pytest.mark.parametrize("tp,pp", [(1, 1), (8, 1), (8, 4), (4, 8), (8, 10)])
def test_llama_3_1_70b_split_adds_up_to_the_published_count(tp, pp):
    assert _unique_params("llama-3.1-70b", tp, pp) == 70_553_706_496


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2)])
def test_tied_embedding_split_adds_up(tp, pp):
    arch = PRESETS["tiny-qwen2"]
    assert _unique_params("tiny-qwen2", tp, pp) == arch.num_parameters()
    last = rank_params(arch, tp, pp, pp - 1)
    # A tied embedding is a second copy on the last stage only when PP > 1.
    assert (last.tied_copy > 0) == (pp > 1)


def test_padded_vocab_rows_sit_on_the_last_tp_rank():
    arch = PRESETS["qwen2.5-7b"]  # 152064 = 1188 * 128: padded to 152576 at TP 8 (128 * 8)
    pads = [rank_params(arch, 8, 1, 0, r).vocab_padding for r in range(8)]
    assert pads[:7] == [0] * 7
    # 512 padded rows x hidden 3584, in the embedding and in the untied output layer.
    assert pads[7] == 2 * 512 * 3584


def _tiny_inputs(**change) -> MemoryInputs:
    base = MemoryInputs(
        arch=PRESETS["tiny-qwen2"],
        dims=ParallelDims(tp=2, pp=1, cp=1, dp=2, sequence_parallel=True),
        precision="bf16",
        optimizer="adam",
        distributed_optimizer=True,
        recompute="none",
        micro_batch_size=2,
        logprob_micro_batch_size=2,
        seq_len=32,
        micro_batches=4,
        gpu_mem_gib=80.0,
        on_gpu=True,
        colocated=True,
        engine=None,
        overheads=NO_OVERHEAD,
    )
    return dataclasses.replace(base, **change)


def test_hand_derived_bytes_of_a_small_layout():
    # tiny-qwen2: h 64, ffn 128, 4 heads / 2 kv heads of 16 (kv width 32), vocab 64, tied,
    # 2 layers. TP2 + SP, DP2, bf16, distributed Adam; micro-batch 2 x 32 tokens.
    s = stage_memory(_tiny_inputs(), 0)
    # Per layer per TP rank: q/k/v (64+32+32)/2 = 64 rows x (64 + 1 bias) = 4160, out-proj
    # 32 x 64 = 2048, gate/up/down 3 x 64 x 64 = 12288, two whole norms 128 -> 18624.
    # Embedding: vocab padded to 128 * 2 = 256 rows, 128 per rank x 64 = 8192. Final norm 64.
    params = 2 * 18624 + 8192 + 64
    assert s.params == params == 45504
    assert s.weights * GIB == params * 2
    assert s.master * GIB == params * 4 / 2  # fp32 main params, sharded over DP 2
    assert s.grads * GIB == params * 4  # fp32 grad buffer, whole
    assert s.optimizer * GIB == params * 8 / 2  # exp_avg + exp_avg_sq, sharded over DP 2
    # Activations, n = 64 tokens, p = 2: per layer n p (4h/2 + (2h + 2kv)/2 + 3f/2) =
    # 128 x (128 + 96 + 192) = 53248, plus the flash LSE n x 4 B x 2 heads = 512 -> 53760.
    # Two layers + one layer's backward working set + final-norm input n p h / 2 = 4096.
    assert s.activations * GIB == pytest.approx(2 * 53760 + 53760 + 4096)
    sel = stage_memory(_tiny_inputs(recompute="selective"), 0)
    assert sel.activations * GIB == pytest.approx(2 * 53248 + 53760 + 4096)
    full = stage_memory(_tiny_inputs(recompute="full"), 0)
    assert full.activations * GIB == pytest.approx(2 * 4096 + 53760 + 4096)
    # Fused logits: hidden n h p = 8192 + 5 fp32 vectors 1280; backward dH n h (4 + 2) = 24576
    # and dW (128 rows x 64) x (4 + 2) = 49152.
    assert s.logits * GIB == pytest.approx(8192 + 1280 + 24576 + 49152)
    naive = stage_memory(_tiny_inputs(fused_logits=False), 0)
    assert naive.logits * GIB == 64 * 128 * (2 + 4 + 4)


def test_fp32_has_no_master_copy_and_sgd_one_state():
    s = stage_memory(
        _tiny_inputs(precision="fp32", optimizer="sgd", distributed_optimizer=False), 0
    )
    assert s.master == 0
    assert s.optimizer * GIB == s.params * 4


def _seven_b(**change) -> MemoryInputs:
    base = _tiny_inputs(
        arch=PRESETS["qwen2.5-7b"],
        dims=ParallelDims(tp=2, pp=2, cp=2, dp=8, sequence_parallel=True),
        micro_batch_size=1,
        seq_len=21504,
        micro_batches=64,
        overheads=Overheads(),
    )
    return dataclasses.replace(base, **change)


def test_distributed_optimizer_divides_master_and_states_by_dp():
    on = stage_memory(_seven_b(distributed_optimizer=True), 0)
    off = stage_memory(_seven_b(distributed_optimizer=False), 0)
    assert off.optimizer == pytest.approx(8 * on.optimizer)
    assert off.master == pytest.approx(8 * on.master)
    assert off.grads == on.grads and off.weights == on.weights


@pytest.mark.parametrize("on_gpu", [True, False])
def test_recompute_full_below_selective_below_none(on_gpu):
    acts = {
        mode: stage_memory(_seven_b(recompute=mode, on_gpu=on_gpu), 0).activations
        for mode in ("none", "selective", "full")
    }
    assert acts["full"] < acts["selective"] < acts["none"]


def test_first_pipeline_stage_holds_pp_micro_batches():
    first, last = (stage_memory(_seven_b(), k) for k in (0, 1))
    assert (first.in_flight, last.in_flight) == (2, 1)
    assert first.activations > last.activations
    assert first.logits == 0 and last.logits > 0


def test_fused_logits_far_below_naive():
    inputs = _seven_b(dims=ParallelDims(tp=1, pp=1, cp=1, dp=8, sequence_parallel=False))
    fused = logits_bytes(inputs, 21504, backward=True)
    naive = logits_bytes(dataclasses.replace(inputs, fused_logits=False), 21504, backward=True)
    # ~31 GiB naive (21504 x 152064 x (2 + 4 + 4) B) against ~3.5 GiB fused.
    assert naive > 8 * fused
    assert naive == 21504 * 152064 * 10


def test_engine_kv_cache_capacity():
    engine = EngineInputs(
        tensor_parallel_size=2, gpu_memory_utilization=0.5, max_num_seqs=256, enforce_eager=False
    )
    e = engine_memory(_seven_b(engine=engine))
    assert e is not None
    # 2 (K and V) x 28 layers x 4/2 kv heads x 128 x 2 B.
    assert e.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2
    assert e.budget == pytest.approx(40.0)
    assert e.kv_tokens == int((40.0 - e.weights - e.overhead) * GIB // e.kv_bytes_per_token)
    assert e.full_sequences == e.kv_tokens // 21504 > 1


def test_kv_cache_below_one_sequence_does_not_fit():
    engine = EngineInputs(
        tensor_parallel_size=1, gpu_memory_utilization=0.2, max_num_seqs=256, enforce_eager=False
    )
    report = plan_memory(_seven_b(engine=engine))
    assert not report.fits
    assert "generation.engine.gpu_memory_utilization" in report.reason


def test_seventy_b_on_one_node_fails_naming_the_knobs(capsys):
    overrides = [
        "cluster.num_nodes=1",
        "policy.megatron.pipeline_model_parallel_size=1",
        "policy.megatron.context_parallel_size=1",
    ]
    assert plan_main(["--config", str(SEVENTY_B), *overrides]) == 1
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out
    err = captured.err
    assert err.startswith("error: the recipe does not fit in 80 GiB")
    assert "train phase needs" in err and "largest term:" in err
    assert "policy.megatron." in err


def test_gpu_mem_flag_changes_the_verdict(capsys):
    recipe = REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml"
    assert plan_main(["--config", str(recipe), "--gpu-mem", "40"]) == 1
    assert "does not fit in 40 GiB: train phase needs" in capsys.readouterr().err


def test_engine_budget_over_the_gpu_names_the_utilization(capsys):
    recipe = REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml"
    override = "generation.engine.gpu_memory_utilization=0.95"
    assert plan_main(["--config", str(recipe), override]) == 1
    err = capsys.readouterr().err
    assert "generation phase needs" in err and "largest term: engine budget" in err
    assert "generation.engine.gpu_memory_utilization" in err


def test_cpu_recipe_is_informative_only(capsys):
    tiny = REPO / "recipes" / "dapo-tiny-cpu.yaml"
    assert plan_main(["--config", str(tiny), "--gpu-mem", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "informative only" in out and "DOES NOT FIT" in out


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_passes_dapo_plan(recipe, capsys):
    assert plan_main(["--config", str(recipe)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "memory per GPU" in out and "memory: fits" in out


def test_packed_budget_sets_the_micro_batch_tokens() -> None:
    # A packed micro-batch of 64 tokens holds what 2 rows x 32 tokens hold: same activations
    # and logprob pass; half the budget, half the activation tokens.
    rows = stage_memory(_tiny_inputs(), 0)
    packed = stage_memory(_tiny_inputs(micro_batch_size=7, packed_tokens=64), 0)
    assert packed.activations == rows.activations and packed.logprob_pass == rows.logprob_pass
    smaller = stage_memory(_tiny_inputs(packed_tokens=32), 0)
    assert smaller.activations < rows.activations
