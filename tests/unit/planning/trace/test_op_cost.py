"""The traced step's op costs (planning/trace/op_cost.py): FLOPs and bytes of aten ops by
hand, on real CPU tensors and nested inside a FakeTensorMode, and the analytic op count
of step_time.py against a real run of an equivalent tiny transformer."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from dapo_megatron.config.model_arch import ModelArch
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.planning.roofline import COMPUTE_CARDS, OpCosts
from dapo_megatron.planning.step_time import MicroBatch, StepInputs, stage_ops
from dapo_megatron.planning.trace.op_cost import OpCostMode, causal_attention_flops, kernel

H100 = COMPUTE_CARDS["H100 SXM"]


def test_one_gemm_by_hand_under_fake_tensors() -> None:
    # [8192, 4096] x [4096, 4096] in bf16: 2 m k n = 274.9 GFLOP; bytes (m k + k n + m n)
    # x 2 = (33554432 + 16777216 + 33554432) x 2 = 167772160. H100: 274877906944 / 989e12
    # = 277.9 us of compute against 167772160 / 3.35e12 = 50.1 us of HBM: compute-bound.
    m, k, n = 8192, 4096, 4096
    with FakeTensorMode():
        a = torch.empty(m, k, dtype=torch.bfloat16)
        b = torch.empty(k, n, dtype=torch.bfloat16)
        with OpCostMode() as mode:
            out = a @ b
        assert isinstance(out, FakeTensor)
    assert mode.ops.counts == {("aten.mm.default", 2 * m * k * n, 167772160): 1}
    assert mode.ops.flops == 274877906944
    assert mode.ops.roofline_s(H100) == pytest.approx(274877906944 / 989e12)
    assert mode.ops.roofline_s(H100) == pytest.approx(277.94e-6, rel=1e-4)


def test_no_real_data_is_read_under_fake_tensors() -> None:
    # 2^17 x 2^17 bf16 is 32 GiB per tensor: only a fake tensor of that size exists here.
    s = 2**17
    with FakeTensorMode():
        a = torch.empty(s, s, dtype=torch.bfloat16)
        with OpCostMode() as mode:
            (a + a).sum()
    assert mode.ops.by_op()["aten.add.Tensor"] == (1, 0, 3 * s * s * 2)
    assert mode.ops.by_op()["aten.sum.default"] == (1, 0, s * s * 2 + 2)


def test_memory_bound_op_by_hand() -> None:
    # An elementwise add of two [1024, 1024] fp32 tensors: 0 FLOPs, 3 x 4 MiB of traffic,
    # 12582912 / 3.35e12 = 3.756 us on an H100.
    x = torch.ones(1024, 1024)
    with OpCostMode() as mode:
        x + x
    assert mode.ops.counts == {("aten.add.Tensor", 0, 12582912): 1}
    assert mode.ops.roofline_s(H100) == pytest.approx(12582912 / 3.35e12)


def test_views_empty_tensors_and_allocations_are_not_counted() -> None:
    x = torch.ones(64, 32)
    with OpCostMode() as mode:
        x.t()
        x.view(32, 64)
        x[:8]
        torch.empty(1000)
        torch.ones(0, 5) @ torch.ones(5, 3)  # zero-size: no traffic
    # torch.ones of a non-empty shape writes: only that fill is counted.
    assert [k[0] for k in mode.ops.counts] == ["aten.ones.default"]
    assert mode.ops.bytes == 5 * 3 * 4


def test_a_copy_destination_is_written_not_read() -> None:
    dst, src = torch.empty(256), torch.ones(256)
    with OpCostMode() as mode:
        dst.copy_(src)
    assert mode.ops.counts == {("aten.copy_.default", 0, 2 * 256 * 4): 1}


def test_causal_attention_counts_half_the_square() -> None:
    # b=2, heads 4, s 64, d 16: torch's formula counts QK^T and PV in full, 2 x 2 b h s^2 d;
    # causal flash skips the masked half: 2 b h s^2 d = 1048576. Backward: five products of
    # the same size (S recomputed, dP, dV, dQ, dK), halved: 2.5x the forward.
    b, h, s, d = 2, 4, 64, 16
    q = torch.randn(b, h, s, d, requires_grad=True)
    with OpCostMode() as causal:
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    with OpCostMode() as full:
        F.scaled_dot_product_attention(q, q, q).sum().backward()
    fwd = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    bwd = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
    assert causal.ops.by_op()[fwd][1] == 2 * b * h * s * s * d == 1048576
    assert causal.ops.by_op()[bwd][1] == 5 * b * h * s * s * d
    assert full.ops.by_op()[fwd][1] == 2 * causal.ops.by_op()[fwd][1]


def test_linear_forward_backward_by_hand() -> None:
    # [16, 64] x [64, 32]: forward, data gradient and weight gradient, 2 x 16 x 64 x 32 =
    # 65536 FLOPs each; each reads/writes 16x64 + 64x32 + 16x32 fp32 elements = 14336 B.
    lin = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(16, 64, requires_grad=True)
    with OpCostMode() as mode:
        lin(x).sum().backward()
    assert mode.ops.by_op()["aten.mm.default"] == (3, 3 * 65536, 3 * 14336)


# ---------------------------------------------------------------------------------------
# The analytic count against a real run


ARCH = ModelArch(
    "llama",
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=96,
    num_attention_heads=4,
    num_query_groups=2,
    vocab_size=128,
    max_position_embeddings=512,
    rope_theta=10000.0,
    norm_epsilon=1e-6,
    tie_word_embeddings=False,
    add_qkv_bias=False,
)


class _Layer(torch.nn.Module):
    """A Llama layer as Megatron computes it (RMSNorm, fused QKV, GQA expanded to the query
    heads, causal flash attention, SwiGLU with a fused gate/up GEMM); no RoPE (it has no
    FLOPs to count)."""

    def __init__(self, a: ModelArch) -> None:
        super().__init__()
        h, self.kv = a.hidden_size, a.num_query_groups * a.head_dim
        self.a = a
        self.norm1, self.norm2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
        self.qkv = torch.nn.Linear(h, a.query_width + 2 * self.kv, bias=False)
        self.proj = torch.nn.Linear(a.query_width, h, bias=False)
        self.fc1 = torch.nn.Linear(h, 2 * a.ffn_hidden_size, bias=False)
        self.fc2 = torch.nn.Linear(a.ffn_hidden_size, h, bias=False)

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        a, (b, s, _) = self.a, x_BSH.shape
        q, k, v = self.qkv(self.norm1(x_BSH)).split([a.query_width, self.kv, self.kv], -1)
        heads, groups, d = a.num_attention_heads, a.num_query_groups, a.head_dim
        q = q.view(b, s, heads, d).transpose(1, 2)
        k = k.view(b, s, groups, d).transpose(1, 2).repeat_interleave(heads // groups, 1)
        v = v.view(b, s, groups, d).transpose(1, 2).repeat_interleave(heads // groups, 1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x_BSH = x_BSH + self.proj(o.transpose(1, 2).reshape(b, s, a.query_width))
        gate, up = self.fc1(self.norm2(x_BSH)).chunk(2, -1)
        return x_BSH + self.fc2(F.silu(gate) * up)


def _tiny_model(a: ModelArch) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Embedding(a.vocab_size, a.hidden_size),
        *[_Layer(a) for _ in range(a.num_layers)],
        torch.nn.RMSNorm(a.hidden_size),
        torch.nn.Linear(a.hidden_size, a.vocab_size, bias=False),
    )


def _inputs(a: ModelArch) -> StepInputs:
    return StepInputs(
        arch=a,
        dims=ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False),
        precision_bytes=4,
        recompute="none",
        distributed_optimizer=False,
        gpus_per_node=1,
        num_nodes=1,
        mean_seq_len=32,
        train_rows=4,
        optimizer_steps=1,
        step_rows=4,
        packed_tokens=None,
        micro_batch_size=4,
        logprob_micro_batch_size=4,
        logprob_passes=0,
        engine_tp=1,
        colocated=True,
    )


TOLERANCE = 1e-3
"""The two FLOP counts agree to 0.1 %: every FLOP of this model is in a GEMM or the
attention kernel, which both sides count exactly (the analytic side rounds per op)."""


@pytest.mark.parametrize("train", [True, False])
def test_analytic_flops_match_a_real_run(train: bool) -> None:
    torch.manual_seed(0)
    b, s = 3, 32  # three sequences of 32 tokens: n = 96, attention span s = 32
    model = _tiny_model(ARCH)
    tokens = torch.randint(0, ARCH.vocab_size, (b, s))
    with OpCostMode() as mode:
        if train:
            model(tokens).float().logsumexp(-1).sum().backward()
        else:
            with torch.no_grad():
                model(tokens)
    analytic = stage_ops(_inputs(ARCH), MicroBatch(n=b * s, s=s), 0, train=train)
    measured = mode.ops.flops
    assert measured > 0
    assert math.isclose(analytic.flops, measured, rel_tol=TOLERANCE), (analytic.flops, measured)
    # The GEMMs alone, by hand for the forward: per layer 2 n h [(q + 2kv) + q] + 2 n h 3f,
    # the head 2 n h V; backward twice that (the embedding's table has no GEMM).
    n, h, f, v = b * s, 64, 96, 128
    layer = 2 * n * h * ((64 + 2 * 32) + 64) + 2 * n * h * 3 * f
    gemms = (2 * layer + 2 * n * h * v) * (3 if train else 1)
    assert mode.ops.by_op()["aten.mm.default"][1] == gemms


def test_the_comparison_can_fail() -> None:
    # The same model with twice the attention span: the analytic count at the old span
    # must miss the measured one by more than the tolerance.
    torch.manual_seed(0)
    model = _tiny_model(ARCH)
    with OpCostMode() as mode:
        model(torch.randint(0, ARCH.vocab_size, (1, 192))).sum().backward()
    wrong = stage_ops(_inputs(ARCH), MicroBatch(n=192, s=96), 0, train=True)
    right = stage_ops(_inputs(ARCH), MicroBatch(n=192, s=192), 0, train=True)
    assert math.isclose(right.flops, mode.ops.flops, rel_tol=TOLERANCE)
    assert not math.isclose(wrong.flops, mode.ops.flops, rel_tol=TOLERANCE)


class _StandIn(torch.autograd.Function):
    """A kernel stand-in as the tracer's: zeros out, its cost declared (forward and
    backward)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor) -> torch.Tensor:
        with kernel("attention", 1000, 64):
            return torch.zeros_like(q)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        with kernel("attention bwd", 2500, 128):
            return torch.zeros_like(grad)


def test_a_stand_in_kernel_records_its_declared_cost_only() -> None:
    q = torch.ones(4, 4, requires_grad=True)
    with OpCostMode() as mode:
        _StandIn.apply(q).sum().backward()
    costs = mode.ops.by_op()
    assert costs["attention"] == (1, 1000, 64)
    assert costs["attention bwd"] == (1, 2500, 128)
    assert "aten.zeros_like.default" not in costs  # the stand-in's allocations
    assert "aten.sum.default" in costs  # ops outside it still count
    with kernel("attention", 1, 1):  # no mode active: nothing to record, no error
        pass


def test_causal_attention_flops_over_packed_sequences() -> None:
    # Two sequences of 100 and 300 tokens, 8 heads of 64: 2 x (100^2 + 300^2) x 8 x 64.
    assert causal_attention_flops([100, 300], 8, 64) == 2 * 100000 * 512 == 102400000
    assert causal_attention_flops([100, 300], 8, 64, cp=2) == 51200000


def test_op_costs_round_trip_through_json() -> None:
    with OpCostMode() as mode:
        torch.ones(8, 8) @ torch.ones(8, 8)
    rows = json.loads(json.dumps(mode.ops.to_rows()))
    assert OpCosts.from_rows(rows) == mode.ops


def test_a_batched_matmul_is_its_gemm_only() -> None:
    # [4, 6, 8] @ [8, 5]: torch folds the batch (a view), runs one mm of [24, 8] x [8, 5]
    # and reshapes its result with _unsafe_view (an alias the schema does not mark):
    # 2 x 24 x 8 x 5 = 1920 FLOPs, (192 + 40 + 120) x 4 = 1408 bytes.
    x, w = torch.ones(4, 6, 8), torch.ones(8, 5)
    with OpCostMode() as mode:
        x @ w
    assert mode.ops.counts == {("aten.mm.default", 1920, 1408): 1}
