"""Packed sequences (THD) on CPU: ``ContextParallelAttention`` and the whole GPTModel.

Three sequences of 5, 11 and 8 real tokens, each padded to a multiple of ``2 * cp``
(times ``tp`` under sequence parallelism) with random tokens, are packed into one row
``[1, T]`` with ``cu_seqlens`` (global, padded) and split over CP ranks with
``split_packed_for_context_parallel``. For TP1 CP1, TP2+SP, CP2 and TP2+SP x CP2:

* every real token's logits (vocab and CP gathered) equal those of its sequence run
  alone, unpacked and padded to the same length, through the same model, and the
  parameter gradients of a loss over the real tokens equal the sum of the per-sequence
  gradients;
* changing the tokens of sequence 2 leaves the outputs of sequences 1 and 3 bit-identical;
* the core attention alone (``ContextParallelAttention`` with THD params) matches a
  float64 per-sequence causal attention written out by hand, outputs and q/k/v grads.

Layouts without processes and the refusals (bad lengths, ``max_seqlen == T``, mismatched
packings) are checked too. Megatron is imported inside the rank functions only.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from launch import run_distributed
from megatron_setup import hf_arch, megatron_model, tiny_hf_checkpoint
from test_context_parallel import _gather_vocab, _hf_configs

from dapo_megatron.config.model_arch import ModelArch
from dapo_megatron.config.parallel import ParallelDims

pytestmark = pytest.mark.distributed

REAL_LENGTHS = (5, 11, 8)
# Logits of magnitude ~10: at CP1 the packed attention batches sequences of one length
# bucket with padded keys, which reorders fp32 sums (relative error ~1e-7). The logprob
# bound of 1e-6 is asserted in test_packed_policy_step.py.
LOGITS_ATOL = 5e-6
GRAD_ATOL = 1e-5
ATTENTION_ATOL = 1e-6
# q/k/v grads are sums over up to 17 keys/queries of O(1) terms in fp32.
ATTENTION_GRAD_ATOL = 5e-6


# ------------------------------------------------------------------- layout (no processes)


def test_packed_index_matches_hand_made_layout() -> None:
    from dapo_megatron.megatron.context_parallel import (
        packed_cp_index,
        split_packed_for_context_parallel,
    )

    # Sequence 0: 4 tokens (chunks of 1), sequence 1: 8 tokens (chunks of 2) at CP2.
    assert packed_cp_index([0, 4, 12], 0, 2).tolist() == [0, 3, 4, 5, 10, 11]
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)
    assert packed_cp_index(cu, 1, 2).tolist() == [1, 2, 6, 7, 8, 9]
    assert packed_cp_index([0, 3, 10], 0, 1).tolist() == list(range(10))
    tokens = torch.arange(100, 112).view(1, 12)
    assert split_packed_for_context_parallel(
        tokens, [0, 4, 12], seq_dim=1, cp_rank=1, cp_size=2
    ).tolist() == [[101, 102, 106, 107, 108, 109]]
    assert (
        split_packed_for_context_parallel(tokens, [0, 4, 12], seq_dim=1, cp_rank=0, cp_size=1)
        is tokens
    )
    every = torch.cat([packed_cp_index([0, 6, 6, 18, 30], r, 3) for r in range(3)])
    assert sorted(every.tolist()) == list(range(30))


def test_packed_split_rejects_bad_layouts() -> None:
    from dapo_megatron.megatron.context_parallel import split_packed_for_context_parallel

    with pytest.raises(ValueError, match="packed sequence 1 .* sequence length 6 .* = 4"):
        split_packed_for_context_parallel(
            torch.zeros(1, 10), [0, 4, 10], seq_dim=1, cp_rank=0, cp_size=2
        )
    with pytest.raises(ValueError, match="cu_seqlens ends at 8"):
        split_packed_for_context_parallel(
            torch.zeros(1, 10), [0, 8], seq_dim=1, cp_rank=0, cp_size=2
        )
    with pytest.raises(ValueError, match="non-decreasing"):
        split_packed_for_context_parallel(
            torch.zeros(1, 8), [0, 6, 4, 8], seq_dim=1, cp_rank=0, cp_size=1
        )


# ------------------------------------------------------------- RoPE and buckets (no processes)


class _FakeGroup:
    """What the THD RoPE reads from a CP group: its size and this rank."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


ROPE_CASES = {
    # name: (padded lengths, cp, rot_dim of head 16, interleaved, mla, mscale, dtype, offsets)
    "cp1": ((6, 1, 13, 0, 9), 1, 16, False, False, 1.0, torch.float32, False),
    "cp1-interleaved-partial": ((6, 1, 13, 9), 1, 8, True, False, 1.0, torch.float32, False),
    "cp2": ((8, 4, 12, 0, 4), 2, 16, False, False, 1.0, torch.float32, False),
    "cp2-mla-mscale-bf16": ((8, 4, 12), 2, 16, False, True, 0.7, torch.bfloat16, False),
    "cp3": ((6, 18, 12), 3, 16, False, False, 1.0, torch.float32, False),
    "offsets": ((5, 7, 4), 1, 16, False, False, 1.0, torch.float32, True),
    "offsets-cp2": ((4, 8, 4), 2, 16, False, False, 1.0, torch.float32, True),
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_vectorised_thd_rope_is_megatrons_bit_for_bit(case: str) -> None:
    from dapo_megatron.megatron import rope_thd

    lengths, cp, rot_dim, interleaved, mla, mscale, dtype, offsets = ROPE_CASES[case]
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    # Megatron reads a table of exactly T rows as positions offset by each sequence's start.
    rows = total if offsets else max(lengths) + 3
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    angles = torch.outer(torch.arange(rows, dtype=torch.float32), inv)
    freqs = torch.cat([angles, angles], dim=-1)[:, None, None, :]
    gen = torch.Generator().manual_seed(len(case))
    for rank in range(cp):
        group = _FakeGroup(cp, rank)
        t = torch.randn(total // cp, 3, 16, generator=gen).to(dtype)
        args = dict(
            rotary_interleaved=interleaved,
            multi_latent_attention=mla,
            mscale=mscale,
            cp_group=group,
        )
        expected = rope_thd.MEGATRON_APPLY_ROTARY_POS_EMB_THD(t, cu, freqs, **args)
        got = rope_thd.apply_rotary_pos_emb_thd(t, cu, freqs, **args)
        assert got.dtype == expected.dtype and torch.equal(got, expected), case
        # Second call on the same pack and table: served from the cache, still equal.
        assert torch.equal(rope_thd.apply_rotary_pos_emb_thd(t, cu, freqs, **args), expected)


def test_thd_rope_cache_follows_the_table_and_the_pack() -> None:
    from megatron.core.models.common.embeddings import rope_utils

    from dapo_megatron.megatron import rope_thd

    group = _FakeGroup(1, 0)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    t = torch.randn(8, 2, 4)
    freqs = torch.rand(10, 1, 1, 4)
    first = rope_thd.apply_rotary_pos_emb_thd(t, cu, freqs, cp_group=group)
    # A new table (another tensor, e.g. another max_seqlen) and a new packing recompute.
    other = freqs * 2
    assert torch.equal(
        rope_thd.apply_rotary_pos_emb_thd(t, cu, other, cp_group=group),
        rope_thd.MEGATRON_APPLY_ROTARY_POS_EMB_THD(t, cu, other, cp_group=group),
    )
    repacked = torch.tensor([0, 5, 8], dtype=torch.int32)
    assert torch.equal(
        rope_thd.apply_rotary_pos_emb_thd(t, repacked, freqs, cp_group=group),
        rope_thd.MEGATRON_APPLY_ROTARY_POS_EMB_THD(t, repacked, freqs, cp_group=group),
    )
    # cu_seqlens changed in place: its version counter invalidates the cached boundaries.
    cu[1] = 5
    assert torch.equal(
        rope_thd.apply_rotary_pos_emb_thd(t, cu, freqs, cp_group=group),
        rope_thd.MEGATRON_APPLY_ROTARY_POS_EMB_THD(t, cu, freqs, cp_group=group),
    )
    assert not torch.equal(first, rope_thd.apply_rotary_pos_emb_thd(t, cu, freqs, cp_group=group))
    # Gradients flow to t as through Megatron's function.
    x = t.clone().requires_grad_(True)
    rope_thd.apply_rotary_pos_emb_thd(x, cu, freqs, cp_group=group).square().sum().backward()
    y = t.clone().requires_grad_(True)
    rope_thd.MEGATRON_APPLY_ROTARY_POS_EMB_THD(
        y, cu, freqs, cp_group=group
    ).square().sum().backward()
    assert torch.equal(x.grad, y.grad)
    rope_thd.install()
    assert rope_utils._apply_rotary_pos_emb_thd is rope_thd.apply_rotary_pos_emb_thd
    with pytest.raises(ValueError, match="cp_group must be provided"):
        rope_thd.apply_rotary_pos_emb_thd(t, cu, freqs)


def test_attention_buckets_cover_every_packed_token_once() -> None:
    from dapo_megatron.megatron.thd_buckets import thd_buckets

    bounds = (0, 3, 3, 11, 12, 20, 37)  # lengths 3, 0, 8, 1, 8, 17
    plan = thd_buckets(bounds, torch.device("cpu"))
    assert [tuple(b.index.shape) for b in plan.buckets] == [(3, 1), (8, 2), (1, 1), (17, 1)]
    flat = torch.cat([b.index.reshape(-1) for b in plan.buckets])
    # The inverse picks, for each packed position, the bucket row holding that very token.
    assert torch.equal(flat[plan.inverse], torch.arange(37))
    assert plan.buckets[1].causal_mask.tolist()[0] == [False] + [True] * 7
    assert thd_buckets(bounds, torch.device("cpu")) is plan  # one plan per pack


# ------------------------------------------------------------------------ model checks


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    hf_dir: str
    arch: ModelArch


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    """The tiny Qwen2 (q/k/v bias, tied, GQA 2) and Llama (llama3 rope, GQA 4) of
    test_context_parallel.py, every weight random."""
    root = tmp_path_factory.mktemp("hf")
    result = {}
    for i, (family, config) in enumerate(_hf_configs().items()):
        _, arch = tiny_hf_checkpoint(root / family, config, seed=200 + i)
        result[family] = Checkpoint(str(root / family), arch)
    return result


def _pad_multiple(dims: ParallelDims) -> int:
    return 2 * dims.cp * (dims.tp if dims.sequence_parallel else 1)


def _padded_lengths(dims: ParallelDims) -> list[int]:
    m = _pad_multiple(dims)
    return [-(-n // m) * m for n in REAL_LENGTHS]


def _packed_params(cu: torch.Tensor, max_len: int) -> object:
    from megatron.core.packed_seq_params import PackedSeqParams

    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=max_len,
        max_seqlen_kv=max_len,
    )


def _sequences(vocab: int, padded: list[int], seed: int) -> list[torch.Tensor]:
    """Random tokens for each sequence, padded (with random tokens) to its padded length."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in padded]


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameter grads summed over the CP group (what DDP over dp x cp does) and, for the
    norms under SP, over TP (finalize_model_grads: each TP rank saw only its sequence
    shard, and packing changes which tokens those are), then zeroed."""
    from megatron.core import parallel_state

    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad.clone()
        torch.distributed.all_reduce(grad, group=parallel_state.get_context_parallel_group())
        if getattr(param, "sequence_parallel", False):
            torch.distributed.all_reduce(
                grad, group=parallel_state.get_tensor_model_parallel_group()
            )
        grads[name] = grad
        param.grad = None
    return grads


def _model_diffs(ckpt: Checkpoint, dims: ParallelDims) -> dict[str, float]:
    """Packed vs one-sequence-at-a-time logits and grads, and the isolation check."""
    from megatron.core import parallel_state

    from dapo_megatron.megatron.context_parallel import (
        gather_from_context_parallel,
        gather_packed_from_context_parallel,
        split_for_context_parallel,
        split_packed_for_context_parallel,
    )
    from dapo_megatron.megatron.model import padded_vocab_size

    model = megatron_model(ckpt.hf_dir, ckpt.arch, dims, "fp32", packed=True)
    cp_rank = parallel_state.get_context_parallel_rank()
    cp_group = parallel_state.get_context_parallel_group()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    padded_vocab = padded_vocab_size(ckpt.arch.vocab_size, dims.tp)

    padded = _padded_lengths(dims)
    bounds = [0]
    for n in padded:
        bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int32)
    params = _packed_params(cu, max(padded))
    seqs = _sequences(ckpt.arch.vocab_size, padded, seed=7)
    # Loss weights on real tokens only, [T, padded_vocab] (zero on padding rows/columns).
    gen = torch.Generator().manual_seed(8)
    weight = torch.zeros(bounds[-1], padded_vocab)
    for start, n in zip(bounds, REAL_LENGTHS, strict=False):
        weight[start : start + n, : ckpt.arch.vocab_size] = torch.randn(
            n, ckpt.arch.vocab_size, generator=gen
        ) / sum(REAL_LENGTHS)
    weight_shards = weight.chunk(dims.tp, dim=-1)[tp_rank]

    def packed_forward(tokens: list[torch.Tensor], backward: bool) -> torch.Tensor:
        input_ids = torch.cat(tokens).view(1, -1)
        positions = torch.cat([torch.arange(n) for n in padded]).view(1, -1)

        def split(t: torch.Tensor) -> torch.Tensor:
            return split_packed_for_context_parallel(
                t, cu, seq_dim=1, cp_rank=cp_rank, cp_size=dims.cp
            )

        local = model(split(input_ids), split(positions), None, packed_seq_params=params)
        if backward:
            (local[0] * split(weight_shards.unsqueeze(0))[0]).sum().backward()
        full = _gather_vocab(local.detach())  # [1, T/cp, V]
        return gather_packed_from_context_parallel(full, cu, seq_dim=1, group=cp_group)[0]

    packed_logits = packed_forward(seqs, backward=True)
    packed_grads = _grads(model)

    # Each sequence alone, unpacked, padded to the same length.
    single_logits = []
    single_grads: dict[str, torch.Tensor] = {}
    for i, tokens in enumerate(seqs):
        n = padded[i]

        def split(t: torch.Tensor) -> torch.Tensor:
            return split_for_context_parallel(t, seq_dim=1, cp_rank=cp_rank, cp_size=dims.cp)

        local = model(split(tokens.view(1, n)), split(torch.arange(n).view(1, n)), None)
        w = weight_shards[bounds[i] : bounds[i] + n].unsqueeze(0)
        (local * split(w)).sum().backward()
        for name, grad in _grads(model).items():
            single_grads[name] = single_grads.get(name, 0) + grad
        full = _gather_vocab(local.detach())
        single_logits.append(gather_from_context_parallel(full, seq_dim=1, group=cp_group)[0])

    logits_diff = max(
        (packed_logits[start : start + n] - single[:n]).abs().max().item()
        for start, n, single in zip(bounds, REAL_LENGTHS, single_logits, strict=False)
    )
    grad_diff = max((packed_grads[k] - g).abs().max().item() for k, g in single_grads.items())
    grad_scale = max(g.abs().max().item() for g in packed_grads.values())

    # Isolation: new tokens in sequence 2 (real and padding) change nothing elsewhere.
    perturbed = list(seqs)
    perturbed[1] = (seqs[1] + 1 + torch.arange(padded[1])) % ckpt.arch.vocab_size
    with torch.no_grad():
        before = packed_forward(seqs, backward=False)
        after = packed_forward(perturbed, backward=False)
    others = torch.cat([torch.arange(bounds[0], bounds[1]), torch.arange(bounds[2], bounds[3])])
    return {
        "logits_diff": logits_diff,
        "grad_diff": grad_diff,
        "grad_scale": grad_scale,
        "others_equal": torch.equal(before[others], after[others]),
        "seq2_changed": not torch.equal(
            before[bounds[1] : bounds[2]], after[bounds[1] : bounds[2]]
        ),
        "logit_scale": packed_logits.abs().max().item(),
    }


# ------------------------------------------------------------------------ layer checks


def _reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], scale: float
) -> torch.Tensor:
    """float64 per-sequence causal softmax attention: q [t, np, hn], k/v [t, ng, hn]."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    out = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        qs, ks, vs = q[start:end], k[start:end], v[start:end]
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        n = end - start
        hidden = torch.ones(n, n, dtype=torch.bool).triu(1)
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        out.append(torch.einsum("hqk,khd->qhd", probs, vs).reshape(n, -1))
    return torch.cat(out)


def _attention_diffs(dims: ParallelDims) -> dict[str, float]:
    """ContextParallelAttention with THD (this rank's heads and CP split) vs float64."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType

    from dapo_megatron.megatron.context_parallel import (
        gather_packed_from_context_parallel,
        split_packed_for_context_parallel,
    )
    from dapo_megatron.megatron.cp_attention import ContextParallelAttention
    from dapo_megatron.megatron.model import transformer_config

    arch = hf_arch(_hf_configs()["llama"])
    config = transformer_config(arch, dims, "fp32")
    cp_rank = parallel_state.get_context_parallel_rank()
    cp_group = parallel_state.get_context_parallel_group()
    # Odd lengths at CP1 (nothing to split); multiples of 2 * cp otherwise.
    lengths = [6, 17, 1, 8] if dims.cp == 1 else [4 * dims.cp, 2 * dims.cp, 6 * dims.cp]
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    heads, groups = arch.num_attention_heads // dims.tp, arch.num_query_groups // dims.tp
    gen = torch.Generator().manual_seed(3)  # the same global tensors on every rank
    q64 = torch.randn(bounds[-1], heads, arch.head_dim, generator=gen, dtype=torch.float64)
    k64, v64 = (
        torch.randn(bounds[-1], groups, arch.head_dim, generator=gen, dtype=torch.float64)
        for _ in "kv"
    )
    w64 = torch.randn(bounds[-1], heads * arch.head_dim, generator=gen, dtype=torch.float64)
    for t in (q64, k64, v64):
        t.requires_grad_(True)
    attention = ContextParallelAttention(config, 1, AttnMaskType.causal, "self")
    ref = _reference_attention(q64, k64, v64, bounds, attention.softmax_scale)
    (ref * w64).sum().backward()

    def split(t: torch.Tensor) -> torch.Tensor:
        return split_packed_for_context_parallel(
            t.detach(), bounds, seq_dim=0, cp_rank=cp_rank, cp_size=dims.cp
        )

    q, k, v = (split(t).float().requires_grad_(True) for t in (q64, k64, v64))
    cu = torch.tensor(bounds, dtype=torch.int32)
    out = attention(q, k, v, None, packed_seq_params=_packed_params(cu, max(lengths)))
    assert out.shape == (bounds[-1] // dims.cp, heads * arch.head_dim)
    (out * split(w64).float()).sum().backward()
    full = gather_packed_from_context_parallel(out, cu, seq_dim=0, group=cp_group)
    result = {"out_diff": (full.double() - ref).abs().max().item()}
    # Local grads vs the reference grads of this rank's rows. K/V grads include the
    # contributions of every rank's queries (the all-gather's backward reduces them).
    result["grad_diff"] = max(
        (local.grad.double() - split(ref_leaf.grad)).abs().max().item()
        for local, ref_leaf in ((q, q64), (k, k64), (v, v64))
    )

    if dims.cp == 1:
        # cu_seqlens_q_padded: the padded packing is the layout; same result.
        real = torch.tensor([0, 5, 17, 18, 24], dtype=torch.int32)  # each <= its padded length
        padded_params = _packed_params(real, max(lengths))
        padded_params.cu_seqlens_q_padded = padded_params.cu_seqlens_kv_padded = cu
        with torch.no_grad():
            same = attention(q, k, v, None, packed_seq_params=padded_params)
        assert torch.equal(same, out.detach())
        _check_refusals(attention, q, k, v, cu, max(lengths))
    return result


def _check_refusals(
    attention: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    max_len: int,
) -> None:
    from megatron.core.packed_seq_params import PackedSeqParams

    def params(**changes: object) -> PackedSeqParams:
        return dataclasses.replace(_packed_params(cu, max_len), **changes)

    cases = {
        "is the whole pack": params(max_seqlen_q=int(cu[-1]), max_seqlen_kv=int(cu[-1])),
        "< longest packed sequence": params(max_seqlen_q=4, max_seqlen_kv=4),
        "GLOBAL, padded": params(cu_seqlens_q=cu[:-1], cu_seqlens_kv=cu[:-1]),
        "cu_seqlens_kv differs": params(cu_seqlens_kv=torch.tensor([0, 32], dtype=torch.int32)),
        "or neither": params(cu_seqlens_q_padded=cu),
        "does not fit": params(
            cu_seqlens_q=torch.tensor([0, 7, 8, 9, 10]),
            cu_seqlens_kv=torch.tensor([0, 7, 8, 9, 10]),
            cu_seqlens_q_padded=cu,
            cu_seqlens_kv_padded=cu,
        ),
        "only thd": params(qkv_format="sbhd"),
    }
    for message, bad in cases.items():
        with pytest.raises((ValueError, NotImplementedError), match=message):
            attention(q, k, v, None, packed_seq_params=bad)
    with pytest.raises(NotImplementedError, match="explicit attention mask"):
        attention(q, k, v, torch.zeros(1, 1, 1, 1, dtype=torch.bool), packed_seq_params=params())


def _worker(dims: ParallelDims, checkpoints: dict[str, Checkpoint]) -> dict:
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel

    initialize_parallel(dims, seed=1234)
    results = {"attention": _attention_diffs(dims)}
    for family, ckpt in checkpoints.items():
        results[family] = _model_diffs(ckpt, dims)
    destroy_parallel()
    return results


LAYOUTS = {
    "tp1cp1": ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False),
    "tp2-sp": ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=True),
    "cp2": ParallelDims(tp=1, pp=1, cp=2, dp=1, sequence_parallel=False),
    "tp2-sp-xcp2": ParallelDims(tp=2, pp=1, cp=2, dp=1, sequence_parallel=True),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_packed_forward_matches_unpacked_sequences(
    layout: str, checkpoints: dict[str, Checkpoint]
) -> None:
    dims = LAYOUTS[layout]
    per_rank = run_distributed(_worker, dims.world_size, dims, checkpoints)
    out_diff = max(r["attention"]["out_diff"] for r in per_rank)
    attn_grad_diff = max(r["attention"]["grad_diff"] for r in per_rank)
    print(
        f"[{layout}] attention thd vs float64: max |out| diff {out_diff:.3e}, "
        f"max |q/k/v grad| diff {attn_grad_diff:.3e}"
    )
    assert out_diff <= ATTENTION_ATOL
    assert attn_grad_diff <= ATTENTION_GRAD_ATOL
    for family in checkpoints:
        logits_diff = max(r[family]["logits_diff"] for r in per_rank)
        grad_diff = max(r[family]["grad_diff"] for r in per_rank)
        grad_scale = max(r[family]["grad_scale"] for r in per_rank)
        print(
            f"[{layout}] {family}: max |packed - unpacked| logits {logits_diff:.3e} "
            f"(max |logit| {per_rank[0][family]['logit_scale']:.2f}), grads {grad_diff:.3e} "
            f"(max |grad| {grad_scale:.2e})"
        )
        assert logits_diff <= LOGITS_ATOL, f"{layout} {family}: logits differ by {logits_diff}"
        assert grad_diff <= GRAD_ATOL, f"{layout} {family}: grads differ by {grad_diff}"
        assert grad_scale > 1e-2  # not vacuous
        assert all(r[family]["others_equal"] for r in per_rank), "sequence 2 leaked"
        assert all(r[family]["seq2_changed"] for r in per_rank)  # the perturbation did bite
