"""Megatron GPTModel + HF weight conversion against HF transformers, on gloo (1-4 ranks).

For a tiny Qwen2 (q/k/v bias, tied embeddings) and a tiny Llama (no bias, untied,
4 query heads per KV head, checkpoint in several safetensors shards), with every weight
randomised (HF zero-inits biases and one-inits norms, which would hide mapping errors):

* the HF checkpoint is loaded into each parallel layout and the logits of Megatron's
  pipeline schedule (``get_forward_backward_func``, forward_only) match HF's logits;
* ``export_hf_weights`` gives back exactly the tensors of the checkpoint, same names,
  same order on every rank.

Megatron is imported inside the rank functions only: the pytest process itself never
needs it (nor the CPU compatibility patches that come with it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import transformers
import waits
from launch import run_distributed
from megatron_setup import megatron_model, tiny_hf_checkpoint
from safetensors.torch import load_file

from dapo_megatron.config.model_arch import ModelArch
from dapo_megatron.config.parallel import ParallelDims

pytestmark = pytest.mark.distributed

BATCH, SEQ = 2, 16
LOGITS_ATOL = 1e-5


def _hf_configs() -> dict[str, transformers.PretrainedConfig]:
    # Eager attention computes softmax(QK^T) V explicitly like Megatron's local spec, which
    # keeps the fp32 differences at rounding level (SDPA alone differs from eager by ~5e-6).
    common = dict(
        hidden_size=64,
        num_hidden_layers=4,
        max_position_embeddings=128,
        attn_implementation="eager",
    )
    return {
        # Two TP ranks both hold real vocabulary rows (160 -> padded 256 at TP2).
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
            # Llama 3.1 frequency scaling: changes the lowest frequency even at short lengths.
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
    """A saved HF model and its reference logits for ``input_ids``."""

    hf_dir: str
    arch: ModelArch
    input_ids: torch.Tensor
    logits: torch.Tensor


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    root = tmp_path_factory.mktemp("hf")
    result = {}
    for i, (family, config) in enumerate(_hf_configs().items()):
        hf_dir = root / family
        # Llama is saved in several shards to exercise multi-file loading.
        shard = "100KB" if family == "llama" else "50GB"
        model, arch = tiny_hf_checkpoint(hf_dir, config, seed=i, max_shard_size=shard)
        input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        with torch.no_grad():
            logits = model(input_ids).logits
        result[family] = Checkpoint(str(hf_dir), arch, input_ids, logits)
    assert len(list((root / "llama").glob("*.safetensors"))) > 1
    return result


def _schedule_logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor | None:
    """Full-vocabulary logits [b, s, padded_vocab] through Megatron's pipeline schedule.

    One sequence per micro-batch. Returns None on stages other than the last.
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(
        data_iterator: Iterator[torch.Tensor], model: torch.nn.Module
    ) -> tuple[torch.Tensor, Callable]:
        tokens = next(data_iterator)
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        return model(tokens, positions, None), lambda out, non_loss_data=True: out.detach()

    outputs = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(input_ids.split(1)),
        model=[model],
        num_microbatches=input_ids.shape[0],
        seq_length=input_ids.shape[1],
        micro_batch_size=1,
        forward_only=True,
        collect_non_loss_data=True,
    )
    if not parallel_state.is_pipeline_last_stage():
        return None
    return _gather_vocab(torch.cat(outputs))


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


def _expected_tensors(hf_dir: str) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _layout_worker(dims: ParallelDims, checkpoints: dict[str, Checkpoint]) -> dict:
    """One rank: per family, max |logits - HF| (last stage) and the export check."""
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
    from dapo_megatron.megatron.hf_weights import export_hf_weights

    initialize_parallel(dims, seed=1234)
    results = {}
    for family, ckpt in checkpoints.items():
        model = megatron_model(ckpt.hf_dir, ckpt.arch, dims, "fp32").eval()
        assert all(p.dtype == torch.float32 for p in model.parameters())
        logits = _schedule_logits(model, ckpt.input_ids)
        if dims.pp == 1:  # a plain forward (inference path) must agree with the schedule
            positions = torch.arange(SEQ).expand_as(ckpt.input_ids)
            direct = _gather_vocab(model(ckpt.input_ids, positions, None).detach())
            assert torch.equal(direct, logits)
        max_diff = None
        if logits is not None:
            # Padding rows of the output layer are zero, so their logits are exactly 0.
            assert not logits[..., ckpt.arch.vocab_size :].any()
            max_diff = (logits[..., : ckpt.arch.vocab_size] - ckpt.logits).abs().max().item()
        expected = _expected_tensors(ckpt.hf_dir)
        names, mismatched = [], []
        for name, tensor in export_hf_weights(model, ckpt.arch, dims):
            names.append(name)
            if name not in expected or not torch.equal(tensor, expected[name]):
                mismatched.append(name)
        results[family] = {
            "max_diff": max_diff,
            "names": names,
            "mismatched": mismatched,
            "expected_names": sorted(expected),
        }
    destroy_parallel()
    return results


LAYOUTS = {
    "tp1": ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False),
    "tp2": ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=False),
    "tp2-sp": ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=True),
    "pp2": ParallelDims(tp=1, pp=2, cp=1, dp=1, sequence_parallel=False),
    "tp2xpp2": ParallelDims(tp=2, pp=2, cp=1, dp=1, sequence_parallel=False),
    "dp2": ParallelDims(tp=1, pp=1, cp=1, dp=2, sequence_parallel=False),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_logits_match_hf_and_export_round_trips(
    layout: str, checkpoints: dict[str, Checkpoint]
) -> None:
    dims = LAYOUTS[layout]
    per_rank = run_distributed(_layout_worker, dims.world_size, dims, checkpoints)
    for family in checkpoints:
        diffs = [r[family]["max_diff"] for r in per_rank if r[family]["max_diff"] is not None]
        # Every rank of the last stage reports (all its TP and DP ranks); others do not.
        assert len(diffs) == dims.tp * dims.dp
        print(f"[{layout}] {family}: max |megatron - hf| logits = {max(diffs):.3e}")
        assert max(diffs) <= LOGITS_ATOL, (
            f"{layout} {family}: max |logits diff| {max(diffs):.3e} > {LOGITS_ATOL}"
        )
        for rank, result in enumerate(per_rank):
            ours = result[family]
            assert sorted(ours["names"]) == ours["expected_names"], (rank, ours["names"])
            assert ours["names"] == per_rank[0][family]["names"], f"rank {rank} order differs"
            assert not ours["mismatched"], f"rank {rank}: {family} {ours['mismatched']} differ"


def _rng_worker(seed: int) -> dict[str, torch.Tensor]:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel

    initialize_parallel(ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=False), seed=seed)
    draws = {"before": torch.rand(4)}
    with get_cuda_rng_tracker().fork():
        draws["fork1"] = torch.rand(4)
    with get_cuda_rng_tracker().fork():
        draws["fork2"] = torch.rand(4)
    draws["after"] = torch.rand(4)
    destroy_parallel()
    return draws


def test_rng_tracker_forks_a_per_tp_rank_stream_on_cpu() -> None:
    seed = 7
    rank0, rank1 = run_distributed(_rng_worker, 2, seed)
    # Outside fork(): the default stream, seeded alike on both TP ranks and not disturbed
    # by the forks in between.
    for draws in (rank0, rank1):
        reference = torch.Generator().manual_seed(seed)
        assert torch.equal(draws["before"], torch.rand(4, generator=reference))
        assert torch.equal(draws["after"], torch.rand(4, generator=reference))
    # Inside fork(): a stream of its own per TP rank that carries on from fork to fork.
    assert not torch.equal(rank0["fork1"], rank1["fork1"])
    assert not torch.equal(rank0["fork1"], rank0["fork2"])
    assert not torch.equal(rank0["fork1"], rank0["after"])


def _world_size_mismatch_worker() -> str:
    from dapo_megatron.megatron.distributed import initialize_parallel

    try:
        initialize_parallel(ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=False), seed=0)
    except ValueError as e:
        return str(e)
    return "no error"


def test_world_size_mismatch_is_a_clear_error() -> None:
    (message,) = run_distributed(_world_size_mismatch_worker, 1)
    assert "WORLD_SIZE=1" in message and "needs 2 processes" in message


def _raising_worker() -> None:
    raise RuntimeError("boom from the child")


def _sleeping_worker() -> None:
    time.sleep(120)


def test_launcher_reports_child_traceback_and_timeout() -> None:
    with pytest.raises(Exception, match="(?s)Traceback.*_raising_worker.*boom from the child"):
        run_distributed(_raising_worker, 2)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="_sleeping_worker"):
        run_distributed(_sleeping_worker, 1, timeout=5)
    assert time.monotonic() - started < waits.scaled(20)  # idle for 5 s, scaled: not 120
