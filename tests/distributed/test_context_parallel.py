"""Context parallelism on CPU: the sequence split, and the model against HF and against CP1.

* ``split_for_context_parallel`` / ``cp_positions`` on a hand-made example (no processes),
  and ``gather_from_context_parallel`` inverting the split over a real CP group;
* Megatron's GPTModel with ``ContextParallelAttention`` at CP2 (2 processes) and TP2xCP2
  (4 processes, with and without sequence parallelism), each rank feeding its split of
  ``input_ids``/``position_ids``: the gathered logits match HF transformers (fp32) for a
  tiny Qwen2 (q/k/v bias, tied embeddings, 2 query heads per KV head) and a tiny Llama
  (llama3 rope scaling, untied, 4 query heads per KV head);
* without CP, ``ContextParallelAttention`` computes what Megatron's DotProductAttention
  computes (same inputs, same TP shard);
* gradients: for a scalar loss ``sum(logits * W)`` with a fixed random ``W``, the
  per-rank parameter gradients summed over the CP group (what Megatron's DDP all-reduce
  over data-and-context parallel ranks does) equal those of the same model without CP.
  The reference runs in the same processes after re-initialising Megatron with cp=1 and
  the CP ranks turned into data-parallel replicas: each replica then computes the
  single-process (per TP shard) gradient of the whole sequence.

Megatron is imported inside the rank functions only, as in test_megatron_model.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from launch import run_distributed
from megatron_setup import hf_arch, megatron_model, tiny_hf_checkpoint

from dapo_megatron.config.model_arch import ModelArch
from dapo_megatron.config.parallel import ParallelDims

pytestmark = pytest.mark.distributed

BATCH, SEQ = 2, 24  # 24 = 2 * cp * 6: chunks of 6 tokens at CP2
LOGITS_ATOL = 1e-5
GRAD_ATOL = 1e-5


# ---------------------------------------------------------------- split (no processes)


def test_split_matches_hand_made_load_balanced_layout() -> None:
    from dapo_megatron.megatron.context_parallel import cp_positions, split_for_context_parallel

    assert cp_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert cp_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17]])
    assert split_for_context_parallel(tokens, seq_dim=1, cp_rank=0, cp_size=2).tolist() == [
        [10, 11, 16, 17]
    ]
    assert split_for_context_parallel(tokens, seq_dim=-1, cp_rank=1, cp_size=2).tolist() == [
        [12, 13, 14, 15]
    ]
    # Hidden-state layout [s, b, h]: the sequence is dim 0.
    hidden = torch.arange(8.0).view(8, 1, 1).expand(8, 2, 3)
    assert split_for_context_parallel(hidden, seq_dim=0, cp_rank=1, cp_size=2)[
        :, 1, 2
    ].tolist() == [2.0, 3.0, 4.0, 5.0]
    # CP3 on 12 tokens: chunks of 2, rank r holds chunks r and 5 - r; together all tokens.
    assert cp_positions(12, 1, 3).tolist() == [2, 3, 8, 9]
    every = torch.cat([cp_positions(12, r, 3) for r in range(3)])
    assert sorted(every.tolist()) == list(range(12))
    # Without CP nothing is split, whatever the length.
    odd = torch.arange(7)
    assert split_for_context_parallel(odd, seq_dim=0, cp_rank=0, cp_size=1) is odd
    assert cp_positions(7, 0, 1).tolist() == list(range(7))


def test_split_rejects_a_length_not_divisible_by_2cp() -> None:
    from dapo_megatron.megatron.context_parallel import split_for_context_parallel

    with pytest.raises(ValueError, match="sequence length 10 .* 2 \\* context_parallel_size = 4"):
        split_for_context_parallel(torch.zeros(1, 10), seq_dim=1, cp_rank=0, cp_size=2)
    with pytest.raises(ValueError, match="cp_rank=2"):
        split_for_context_parallel(torch.zeros(1, 8), seq_dim=1, cp_rank=2, cp_size=2)


# ------------------------------------------------------------ models (HF reference)


def _hf_configs() -> dict[str, transformers.PretrainedConfig]:
    # Eager attention: softmax(QK^T)V written out, as in the local spec (see
    # test_megatron_model.py); two layers are enough to carry K/V gradients across layers.
    common = dict(
        hidden_size=64,
        num_hidden_layers=2,
        max_position_embeddings=128,
        attn_implementation="eager",
    )
    return {
        "qwen2": transformers.Qwen2Config(
            vocab_size=160,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=20000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            **common,
        ),
        "llama": transformers.LlamaConfig(
            vocab_size=150,
            intermediate_size=96,
            num_attention_heads=8,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            tie_word_embeddings=False,
            attention_bias=False,
            **common,
        ),
    }


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A saved HF model, its logits for ``input_ids`` and a loss weight for gradients."""

    hf_dir: str
    arch: ModelArch
    input_ids: torch.Tensor  # [b, s]
    logits: torch.Tensor  # [b, s, vocab]
    loss_weight: torch.Tensor  # [b, s, vocab]: loss = sum(logits * loss_weight)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    root = tmp_path_factory.mktemp("hf")
    result = {}
    for i, (family, config) in enumerate(_hf_configs().items()):
        model, arch = tiny_hf_checkpoint(root / family, config, seed=100 + i)
        input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        with torch.no_grad():
            logits = model(input_ids).logits
        # Scaled like a token-mean loss, so that gradients are O(1) and an absolute fp32
        # tolerance of 1e-5 is meaningful (a plain sum gives O(100) embedding gradients).
        loss_weight = torch.randn(BATCH, SEQ, config.vocab_size) / (BATCH * SEQ)
        result[family] = Checkpoint(str(root / family), arch, input_ids, logits, loss_weight)
    return result


def _gather_vocab(local: torch.Tensor) -> torch.Tensor:
    """[b, s, padded_vocab / tp] vocab-parallel logits -> [b, s, padded_vocab]."""
    from megatron.core import parallel_state

    shards = [
        torch.empty_like(local)
        for _ in range(parallel_state.get_tensor_model_parallel_world_size())
    ]
    torch.distributed.all_gather(
        shards, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group()
    )
    return torch.cat(shards, dim=-1)


def _vocab_shard(weight: torch.Tensor, padded_vocab: int) -> torch.Tensor:
    """This TP rank's columns of a [b, s, vocab] loss weight (zero on padding rows)."""
    from megatron.core import parallel_state

    padded = torch.zeros(*weight.shape[:-1], padded_vocab)
    padded[..., : weight.shape[-1]] = weight
    tp = parallel_state.get_tensor_model_parallel_world_size()
    return padded.chunk(tp, dim=-1)[parallel_state.get_tensor_model_parallel_rank()]


def _logits_and_grads(ckpt: Checkpoint, dims: ParallelDims) -> tuple[torch.Tensor, dict]:
    """Full-sequence, full-vocab logits and CP-summed param grads of sum(logits * W)."""
    from megatron.core import parallel_state

    from dapo_megatron.megatron.context_parallel import (
        gather_from_context_parallel,
        split_for_context_parallel,
    )
    from dapo_megatron.megatron.model import padded_vocab_size

    model = megatron_model(ckpt.hf_dir, ckpt.arch, dims, "fp32")
    cp_rank = parallel_state.get_context_parallel_rank()
    cp_group = parallel_state.get_context_parallel_group()

    def split(t: torch.Tensor) -> torch.Tensor:
        return split_for_context_parallel(t, seq_dim=1, cp_rank=cp_rank, cp_size=dims.cp)

    positions = torch.arange(SEQ).expand_as(ckpt.input_ids)
    local = model(split(ckpt.input_ids), split(positions), None)  # [b, s/cp, V/tp]
    weight = _vocab_shard(ckpt.loss_weight, padded_vocab_size(ckpt.arch.vocab_size, dims.tp))
    (local * split(weight)).sum().backward()
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad.clone()
        # Each CP rank holds the gradient of its own tokens' loss: the sum is the total.
        torch.distributed.all_reduce(grad, group=cp_group)
        grads[name] = grad
    logits = gather_from_context_parallel(_gather_vocab(local.detach()), seq_dim=1, group=cp_group)
    return logits, grads


def _attention_inputs(
    dims: ParallelDims, seed: int
) -> tuple[object, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Llama's TransformerConfig under ``dims`` and random local q [s/cp, b, np/tp, hn],
    k and v [s/cp, b, ng/tp, hn]."""
    from dapo_megatron.megatron.model import transformer_config

    arch = hf_arch(_hf_configs()["llama"])
    heads, groups = arch.num_attention_heads // dims.tp, arch.num_query_groups // dims.tp
    gen = torch.Generator().manual_seed(seed)
    local = SEQ // dims.cp
    q = torch.randn(local, BATCH, heads, arch.head_dim, generator=gen)
    k, v = (torch.randn(local, BATCH, groups, arch.head_dim, generator=gen) for _ in "kv")
    return transformer_config(arch, dims, "fp32"), q, k, v


def _check_gather_and_explicit_mask(dims: ParallelDims) -> None:
    """gather(split(x)) == x on the real CP group; an explicit causal mask == mask=None."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnMaskType

    from dapo_megatron.megatron.context_parallel import (
        cp_positions,
        gather_from_context_parallel,
        split_for_context_parallel,
    )
    from dapo_megatron.megatron.cp_attention import ContextParallelAttention

    cp_rank = parallel_state.get_context_parallel_rank()
    cp_group = parallel_state.get_context_parallel_group()
    x = torch.randn(SEQ, 3, 5, generator=torch.Generator().manual_seed(0))
    for seq_dim, full in ((0, x), (1, x.transpose(0, 1))):
        part = split_for_context_parallel(full, seq_dim=seq_dim, cp_rank=cp_rank, cp_size=dims.cp)
        assert torch.equal(
            gather_from_context_parallel(part, seq_dim=seq_dim, group=cp_group), full
        )

    config, q, k, v = _attention_inputs(dims, seed=1 + cp_rank)  # each rank its own tokens
    attention = ContextParallelAttention(config, 1, AttnMaskType.causal, "self")
    rows = cp_positions(SEQ, cp_rank, dims.cp)
    explicit = torch.arange(SEQ)[None, :] > rows[:, None]  # [s/cp, s], keys in global order
    assert torch.equal(attention(q, k, v, explicit[None, None]), attention(q, k, v, None))


def _cp1_attention_diff(dims: ParallelDims) -> float:
    """max |ContextParallelAttention - DotProductAttention| without CP (same inputs)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from dapo_megatron.megatron.cp_attention import ContextParallelAttention

    config, q, k, v = _attention_inputs(dims, seed=1)
    ours = ContextParallelAttention(config, 1, AttnMaskType.causal, "self")(q, k, v, None)
    megatron = DotProductAttention(config, 1, AttnMaskType.causal, "self")(q, k, v, None)
    assert ours.shape == megatron.shape
    return (ours - megatron).abs().max().item()


def _cp_worker(dims: ParallelDims, checkpoints: dict[str, Checkpoint]) -> dict:
    """One rank: logits vs HF and grads vs the same TP layout without CP."""
    from megatron.core import parallel_state

    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel

    initialize_parallel(dims, seed=1234)
    _check_gather_and_explicit_mask(dims)
    results = {family: {} for family in checkpoints}
    cp_grads = {}
    for family, ckpt in checkpoints.items():
        logits, cp_grads[family] = _logits_and_grads(ckpt, dims)
        assert not logits[..., ckpt.arch.vocab_size :].any()  # zero padding rows
        results[family]["logits_diff"] = (
            (logits[..., : ckpt.arch.vocab_size] - ckpt.logits).abs().max().item()
        )

    # Reference: the CP ranks become data-parallel replicas of a CP1 model (same TP
    # shards), each computing the whole sequence on its own.
    parallel_state.destroy_model_parallel()
    reference = dataclasses.replace(dims, cp=1, dp=dims.cp * dims.dp)
    initialize_parallel(reference, seed=1234)
    results["cp1_attention_diff"] = _cp1_attention_diff(reference)
    for family, ckpt in checkpoints.items():
        _, ref_grads = _logits_and_grads(ckpt, reference)
        assert sorted(ref_grads) == sorted(cp_grads[family])
        results[family]["grad_diff"] = max(
            (cp_grads[family][n] - g).abs().max().item() for n, g in ref_grads.items()
        )
        results[family]["grad_scale"] = max(g.abs().max().item() for g in ref_grads.values())
        results[family]["num_params"] = len(ref_grads)
    destroy_parallel()
    return results


LAYOUTS = {
    "cp2": ParallelDims(tp=1, pp=1, cp=2, dp=1, sequence_parallel=False),
    "tp2xcp2": ParallelDims(tp=2, pp=1, cp=2, dp=1, sequence_parallel=False),
    # SP scatters the sequence over TP inside each CP split; GPTModel's rotary length
    # then multiplies the local length by both tp and cp.
    "tp2-sp-xcp2": ParallelDims(tp=2, pp=1, cp=2, dp=1, sequence_parallel=True),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cp_logits_match_hf_and_grads_match_cp1(
    layout: str, checkpoints: dict[str, Checkpoint]
) -> None:
    dims = LAYOUTS[layout]
    per_rank = run_distributed(_cp_worker, dims.world_size, dims, checkpoints)
    attention_diff = max(r["cp1_attention_diff"] for r in per_rank)
    print(f"[{layout}] without CP: max |ours - DotProductAttention| = {attention_diff:.3e}")
    assert attention_diff <= 1e-6
    for family in checkpoints:
        logits_diff = max(r[family]["logits_diff"] for r in per_rank)
        grad_diff = max(r[family]["grad_diff"] for r in per_rank)
        scale = max(r[family]["grad_scale"] for r in per_rank)
        print(
            f"[{layout}] {family}: max |logits - hf| = {logits_diff:.3e}, max |grad - cp1| = "
            f"{grad_diff:.3e} over {per_rank[0][family]['num_params']} params "
            f"(max |grad| {scale:.2e})"
        )
        assert logits_diff <= LOGITS_ATOL, f"{layout} {family}: logits differ by {logits_diff}"
        assert grad_diff <= GRAD_ATOL, f"{layout} {family}: grads differ by {grad_diff}"
        # A vacuous comparison (all-zero grads) would pass the check above.
        assert scale > 1e-2
