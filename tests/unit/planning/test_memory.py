"""The per-GPU memory planner (planning/memory.py and its terms): exact parameter splits,
hand-derived bytes, knobs, dapo-plan; Qwen3 and Qwen3-MoE; the terms outside PyTorch's
allocator (CUDA contexts, NCCL, vLLM's start-up)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from shipped_recipes import shipped_recipes

from dapo_megatron.cli import plan_main
from dapo_megatron.config.loader import load_config
from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.refit_transport import RefitTransport
from dapo_megatron.planning.memory import memory_inputs, plan_memory, unreleased_generation
from dapo_megatron.planning.memory_terms import (
    GIB,
    NO_OVERHEADS,
    EngineInputs,
    MemoryInputs,
    Overheads,
    engine_memory,
    engine_params,
    layer_activation_bytes,
    layer_params,
    logits_bytes,
    rank_params,
    stage_memory,
)
from dapo_megatron.planning.refit_memory import (
    MIB,
    RefitInputs,
    largest_gathered_parameter,
    largest_hf_tensor,
)
from unit.planning.tiny_inputs import tiny_inputs

REPO = Path(__file__).resolve().parents[3]
RECIPES = shipped_recipes()
SEVENTY_B = REPO / "recipes" / "dapo-llama-3.1-70b-16n8g-tp8pp4cp2.yaml"


def _unique_params(arch_name: str, tp: int, pp: int, ep: int = 1) -> int:
    """Parameters of the HF model recovered from every rank's count: drop padded vocabulary
    rows and the tied copy, count TP-replicated norms (and router) once per stage, and add
    the experts of the other EP - 1 ranks of the stage (each holds a different E/EP)."""
    arch = PRESETS[arch_name]
    total = 0
    for pp_rank in range(pp):
        ranks = [rank_params(arch, tp, pp, pp_rank, tp_rank, ep) for tp_rank in range(tp)]
        total += sum(r.total - r.vocab_padding - r.tied_copy for r in ranks)
        total -= (tp - 1) * ranks[0].replicated
        total += (ep - 1) * sum(r.experts for r in ranks)
    return total


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 2), (4, 7), (2, 4)])
def test_qwen2_5_7b_split_adds_up_to_the_published_count(tp, pp):
    assert _unique_params("qwen2.5-7b", tp, pp) == 7_615_616_512


@pytest.mark.parametrize("tp,pp", [(1, 1), (8, 1), (8, 4), (4, 8), (8, 10)])
def test_llama_3_1_70b_split_adds_up_to_the_published_count(tp, pp):
    assert _unique_params("llama-3.1-70b", tp, pp) == 70_553_706_496


# Published parameter counts of the Hugging Face checkpoints (as in config/test_model_arch.py).
@pytest.mark.parametrize(
    "name,published,layouts",
    [
        # Tied embedding, q width 2048 != hidden 1024.
        ("qwen3-0.6b", 596_049_920, [(1, 1, 1), (2, 1, 1), (4, 2, 1), (8, 7, 1), (2, 28, 1)]),
        ("qwen3-8b", 8_190_735_360, [(1, 1, 1), (4, 1, 1), (8, 4, 1), (2, 3, 1)]),
        ("qwen3-32b", 32_762_123_264, [(1, 1, 1), (8, 1, 1), (8, 4, 1), (4, 2, 1)]),
        # 128 experts of 3 x 2048 x 768 per layer, q width 4096 != hidden 2048.
        (
            "qwen3-30b-a3b",
            30_532_122_624,
            [(1, 1, 1), (1, 1, 8), (2, 1, 4), (4, 2, 8), (2, 4, 16), (1, 6, 128), (4, 1, 2)],
        ),
    ],
)
def test_qwen3_split_adds_up_to_the_published_count(name, published, layouts):
    for tp, pp, ep in layouts:
        assert _unique_params(name, tp, pp, ep) == published, (tp, pp, ep)


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
    # No margin: hand-derived bytes against exact fits (planning/test_capacity.py).
    return tiny_inputs(**{"margin_gib": 0.0, **change})


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


def test_distributed_optimizer_divides_master_and_states_by_dp_times_cp():
    # DP8 x CP2: Megatron's dense DDP buffer reduce-scatters over the DP x CP group
    # (intra_dp_cp_group), so the states shard 16 ways.
    on = stage_memory(_seven_b(distributed_optimizer=True), 0)
    off = stage_memory(_seven_b(distributed_optimizer=False), 0)
    assert off.optimizer == pytest.approx(16 * on.optimizer)
    assert off.master == pytest.approx(16 * on.master)
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


def test_first_stage_under_pp_holds_the_embedding_weight_gradient():
    # The embedding's backward makes a dense bf16 weight gradient [V/TP, h] last in a
    # micro-batch's backward: at the peak only while other micro-batches are in flight.
    # Qwen2.5-7B, vocab 152064 padded to 152064 (a multiple of 128 x 2), TP2: 76032 rows.
    grad = 76032 * 3584 * 2
    piped = stage_memory(_seven_b(), 0)
    one = stage_memory(_seven_b(micro_batches=1), 0)  # in flight: 1, nothing else held
    layers = 28 // 2
    per_layer = layer_activation_bytes(_seven_b(), 21504 // 2, "none")
    assert piped.in_flight == 2 and one.in_flight == 1
    assert piped.activations * GIB == pytest.approx(2 * layers * per_layer + per_layer + grad)
    assert one.activations * GIB == pytest.approx(layers * per_layer + per_layer)


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
    assert err.startswith(
        "error: the recipe does not fit in h100-80gb, 79.2 GiB reported (safety margin 4.0 GiB)"
    )
    assert "train phase needs" in err and "largest term:" in err
    assert "policy.megatron." in err


def test_gpu_mem_flag_changes_the_verdict(capsys):
    recipe = REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml"
    assert plan_main(["--config", str(recipe), "--gpu-mem", "40"]) == 1
    err = capsys.readouterr().err
    assert "does not fit in 40 GiB (safety margin 2.0 GiB): train phase needs" in err


def test_engine_budget_over_the_gpu_names_the_utilization(capsys):
    recipe = REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml"
    override = "generation.engine.gpu_memory_utilization=0.95"
    assert plan_main(["--config", str(recipe), override]) == 1
    err = capsys.readouterr().err
    # vLLM's start-up check fails first (the policy's weights, grads and fp32 main params
    # leave less than 0.95 x the GPU free); generation, with Adam's states, is over too.
    assert "engine start phase needs" in err and "largest term: engine budget" in err
    assert "vLLM refuses to start" in err and "also over the margin: generation" in err
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


# ---------------------------------------------------------------------------------------
# KL reference and refit buffers


def _peaks(inputs: MemoryInputs) -> dict[str, float]:
    """Bytes of every phase's peak."""
    return {ph.name: ph.peak * GIB for ph in plan_memory(inputs).phases}


def _terms(inputs: MemoryInputs, phase: str) -> dict[str, float]:
    """Bytes of every term of one phase."""
    ph = next(p for p in plan_memory(inputs).phases if p.name == phase)
    return {k: v * GIB for k, v in ph.terms}


TINY_ENGINE = EngineInputs(
    tensor_parallel_size=1, gpu_memory_utilization=0.5, max_num_seqs=4, enforce_eager=False
)


def test_kl_coef_zero_adds_nothing():
    with_engine = _tiny_inputs(engine=TINY_ENGINE)
    assert stage_memory(with_engine, 0).reference == 0
    terms = {k for ph in plan_memory(with_engine).phases for k, _ in ph.terms}
    assert "KL reference" not in terms
    # And a config with kl_coef 0 asks for no reference (the base config's DAPO default).
    run = load_config(REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml", []).require_plan()
    assert run.config.dapo.loss.kl_coef == 0
    assert not memory_inputs(run, 80.0).kl_reference


def test_kl_reference_adds_the_rank_weight_shard_to_every_phase():
    # tiny-qwen2 at TP2 PP1: 45504 parameters per rank (test_hand_derived_bytes_of_a_small_
    # layout), bf16: 91008 bytes, resident like the weights in every phase, engine or not.
    base = _tiny_inputs(engine=TINY_ENGINE)
    ref = dataclasses.replace(base, kl_reference=True)
    assert stage_memory(ref, 0).reference * GIB == 45504 * 2
    before, after = _peaks(base), _peaks(ref)
    assert set(before) == {"train", "logprob", "engine start", "generation"}
    for name in before:
        assert after[name] - before[name] == pytest.approx(45504 * 2), name
    # Not sharded over DP (the optimizer states are): DP 4 keeps the same copy.
    dp4 = dataclasses.replace(ref, dims=dataclasses.replace(ref.dims, dp=4))
    assert stage_memory(dp4, 0).reference == stage_memory(ref, 0).reference
    # fp32 keeps it in fp32.
    fp32 = stage_memory(dataclasses.replace(ref, precision="fp32"), 0)
    assert fp32.reference * GIB == 45504 * 4


def test_kl_reference_follows_each_pipeline_stage_shard():
    # TP2 PP2: stage 0 holds 1 layer (18624) + the embedding shard (8192); stage 1 the other
    # layer, the final norm (64) and the tied embedding's copy (8192).
    inputs = _tiny_inputs(
        dims=ParallelDims(tp=2, pp=2, cp=1, dp=2, sequence_parallel=True), kl_reference=True
    )
    first, last = (stage_memory(inputs, k) for k in (0, 1))
    assert first.reference * GIB == (18624 + 8192) * 2
    assert last.reference * GIB == (18624 + 64 + 8192) * 2


def _split_refit(transport: str, bucket_bytes: int, **change) -> MemoryInputs:
    refit = RefitInputs(
        transport=RefitTransport(transport),
        bucket_bytes=bucket_bytes,
        exporters=RefitTransport(transport).bucket_exporters(4, 4),
        engine_asleep=True,
    )
    return _tiny_inputs(colocated=False, engine=TINY_ENGINE, refit=refit, **change)


def test_broadcast_refit_buffers_are_two_buckets_each_side():
    # Largest tiny-qwen2 HF tensor: gate/up/down 128 x 64 = 8192 elements, 16 KiB in bf16,
    # below the 1 MiB bucket: every buffer is one bucket.
    inputs = _split_refit("broadcast", MIB)
    policy = _terms(inputs, "refit")
    # Rank 0: its staging buffer + the exported tensors of the bucket being packed + the
    # gathered parameter they are cut from, the largest being 16384 elements (fc1: 2 x 128
    # x 64; the embedding padded for TP2: 256 x 64), 32 KiB in bf16.
    assert policy["refit staging"] == MIB and policy["refit export"] == MIB + 32768
    engine = _terms(inputs, "engine refit")
    # The bucket being loaded + the next one already posted.
    assert engine["refit receive"] == 2 * MIB
    e = engine_memory(inputs)
    assert e is not None
    assert engine == pytest.approx({"engine weights": e.weights * GIB, "refit receive": 2 * MIB})
    # Nothing of the refit outside the refit phases (broadcast keeps no buffer).
    assert _peaks(inputs)["train"] == _peaks(dataclasses.replace(inputs, refit=None))["train"]


def test_broadcast_refit_sender_is_rank_zero_only():
    dims = ParallelDims(tp=2, pp=2, cp=1, dp=2, sequence_parallel=True)
    inputs = _split_refit("broadcast", MIB, dims=dims)
    first, last = (stage_memory(inputs, k) for k in (0, 1))
    assert (first.refit_staging * GIB, first.refit_export * GIB) == (MIB, MIB + 32768)
    # Stage 1 only takes part in the gathers: a gathered parameter and the copies split
    # out of it, twice fc1's 16384 elements (gate and up are strided at TP2), in bf16.
    assert (last.refit_staging, last.refit_export * GIB) == (0, 2 * 2 * 128 * 64 * 2)


def test_tensor_larger_than_the_bucket_sizes_every_buffer():
    # A 4 KiB bucket: the 16 KiB gate/up/down tensors travel alone, so each buffer is 16 KiB.
    inputs = _split_refit("broadcast", 4096)
    assert _terms(inputs, "refit")["refit staging"] == 128 * 64 * 2
    assert _terms(inputs, "engine refit")["refit receive"] == 2 * 128 * 64 * 2


def test_ipc_refit_buffer_is_resident_and_counted_once_per_side():
    refit = RefitInputs(
        transport=RefitTransport.IPC, bucket_bytes=MIB, exporters=4, engine_asleep=True
    )
    inputs = _tiny_inputs(engine=TINY_ENGINE, refit=refit)  # colocated, 4 policy ranks
    without = _peaks(dataclasses.replace(inputs, refit=None))
    peaks = _peaks(inputs)
    # The shared buffer stays allocated between refits: one bucket more in every phase.
    for name in ("train", "logprob", "generation"):
        assert peaks[name] - without[name] == pytest.approx(MIB), name
    refit_terms = _terms(inputs, "refit")
    s = stage_memory(inputs, 0)
    e = engine_memory(inputs)
    assert e is not None
    resident = (s.weights + s.master + s.grads + s.optimizer) * GIB
    assert refit_terms == pytest.approx(
        {
            "weights": s.weights * GIB,
            "master weights": s.master * GIB,
            "grads": s.grads * GIB,
            "optimizer": s.optimizer * GIB,
            "refit buffer": MIB,
            # The bucket's exported tensors, packed into the buffer, and the gathered
            # parameter being split (fc1, 2 x 128 x 64 in bf16).
            "refit export": MIB + 32768,
            "engine weights": e.weights * GIB,  # woken for the refit, KV cache still asleep
            "refit receive": MIB,  # the engine's own copy of the bucket
        }
    )
    assert peaks["refit"] == pytest.approx(resident + 3 * MIB + 32768 + e.weights * GIB)


def test_ipc_buffers_only_on_ranks_paired_with_an_engine_worker():
    # 8 policy ranks (TP2 PP2 DP2), 2 engine workers: ranks 0 and 1, both on stage 0.
    dims = ParallelDims(tp=2, pp=2, cp=1, dp=2, sequence_parallel=True)
    refit = RefitInputs(
        transport=RefitTransport.IPC, bucket_bytes=MIB, exporters=2, engine_asleep=True
    )
    inputs = _tiny_inputs(dims=dims, colocated=False, engine=TINY_ENGINE, refit=refit)
    assert stage_memory(inputs, 0).refit_buffer * GIB == MIB
    assert stage_memory(inputs, 1).refit_buffer == 0


def test_kl_reference_tips_a_fitting_plan_over():
    base = _tiny_inputs()
    train = _peaks(base)["train"]
    # Room for half of the 91008-byte reference: fits without it, not with it.
    fitting = dataclasses.replace(base, gpu_mem_gib=(train + 45504) / GIB)
    assert plan_memory(fitting).fits
    report = plan_memory(dataclasses.replace(fitting, kl_reference=True))
    assert not report.fits
    assert report.reason.startswith("train phase needs")
    assert "KL reference 0.0" in report.reason  # named among the phase's terms


def test_engine_still_generating_needs_room_for_the_receive_buffers():
    # rollout.max_staleness >= 1: the engine receives with its KV cache allocated, so its
    # whole budget plus the two receive buckets must fit on its GPU.
    refit = RefitInputs(
        transport=RefitTransport.BROADCAST, bucket_bytes=MIB, exporters=1, engine_asleep=False
    )
    util = TINY_ENGINE.gpu_memory_utilization
    mem_fits = (2 * MIB / GIB) / (1 - util)  # budget + 2 MiB == the GPU exactly
    inputs = _tiny_inputs(colocated=False, engine=TINY_ENGINE, refit=refit, gpu_mem_gib=mem_fits)
    assert _terms(inputs, "engine refit") == pytest.approx(
        {"engine budget": util * mem_fits * GIB, "refit receive": 2 * MIB}
    )
    assert plan_memory(inputs).fits
    tight = plan_memory(dataclasses.replace(inputs, gpu_mem_gib=mem_fits * 0.99))
    assert not tight.fits
    assert tight.reason.startswith("engine refit phase needs")
    assert "refit receive" in tight.reason


def test_memory_inputs_resolve_the_reference_and_the_refit():
    recipes = REPO / "recipes"
    seven_b = recipes / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml"
    run = load_config(seven_b, ["dapo.loss.kl_coef=0.1"]).require_plan()
    inputs = memory_inputs(run, 80.0)
    assert inputs.kl_reference
    # Colocated on GPU: ipc, every one of the 32 policy ranks pairs with an engine worker.
    assert inputs.refit == RefitInputs(RefitTransport.IPC, 512 * MIB, 32, True)
    split = load_config(recipes / "dapo-tiny-cpu-vllm.yaml", []).require_plan()
    assert memory_inputs(split, 80.0).refit == RefitInputs(
        RefitTransport.BROADCAST, int(0.05 * MIB), 1, True
    )
    fallback = load_config(seven_b, ["generation.refit_transport=object_store"]).require_plan()
    assert memory_inputs(fallback, 80.0).refit is None
    megatron = load_config(recipes / "dapo-tiny-cpu.yaml", []).require_plan()
    assert memory_inputs(megatron, 80.0).refit is None


@pytest.mark.parametrize("bucket_mib", [0.01, 0.05, 0.2, 64])
def test_bucket_buffer_bounds_the_real_bucket_layout(bucket_mib):
    """The planner's buffer size B (pure arithmetic) against the refit's own bucket layout
    over the tiny architecture's full HF tensor shapes: never below the layout's largest
    bucket, and equal to it when one tensor outgrows the bucket size (0.01 MiB here)."""
    import torch

    from dapo_megatron.planning.refit_memory import ALIGN_BYTES, bucket_buffer_bytes
    from dapo_megatron.refit import buckets

    assert ALIGN_BYTES == buckets.ALIGN_BYTES
    arch = PRESETS["tiny-qwen2"]
    h, kv = arch.hidden_size, arch.num_query_groups * arch.head_dim
    layer = [
        ("q_proj.weight", (arch.num_attention_heads * arch.head_dim, h)),
        ("k_proj.weight", (kv, h)),
        ("v_proj.weight", (kv, h)),
        ("o_proj.weight", (h, arch.num_attention_heads * arch.head_dim)),
        ("gate_proj.weight", (arch.ffn_hidden_size, h)),
        ("up_proj.weight", (arch.ffn_hidden_size, h)),
        ("down_proj.weight", (h, arch.ffn_hidden_size)),
        ("input_layernorm.weight", (h,)),
    ]
    shapes = [("embed_tokens.weight", (arch.vocab_size, h))]
    shapes += [(f"layers.{i}.{n}", s) for i in range(arch.num_layers) for n, s in layer]
    shapes += [("norm.weight", (h,)), ("lm_head.weight", (arch.vocab_size, h))]
    bucket_bytes = int(bucket_mib * MIB)
    layout = buckets.plan_buckets(shapes, torch.bfloat16, bucket_bytes)
    refit = RefitInputs(RefitTransport.BROADCAST, bucket_bytes, exporters=1, engine_asleep=True)
    planned = bucket_buffer_bytes(refit, arch, 2)
    assert planned >= layout.max_bucket_bytes
    largest = max(n * 2 for n in (arch.vocab_size * h, arch.ffn_hidden_size * h))
    if largest > bucket_bytes:
        assert planned == layout.max_bucket_bytes
    else:  # the greedy layout fills a bucket to within one tensor of its size, if it can
        assert (
            layout.max_bucket_bytes
            > min(bucket_bytes, sum(b.nbytes for b in layout.buckets)) - largest
        )


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize(
    "name", ["tiny-qwen2", "tiny-qwen2-hd32", "qwen2.5-0.5b", "qwen2.5-7b", "llama-3.1-70b"]
)
def test_export_term_is_the_largest_parameter_the_exporter_gathers(name, tp):
    # Cross-check F against the exporter's own table of what it gathers whole
    # (hf_weights._entries: every Megatron parameter's shape with its TP shards joined).
    # tiny-qwen2-hd32 at TP1: fc1 (2 x 128 x 64) outgrows the padded vocabulary (128 x 64).
    from dapo_megatron.megatron.hf_weights import _entries

    arch = PRESETS[name]
    dims = ParallelDims(tp=tp, pp=1, cp=1, dp=1, sequence_parallel=tp > 1)
    gathered = max(math.prod(e.full_shape) for e in _entries(arch, dims) if e.export)
    assert largest_gathered_parameter(arch, tp) == gathered


def test_colocated_generation_counts_the_policy_after_its_cache_release(capsys):
    # The 7B recipe (colocated vLLM): while the engine is awake the policy keeps only its
    # resident states (memory_release.py returns the training peak first); without the
    # release its train peak would stay reserved next to the engine's budget: over the GPU.
    recipe = REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml"
    report = plan_memory(memory_inputs(load_config(recipe).require_plan(), 79.2))
    phases = {ph.name: ph for ph in report.phases}
    train, generation = phases["train"], phases["generation"]
    budget = report.inputs.engine.gpu_memory_utilization * 79.2
    stage = report.stages[0]
    ov = report.inputs.overheads
    process = ov.cuda_context_gib + ov.nccl_gib  # the policy's context and NCCL (world 32)
    engine_context = ov.cuda_context_gib
    assert generation.peak == pytest.approx(stage.resident + process + engine_context + budget)
    assert generation.fits
    kept, peak = unreleased_generation(report)
    assert kept == pytest.approx(train.peak - ov.sleeping_engine_gib - engine_context)
    assert peak == pytest.approx(kept + engine_context + budget) and peak > 79.2
    assert plan_main(["--config", str(recipe)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "engine is awake" in x)
    assert f"{stage.resident + process:.1f} GiB" in line and f"{peak:.1f} GiB" in line


def test_split_and_megatron_runs_have_no_unreleased_generation():
    seven_b = REPO / "recipes" / "dapo-qwen2.5-7b-4n8g-tp4pp1cp1.yaml"
    split = ["cluster.colocated=false", "cluster.generation_num_devices=16"]
    for overrides in (split, ["generation.backend=megatron"]):
        plan = load_config(seven_b, overrides).require_plan()
        assert unreleased_generation(plan_memory(memory_inputs(plan, 80.0))) is None


# ---------------------------------------------------------------------------------------
# The memory plan of Qwen3 and Qwen3-MoE: q width, q/k norms, experts, EP, routed tokens.
#
# Hand-derived bytes for tiny-qwen3-moe at EP1 and EP2, the engine's weights against the
# published parameter counts, the refit's largest tensors, and dapo-plan's MoE rows.

MOE_RECIPES = shipped_recipes("dapo-qwen3-30b-a3b-*.yaml")
TINY_MOE = PRESETS["tiny-qwen3-moe"]


def _moe_inputs(ep: int, **change) -> MemoryInputs:
    """tiny-qwen3-moe at TP1 PP1 CP1 DP2 and the given EP, bf16, distributed Adam, one
    micro-batch of 2 x 32 tokens, no overheads."""
    base = MemoryInputs(
        arch=TINY_MOE,
        dims=ParallelDims(tp=1, pp=1, cp=1, dp=2, sequence_parallel=False, ep=ep),
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
        overheads=NO_OVERHEADS,
    )
    return dataclasses.replace(base, **change)


# tiny-qwen3-moe: 2 layers, h 64, 2 heads / 2 KV heads of head_dim 32 (q width 64, kv width
# 64), vocab 64 (tied), 4 experts of FFN 32, top-2. Per layer on a TP1 rank:
#   linear_qkv (64 + 2 x 64) x 64 = 12288, linear_proj 64 x 64 = 4096,
#   whole: two norms 2 x 64 + q/k norms 2 x 32 + router 4 x 64 = 448  -> dense 16832;
#   experts 4/EP x 3 x 64 x 32: EP1 24576, EP2 12288.
# Embedding 64 rows padded to 128 (x 64) = 8192, final norm 64: dense 2 x 16832 + 8256 = 41920.
DENSE = 41920
EXPERTS = {1: 2 * 24576, 2: 2 * 12288}


@pytest.mark.parametrize("ep", [1, 2])
def test_hand_derived_states_of_tiny_moe(ep):
    s = stage_memory(_moe_inputs(ep), 0)
    params = DENSE + EXPERTS[ep]  # EP1 91072, EP2 66496
    assert (s.params, s.expert_params) == (params, EXPERTS[ep])
    assert s.weights * GIB == params * 2
    assert s.grads * GIB == params * 4  # fp32 grad buffers, dense and expert, unsharded
    # Distributed optimizer: the dense buffer shards over DP x CP = 2, the expert buffer
    # over the expert DP group DP x CP / EP: 2 at EP1, 1 at EP2.
    # EP1: (41920 + 49152) / 2 = 45536 fp32 elements per state;
    # EP2: 41920 / 2 + 24576 / 1 = 45536: E/EP experts over DPxCP/EP ranks is E/(DPxCP)
    # whatever EP is, so the sharded states are the same at EP1 and EP2.
    per_state = 45536
    assert s.master * GIB == per_state * 4
    assert s.optimizer * GIB == per_state * 8  # exp_avg + exp_avg_sq
    expert_state = {1: 49152 / 2, 2: 24576 / 1}[ep]
    assert [x * GIB for x in s.expert_states] == [
        EXPERTS[ep] * 2,
        expert_state * 4,
        EXPERTS[ep] * 4,
        expert_state * 8,
    ]


def test_hand_derived_activations_of_tiny_moe():
    # n = 2 x 32 = 64 tokens, p = 2, t = 1 (no SP): per layer, none
    #   n p (4h + (2q + 2kv) + (q + kv)) = 128 x (256 + 256 + 128) = 81920
    #   experts: n p k (h + 3F) = 64 x 2 x 2 x (64 + 96) = 40960,
    #            router scores and routed probs n 4 (E + k) = 64 x 4 x 6 = 1536 -> 42496
    #   flash LSE n 4 heads = 512                                       -> 124928
    # Two layers in flight + one layer's backward set + final-norm input 64 x 2 x 64 = 8192.
    # The backward set adds the dispatch's routed copies in flight, (6 + 2/t) n k h p =
    # 8 x 64 x 2 x 64 x 2 = 131072 at t = 1.
    dispatch = 8 * 64 * 2 * 64 * 2
    for ep in (1, 2):  # balanced routing: a rank's experts see n k copies at any EP
        s = stage_memory(_moe_inputs(ep), 0)
        assert s.activations * GIB == 3 * 124928 + dispatch + 8192
        assert s.expert_activations * GIB == 3 * 42496 + dispatch
    full = stage_memory(_moe_inputs(2, recompute="full"), 0)
    # Full recompute: only the layer inputs n p h = 8192 are saved; the working set remains.
    assert full.activations * GIB == 2 * 8192 + 124928 + dispatch + 8192
    assert full.expert_activations * GIB == 42496 + dispatch


def test_routed_copies_do_not_shrink_with_tensor_parallelism():
    # TP2 + SP, EP2 (DP2): the dispatcher gathers the TP group's tokens, so the expert
    # input keeps n k x h per rank; only F and the router's rows are split.
    # n 64, p 2, k 2, h 64, F/t 16: 64 x 2 x 2 x (64 + 48) = 28672; router
    # 64 x 4 x (4/2 + 2) = 1024.
    inputs = _moe_inputs(2, dims=ParallelDims(tp=2, pp=1, cp=1, dp=2, sequence_parallel=True, ep=2))
    dense = dataclasses.replace(inputs, arch=PRESETS["tiny-qwen3"])
    moe_layer = layer_activation_bytes(inputs, 64, "selective")
    # tiny-qwen3 has the same attention and a dense SwiGLU of ffn 128: 3 x 128/2 per token.
    dense_mlp = 64 * 2 * 3 * 128 / 2
    assert moe_layer - (layer_activation_bytes(dense, 64, "selective") - dense_mlp) == 29696


def test_query_width_sizes_the_attention_of_qwen3():
    # Qwen3-0.6B: h 1024, 16 heads x 128 = q width 2048, 8 KV heads x 128 = 1024, ffn 3072.
    arch = PRESETS["qwen3-0.6b"]
    # TP2: qkv (2048 + 2048)/2 x 1024 + proj 2048/2 x 1024 + 3 x 1536 x 1024; whole: two
    # norms 2048 + q/k norms 256.
    assert layer_params(arch, 2) == (2_097_152 + 1_048_576 + 4_718_592, 2304)
    inputs = _moe_inputs(1, arch=arch, dims=ParallelDims(1, 1, 1, 2, False))
    # One token, p 2: 4 x 1024 + (2 x 2048 + 2 x 1024) + (2048 + 1024) + 3 x 3072 = 22528
    # elements, plus the flash LSE of 16 heads in fp32.
    assert layer_activation_bytes(inputs, 1, "none") == 2 * 22528 + 16 * 4


@pytest.mark.parametrize(
    "name,published",
    [
        ("qwen3-0.6b", 596_049_920),
        ("qwen3-8b", 8_190_735_360),
        ("qwen3-32b", 32_762_123_264),
        ("qwen3-30b-a3b", 30_532_122_624),
    ],
)
def test_engine_at_tp1_holds_the_whole_published_model(name, published):
    # vLLM pads the vocabulary to 64 (151936 already is): an engine of TP1 holds every
    # parameter of the checkpoint, every expert included.
    assert engine_params(PRESETS[name], 1) == published


def test_moe_engine_holds_every_expert_split_by_engine_tp():
    # tiny-qwen3-moe at engine TP2: per layer q/k/v (32 + 2 x 32) x 64 = 6144 (one KV head
    # per rank), o 32 x 64 = 2048, router 256, q/k norms 64, norms 128 -> 8640; all 4
    # experts at F/2 = 16: 4 x 3 x 16 x 64 = 12288 per layer; vocab 32 rows x 64 = 2048.
    assert engine_params(TINY_MOE, 2) == 2 * (8640 + 12288) + 2048 + 64 == 43968
    engine = EngineInputs(2, 0.5, 4, enforce_eager=False)
    e = engine_memory(_moe_inputs(1, engine=engine))
    assert e is not None and e.expert_weights * GIB == 2 * 12288 * 2
    # KV: 2 x 2 layers x 1 KV head x 32 x 2 B.
    assert e.kv_bytes_per_token == 256


def test_refit_tensors_of_a_moe_are_one_expert_not_all():
    # HF tensors: max(vocab 64, one expert's F 32, router 4, q 64) x h 64.
    assert largest_hf_tensor(TINY_MOE) == 4096
    # Gathered: max(padded vocab 128, one expert's fc1 2 x 32, router 4, qkv 6 x 32) x 64.
    assert largest_gathered_parameter(TINY_MOE, 1) == 192 * 64
    # Qwen3-30B-A3B: the embedding bounds both, 151936 x 2048 exported and, gathered at
    # TP2, its rows padded to a multiple of 256: 152064 x 2048 (all 128 experts' fc1 of a
    # layer at once would be 128 x 2 x 768 x 2048 = 402,653,184 elements, 29% more).
    big = PRESETS["qwen3-30b-a3b"]
    assert largest_hf_tensor(big) == 151936 * 2048
    assert largest_gathered_parameter(big, 2) == 152064 * 2048


def test_expert_slot_export_sizes_the_refit_export_of_a_moe():
    # tiny-qwen3-moe at EP2, broadcast from rank 0 with a 1 MiB bucket: one expert slot
    # gathers 2 experts' fc1 (2 x 32 x 64) and fc2 (64 x 32) over EP, plus its own expert
    # and one expert's shards/copies: (2 + 2) x 3 x 32 x 64 = 24576 elements, more than the
    # largest gathered parameter (qkv, 12288): 49152 bytes in bf16 beside the bucket.
    refit = RefitInputs(RefitTransport.BROADCAST, MIB, exporters=1, engine_asleep=True)
    engine = EngineInputs(1, 0.5, 4, enforce_eager=False)
    inputs = _moe_inputs(2, colocated=False, engine=engine, refit=refit)
    assert stage_memory(inputs, 0).refit_export * GIB == MIB + 24576 * 2
    # A dense model of the same attention keeps the gathered-parameter bound.
    dense = dataclasses.replace(inputs, arch=PRESETS["tiny-qwen3"])
    assert stage_memory(dense, 0).refit_export * GIB == MIB + 16384 * 2  # fc1 2 x 128 x 64


def test_ep_appears_in_the_layout_and_the_knobs():
    # 30B-A3B on 8 GPUs at EP1 cannot hold its states (every expert on every rank): the
    # message names expert parallelism among the knobs.
    inputs = _moe_inputs(
        1,
        arch=PRESETS["qwen3-30b-a3b"],
        dims=ParallelDims(tp=1, pp=1, cp=1, dp=8, sequence_parallel=False),
        overheads=Overheads(),
    )
    report = plan_memory(inputs)
    assert not report.fits
    assert "policy.megatron.expert_model_parallel_size" in report.reason
    # Each rank keeps all experts: 48 x 128 x 3 x 2048 x 768 x 2 B = 54 GiB of weights.
    assert report.stages[0].expert_states[0] * GIB == 48 * 128 * 3 * 2048 * 768 * 2


@pytest.mark.parametrize("recipe", MOE_RECIPES, ids=lambda p: p.name)
def test_moe_recipe_prints_ep_and_the_expert_rows(recipe, capsys):
    assert plan_main(["--config", str(recipe)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert " EP" in out and "expert DP" in out
    assert "128 experts (top-8, FFN 768)" in out
    rows = [line for line in out.splitlines() if "of which experts" in line]
    assert len(rows) == 5 and "routed copies" in rows[-1]
    assert "experts" in next(line for line in out.splitlines() if "vLLM engine GPU" in line)


def test_a_moe_recipe_ships():
    assert MOE_RECIPES, "recipes/dapo-qwen3-30b-a3b-*.yaml"


# ---------------------------------------------------------------------------------------
# Terms outside the allocator, and vLLM's start-up check


OVERHEADS = Overheads(
    cuda_context_gib=0.5,
    nccl_gib=1.0,
    train_workspace_gib=2.5,
    engine_runtime_gib=1.0,
    sleeping_engine_gib=0.5,
    engine_profile_tokens=0,
)
ENGINE = EngineInputs(
    tensor_parallel_size=1, gpu_memory_utilization=0.5, max_num_seqs=4, enforce_eager=False
)


def _phase_terms(inputs: MemoryInputs) -> dict[str, dict[str, float]]:
    return {ph.name: dict(ph.terms) for ph in plan_memory(inputs).phases}


def test_colocated_phases_count_both_processes_and_the_engine_start():
    # tiny-qwen2 at TP2 DP2 (world 4), colocated vLLM at 0.5 of 80 GiB.
    inputs = tiny_inputs(overheads=OVERHEADS, engine=ENGINE)
    s = stage_memory(inputs, 0)
    terms = _phase_terms(inputs)
    for phase in ("train", "logprob"):
        t = terms[phase]
        assert t["policy CUDA context"] == 0.5 and t["policy NCCL"] == 1.0
        assert t["engine CUDA context"] == 0.5 and t["sleeping engine"] == 0.5
        assert t["train workspace"] == 2.5
    # Generation: every resident state, Adam's included (created at the first optimizer
    # step, after the engine sized its KV cache), both contexts, NCCL and the budget.
    generation = terms["generation"]
    assert generation == pytest.approx(
        {
            "weights": s.weights,
            "master weights": s.master,
            "grads": s.grads,
            "optimizer": s.optimizer,
            "policy CUDA context": 0.5,
            "policy NCCL": 1.0,
            "engine CUDA context": 0.5,
            "engine budget": 40.0,
        }
    )
    # vLLM's start-up check: gpu_memory_utilization x total must be free next to what the
    # policy has allocated by then: no Adam states yet.
    start = terms["engine start"]
    assert "optimizer" not in start
    assert sum(start.values()) == pytest.approx(sum(generation.values()) - s.optimizer)


def test_one_gpu_world_has_no_nccl_and_a_cpu_run_no_cuda_context():
    one = tiny_inputs(overheads=OVERHEADS, engine=ENGINE, dims=ParallelDims(1, 1, 1, 1, False))
    assert "policy NCCL" not in _phase_terms(one)["generation"]
    cpu = tiny_inputs(overheads=OVERHEADS, engine=ENGINE, on_gpu=False)
    for terms in _phase_terms(cpu).values():
        assert not {"policy CUDA context", "policy NCCL", "engine CUDA context"} & set(terms)


def test_split_engine_gpu_holds_its_context_next_to_its_budget():
    inputs = tiny_inputs(overheads=OVERHEADS, engine=ENGINE, colocated=False)
    terms = _phase_terms(inputs)
    assert "engine start" not in terms  # alone on its GPU: the same sum as generation
    assert terms["generation"] == {"engine CUDA context": 0.5, "engine budget": 40.0}
    assert "engine CUDA context" not in terms["train"]


def test_engine_budget_too_large_to_start_names_vllms_check():
    # 0.9 x 80 GiB = 72 GiB cannot be free next to a 7B policy's weights, grads and main
    # params: the engine start phase fails (vLLM's own error at start-up).
    inputs = tiny_inputs(
        arch=PRESETS["qwen2.5-7b"],
        dims=ParallelDims(tp=1, pp=1, cp=1, dp=8, sequence_parallel=False),
        overheads=OVERHEADS,
        engine=dataclasses.replace(ENGINE, gpu_memory_utilization=0.9),
    )
    report = plan_memory(inputs)
    assert report.reason.startswith("engine start phase needs")
    assert "vLLM refuses to start" in report.reason
    start = next(ph for ph in report.phases if ph.name == "engine start")
    s = report.stages[0]
    expected = s.weights + s.master + s.grads + 0.5 + 1.0 + 0.5 + 72.0
    assert math.isclose(start.peak, expected, rel_tol=1e-12)
