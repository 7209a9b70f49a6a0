"""The fused Triton kernels (under the CPU interpreter) against the float64 reference.

``tests/kernels/conftest.py`` sets ``TRITON_INTERPRET=1``, so the kernels run on CPU tensors
(slowly: shapes are small and the blocks large). Every check compares with
``linear_logprob_reference`` in float64 on the same input values, gradients from autograd.
Shapes have ragged tails (N=67, H=96, V=1000 against 128 x 256 x 128 interpreter blocks).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

triton = pytest.importorskip("triton")

# The gloo process launcher lives with the distributed tests; spawned ranks inherit sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from launch import run_distributed  # noqa: E402

from dapo_megatron.kernels import linear_logprob  # noqa: E402
from dapo_megatron.kernels.reference import linear_logprob_reference  # noqa: E402
from dapo_megatron.kernels.triton_logprob import triton_linear_logprob  # noqa: E402

N, H, V = 67, 96, 1000
WORLD = 2


def _inputs(*, dtype: torch.dtype = torch.float32, logit_scale: float = 3.0, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * (logit_scale / H**0.5)
    return dict(
        hidden=hidden.to(dtype),
        weight=weight.to(dtype),
        targets=torch.randint(0, V, (N,), generator=gen),
        coef_lp=torch.randn(N, generator=gen, dtype=torch.float64),
        coef_ent=torch.randn(N, generator=gen, dtype=torch.float64),
    )


def _run(
    fn, case: dict, hidden: torch.Tensor, weight: torch.Tensor, *, entropy: bool = True, **kw
) -> dict[str, torch.Tensor]:
    """Forward + backward of ``sum(a * lp + b * ent)``; returns outputs and input grads."""
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    lp, ent = fn(hidden, weight, case["targets"], compute_entropy=entropy, **kw)
    loss = (case["coef_lp"].to(lp.dtype) * lp).sum()
    if entropy:
        loss = loss + (case["coef_ent"].to(ent.dtype) * ent).sum()
    loss.backward()
    out = {"lp": lp.detach(), "dH": hidden.grad, "dW": weight.grad}
    if entropy:
        out["ent"] = ent.detach()
    return out


def _reference(case: dict, *, entropy: bool = True, **kw) -> dict[str, torch.Tensor]:
    return _run(
        linear_logprob_reference,
        case,
        case["hidden"].double(),
        case["weight"].double(),
        entropy=entropy,
        **kw,
    )


def _max_errors(got: dict, want: dict) -> dict[str, float]:
    assert got.keys() == want.keys()
    return {k: (got[k].double() - want[k]).abs().max().item() for k in want}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy", [True, False])
def test_float32_matches_reference(temperature: float, entropy: bool) -> None:
    case = _inputs(seed=int(temperature * 10))
    got = _run(
        linear_logprob,
        case,
        case["hidden"],
        case["weight"],
        entropy=entropy,
        temperature=temperature,
        impl="triton",
    )
    assert got["lp"].dtype == torch.float32
    assert (got["lp"] <= 0).all()
    errors = _max_errors(got, _reference(case, entropy=entropy, temperature=temperature))
    # The chunked path reaches the same ~1e-5 on these inputs (fp32 logits of size ~10).
    assert max(errors.values()) <= 2e-5, errors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_blocks_cover_every_loop_and_tail(dtype: torch.dtype) -> None:
    # 16 x 128 x 64 tiles: 5 token blocks, 8 vocab blocks (a 104-wide tail), 2 hidden blocks
    # (a 32-wide tail), in every kernel (the backward GEMMs use the same tiles); the default
    # interpreter tiles cover N and H in one block each.
    case = _inputs(dtype=dtype, seed=9)
    got = _run(
        triton_linear_logprob,
        case,
        case["hidden"],
        case["weight"],
        temperature=1.3,
        vocab_start=0,
        tp_group=None,
        blocks=(16, 128, 64),
    )
    want = _reference(case, temperature=1.3)
    errors = _max_errors(got, want)
    if dtype == torch.float32:
        assert max(errors.values()) <= 2e-5, errors
    else:
        for key in ("dH", "dW"):
            assert errors[key] <= 2e-2 * want[key].abs().max(), errors
        assert max(errors["lp"], errors["ent"]) <= 1e-4, errors


@pytest.mark.parametrize("entropy", [True, False])
def test_backward_in_vocab_chunks_is_exact_and_deterministic(entropy: bool) -> None:
    # 384-column dz chunks: 3 chunks (the last 232 wide and not a multiple of BLOCK_V), so dH
    # accumulates over chunks and each chunk writes its own rows of dW; the forward runs 2
    # vocab splits (the interpreter's), combined in torch.
    case = _inputs(seed=11)
    kw = dict(temperature=1.1, vocab_start=0, tp_group=None, entropy=entropy, vocab_chunk=384)
    first = _run(triton_linear_logprob, case, case["hidden"], case["weight"], **kw)
    errors = _max_errors(first, _reference(case, entropy=entropy, temperature=1.1))
    assert max(errors.values()) <= 2e-5, errors
    again = _run(triton_linear_logprob, case, case["hidden"], case["weight"], **kw)
    for key in ("dH", "dW"):
        assert torch.equal(first[key], again[key]), key


def test_forward_split_combine_matches_one_split() -> None:
    from dapo_megatron.kernels.triton_logprob import _combine_splits

    # Partial statistics of 3 vocab ranges (one empty: m = -1e30, zero sums) against the
    # statistics of the whole range, computed in float64.
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(5, 40, generator=gen, dtype=torch.float64) * 4
    parts = []
    for lo, hi in ((0, 25), (25, 40), (40, 40)):
        zs = z[:, lo:hi]
        m = zs.amax(dim=1) if hi > lo else torch.full((5,), -1e30, dtype=torch.float64)
        e = torch.exp(zs - m[:, None])
        # The target is column 0, in the first range.
        target = z[:, 0] if lo == 0 else torch.zeros(5, dtype=torch.float64)
        parts.append(torch.stack([m, e.sum(1), (e * (zs - m[:, None])).sum(1), target]))
    m, s, sz, zt = _combine_splits(torch.stack(parts, dim=1).float())
    e = torch.exp(z - z.amax(dim=1, keepdim=True))
    torch.testing.assert_close(m.double(), z.amax(dim=1))
    torch.testing.assert_close(s.double(), e.sum(1), rtol=1e-6, atol=0)
    want_sz = (e * (z - z.amax(dim=1, keepdim=True))).sum(1)
    torch.testing.assert_close(sz.double(), want_sz, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(zt.double(), z[:, 0])


def test_same_numbers_as_chunked() -> None:
    case = _inputs(seed=3)
    kw = dict(temperature=0.9)
    got = _run(linear_logprob, case, case["hidden"], case["weight"], impl="triton", **kw)
    chunked = _run(linear_logprob, case, case["hidden"], case["weight"], impl="chunked", **kw)
    for key in got:
        torch.testing.assert_close(got[key], chunked[key], rtol=1e-5, atol=1e-5)


def test_large_logits_are_finite_and_bounded() -> None:
    # Logits of size ~1e4 (the scale at which lse - E[z] loses the entropy to cancellation).
    case = _inputs(logit_scale=1e4, seed=5)
    case["targets"] = (case["hidden"].double() @ case["weight"].double().T).argmax(dim=1)
    got = _run(linear_logprob, case, case["hidden"], case["weight"], impl="triton")
    for value in got.values():
        assert torch.isfinite(value).all()
    assert (got["lp"] <= 0).all() and (got["ent"] >= 0).all()
    want = _reference(case)
    # Relative to the logit scale: fp32 logits of 1e4 carry ~1e-3 absolute rounding.
    assert (got["lp"].double() - want["lp"]).abs().max() <= 1e-2
    assert (got["ent"].double() - want["ent"]).abs().max() <= 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype: torch.dtype) -> None:
    # The reference runs on the same (rounded) input values in float64. Backward rounds dz to
    # the input dtype for the tensor-core dots (and the interpreter truncates bf16 rather than
    # rounding), so gradients are compared relative to their scale.
    case = _inputs(dtype=dtype, seed=6)
    got = _run(linear_logprob, case, case["hidden"], case["weight"], impl="triton")
    want = _reference(case)
    assert got["lp"].dtype == torch.float32 and got["dH"].dtype == dtype
    assert (got["lp"] <= 0).all()
    for key in ("lp", "ent"):
        assert (got[key].double() - want[key]).abs().max() <= 1e-4, key
    for key in ("dH", "dW"):
        scale = want[key].abs().max()
        assert (got[key].double() - want[key]).abs().max() <= 2e-2 * scale, key


def test_padded_rows_and_partial_gradients() -> None:
    case = _inputs(seed=7)
    vocab_size = 700
    case["weight"][vocab_size:] = 50.0  # padding rows that would dominate a softmax
    case["targets"] = case["targets"] % vocab_size
    hidden = case["hidden"].detach().clone().requires_grad_()
    # No weight gradient requested: the kernel skips the dW dots.
    lp, _ = linear_logprob(
        hidden, case["weight"], case["targets"], impl="triton", vocab_size=vocab_size
    )
    (case["coef_lp"].float() * lp).sum().backward()
    want = _reference(dict(case, weight=case["weight"][:vocab_size]), entropy=False)
    assert (lp.detach().double() - want["lp"]).abs().max() <= 2e-5
    assert (hidden.grad.double() - want["dH"]).abs().max() <= 2e-5


def test_empty_batch_and_auto_on_cpu_stays_chunked() -> None:
    hidden = torch.zeros(0, H)
    lp, ent = linear_logprob(
        hidden, torch.randn(V, H), torch.zeros(0, dtype=torch.long), compute_entropy=True,
        impl="triton",
    )  # fmt: skip
    assert lp.shape == ent.shape == (0,)
    from dapo_megatron.kernels.dispatch import _resolve_impl

    assert _resolve_impl("auto", torch.zeros(1, H)) == "chunked"


def test_triton_rejects_float64() -> None:
    case = _inputs(dtype=torch.float64)
    with pytest.raises(ValueError, match="impl='triton'"):
        linear_logprob(case["hidden"], case["weight"], case["targets"], impl="triton")


# ---------------------------------------------------------------------------------------
# Vocab parallel: 2 gloo ranks, each with half of the output layer, equal to one process.


def _tp_worker(case: dict, vocab_size: int | None) -> list[dict[str, torch.Tensor]]:
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        v_local = case["weight"].shape[0] // world
        shard = case["weight"][rank * v_local : (rank + 1) * v_local]
        return [
            _run(
                linear_logprob,
                case,
                case["hidden"],
                shard,
                temperature=0.8,
                vocab_start=rank * v_local,
                tp_group=dist.group.WORLD,
                impl="triton",
                vocab_size=vocab_size,
                reduce_grad_hidden=reduce,
            )
            for reduce in (True, False)
        ]
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize("vocab_size", [None, 400], ids=["full", "rank1-all-padding"])
def test_vocab_parallel_matches_single_process(vocab_size: int | None) -> None:
    case = _inputs(seed=8)
    if vocab_size is not None:
        case["weight"][vocab_size:] = 50.0
        case["targets"] = case["targets"] % vocab_size
    per_rank = run_distributed(_tp_worker, WORLD, case, vocab_size, timeout=120.0)
    real = V if vocab_size is None else vocab_size
    want = _reference(dict(case, weight=case["weight"][:real]), temperature=0.8)
    full_dw = torch.cat([want["dW"], torch.zeros(V - real, H, dtype=torch.float64)])
    v_local = V // WORLD
    for rank in range(WORLD):
        got = per_rank[rank][0]
        expected = dict(want, dW=full_dw[rank * v_local : (rank + 1) * v_local])
        errors = _max_errors(got, expected)
        assert max(errors.values()) <= 2e-5, (rank, errors)
        assert (got["lp"] <= 0).all()
    # Without the internal all-reduce each rank returns its part; the parts sum to dH.
    partial = per_rank[0][1]["dH"] + per_rank[1][1]["dH"]
    assert (partial.double() - want["dH"]).abs().max() <= 2e-5
    torch.testing.assert_close(per_rank[0][0]["lp"], per_rank[1][0]["lp"], rtol=0, atol=0)
