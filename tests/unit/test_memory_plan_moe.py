"""The memory plan of Qwen3 and Qwen3-MoE: q width, q/k norms, experts, EP, routed tokens.

Hand-derived bytes for tiny-qwen3-moe at EP1 and EP2, the engine's weights against the
published parameter counts, the refit's largest tensors, and dapo-plan's MoE rows. The
split of every rank's parameters against the published counts is in test_memory_plan.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dapo_megatron.cli import plan_main
from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.refit_transport import RefitTransport
from dapo_megatron.planning.memory import plan_memory
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
    stage_memory,
)
from dapo_megatron.planning.refit_memory import (
    MIB,
    RefitInputs,
    largest_gathered_parameter,
    largest_hf_tensor,
)

REPO = Path(__file__).resolve().parents[2]
MOE_RECIPES = sorted((REPO / "recipes").glob("dapo-qwen3-30b-a3b-*.yaml"))
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
    for ep in (1, 2):  # balanced routing: a rank's experts see n k copies at any EP
        s = stage_memory(_moe_inputs(ep), 0)
        assert s.activations * GIB == 3 * 124928 + 8192
        assert s.expert_activations * GIB == 3 * 42496
    full = stage_memory(_moe_inputs(2, recompute="full"), 0)
    # Full recompute: only the layer inputs n p h = 8192 are saved; the working set remains.
    assert full.activations * GIB == 2 * 8192 + 124928 + 8192
    assert full.expert_activations * GIB == 42496


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
