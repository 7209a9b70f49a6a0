"""Vocab-parallel linear_logprob on 2 gloo ranks against the single-process float64 reference.

The TP group is the world; each rank holds half of a V=1000 output layer (500 rows each,
as Megatron pads the vocabulary evenly) and the full hidden states. Logprob, entropy, the
(all-reduced) hidden gradient and each rank's weight-shard gradient must equal the
reference computed on the whole weight, to 1e-6 in float64 and 1e-5 in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from launch import run_distributed

from dapo_megatron.kernels import linear_logprob
from dapo_megatron.kernels.reference import linear_logprob_reference

pytestmark = pytest.mark.distributed

WORLD = 2
N, H, V = 67, 48, 1000
TOL = {torch.float64: 1e-6, torch.float32: 1e-5}


def _case(
    name: str,
    dtype: torch.dtype,
    *,
    chunk_size: int | None,
    temperature: float = 1.0,
    logit_scale: float = 3.0,
    entropy: bool = True,
    targets_on: str = "both",
    seed: int = 0,
) -> dict:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * (logit_scale / H**0.5)
    targets = torch.randint(0, V, (N,), generator=gen)
    if targets_on == "rank1":
        targets = targets % (V // 2) + V // 2
    elif targets_on == "argmax":
        targets = (hidden @ weight.T).argmax(dim=1)
    return dict(
        name=name,
        hidden=hidden.to(dtype),
        weight=weight.to(dtype),
        targets=targets,
        coef_lp=torch.randn(N, generator=gen, dtype=torch.float64),
        coef_ent=torch.randn(N, generator=gen, dtype=torch.float64) if entropy else None,
        chunk_size=chunk_size,
        temperature=temperature,
    )


CASES = [
    _case("fp64-chunk16-T0.7", torch.float64, chunk_size=16, temperature=0.7),
    _case("fp32-default-chunk", torch.float32, chunk_size=None, temperature=1.0, seed=1),
    _case("fp32-logprob-only", torch.float32, chunk_size=10, entropy=False, seed=2),
    _case("fp64-targets-on-rank1", torch.float64, chunk_size=30, targets_on="rank1", seed=3),
    _case(
        "fp64-logits-1e4-argmax",
        torch.float64,
        chunk_size=16,
        logit_scale=1e4,
        targets_on="argmax",
        seed=4,
    ),
]


def _forward_backward(
    case: dict, hidden: torch.Tensor, weight: torch.Tensor, **kwargs
) -> dict[str, torch.Tensor]:
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    entropy = case["coef_ent"] is not None
    lp, ent = kwargs.pop("fn")(
        hidden,
        weight,
        case["targets"],
        temperature=case["temperature"],
        compute_entropy=entropy,
        **kwargs,
    )
    loss = (case["coef_lp"].to(lp.dtype) * lp).sum()
    if entropy:
        loss = loss + (case["coef_ent"].to(ent.dtype) * ent).sum()
    loss.backward()
    out = {"lp": lp.detach(), "dH": hidden.grad, "dW": weight.grad}
    if entropy:
        out["ent"] = ent.detach()
    return out


def _tp_worker(cases: list[dict]) -> list[dict[str, torch.Tensor]]:
    """One rank: the chunked path on this rank's half of each case's vocabulary."""
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        results = []
        for case in cases:
            v_local = case["weight"].shape[0] // world
            shard = case["weight"][rank * v_local : (rank + 1) * v_local]
            results.append(
                _forward_backward(
                    case,
                    case["hidden"],
                    shard,
                    fn=linear_logprob,
                    vocab_start=rank * v_local,
                    tp_group=dist.group.WORLD,
                    chunk_size=case["chunk_size"],
                )
            )
        return results
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def per_rank() -> list[list[dict[str, torch.Tensor]]]:
    return run_distributed(_tp_worker, WORLD, CASES, timeout=120.0)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_matches_single_process_reference(index: int, per_rank: list) -> None:
    case = CASES[index]
    dtype = case["hidden"].dtype
    want = _forward_backward(
        case, case["hidden"].double(), case["weight"].double(), fn=linear_logprob_reference
    )
    v_local = V // WORLD
    for rank in range(WORLD):
        got = per_rank[rank][index]
        assert got.keys() == want.keys()
        assert got["lp"].dtype == dtype  # fp32 outputs for fp32, fp64 for fp64
        assert (got["lp"] <= 0).all()
        expected = dict(want, dW=want["dW"][rank * v_local : (rank + 1) * v_local])
        for key, value in expected.items():
            diff = (got[key].double() - value).abs().max().item()
            assert diff <= TOL[dtype], f"rank {rank} {key}: max |diff| {diff:.3g}"
    # Both ranks return the same logprobs and the same full hidden gradient.
    for key in ("lp", "dH"):
        torch.testing.assert_close(per_rank[0][index][key], per_rank[1][index][key], rtol=0, atol=0)


# ---------------------------------------------------------------------------------------
# Megatron pads the vocabulary to a multiple of 128 * TP: padded rows must stay out of the
# softmax (they hold whatever the optimizer left there), even when a whole shard is padding.

PADDED = [700, 400]  # real rows: rank 1 holds 200 real + 300 padding rows; then none at all


def _padded_worker(vocab_sizes: list[int]) -> list[dict[str, torch.Tensor]]:
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        results = []
        for vocab_size in vocab_sizes:
            case = _padded_case(vocab_size)
            v_local = V // world
            shard = case["weight"][rank * v_local : (rank + 1) * v_local]
            for reduce in (True, False):
                out = _forward_backward(
                    case,
                    case["hidden"],
                    shard,
                    fn=linear_logprob,
                    vocab_start=rank * v_local,
                    tp_group=dist.group.WORLD,
                    chunk_size=16,
                    vocab_size=vocab_size,
                    reduce_grad_hidden=reduce,
                )
                results.append(out)
        return results
    finally:
        dist.destroy_process_group()


def _padded_case(vocab_size: int) -> dict:
    case = _case(f"padded-{vocab_size}", torch.float64, chunk_size=16, seed=10 + vocab_size)
    case["weight"][vocab_size:] = 50.0  # garbage rows that would dominate a softmax
    case["targets"] = case["targets"] % vocab_size
    return case


def test_padded_vocabulary_rows_are_ignored() -> None:
    per_rank = run_distributed(_padded_worker, WORLD, PADDED, timeout=120.0)
    v_local = V // WORLD
    for i, vocab_size in enumerate(PADDED):
        case = _padded_case(vocab_size)
        want = _forward_backward(
            case, case["hidden"], case["weight"][:vocab_size], fn=linear_logprob_reference
        )
        full_dw = torch.cat([want["dW"], torch.zeros(V - vocab_size, H, dtype=torch.float64)])
        reduced = [per_rank[r][2 * i] for r in range(WORLD)]
        local = [per_rank[r][2 * i + 1] for r in range(WORLD)]
        for rank in range(WORLD):
            for key in ("lp", "ent", "dH"):
                torch.testing.assert_close(reduced[rank][key], want[key], rtol=0, atol=1e-9)
            dw = full_dw[rank * v_local : (rank + 1) * v_local]
            torch.testing.assert_close(reduced[rank]["dW"], dw, rtol=0, atol=1e-9)
        # Without the internal all-reduce each rank returns its part; the parts sum to dH.
        torch.testing.assert_close(local[0]["dH"] + local[1]["dH"], want["dH"], rtol=0, atol=1e-9)
        if vocab_size > v_local:  # both shards hold real rows: each part is partial
            assert not torch.allclose(local[0]["dH"], want["dH"])
        else:  # rank 1 is all padding and contributes nothing
            assert torch.count_nonzero(local[1]["dH"]) == 0
