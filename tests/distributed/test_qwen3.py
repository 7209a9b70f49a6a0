"""Qwen3 dense checkpoints against HF transformers' Qwen3ForCausalLM in float64, on gloo.

Qwen3 differs from Qwen2 in three places the Megatron path must get right: an RMSNorm over
each query and key head after the q/k/v split and before RoPE (HF ``q_norm``/``k_norm``,
Megatron ``q_layernorm``/``k_layernorm``), a head size of its own (the query projection is
heads x head_dim wide, not hidden), and no q/k/v bias. Two tiny random models, every
weight randomised (HF one-inits the norms, which would hide a missing or misplaced norm):

* ``wide``: hidden 64, 4 query heads of 32 (query width 128 != hidden), 2 KV heads, untied;
* ``tied``: hidden 64, 2 heads of 32, 2 KV heads, tied embeddings (the tiny-qwen3 shape).

Checks (the reference is the HF model in float64, eager attention):

1. logits through Megatron's pipeline schedule at TP1, TP2 with sequence parallelism, PP2
   and CP2, in ONE two-process launch (Megatron's groups are rebuilt between layouts), and
   ``export_hf_weights`` bitwise equal to the checkpoint at each layout;
2. one DAPO train step with SGD (lr 1: the weight change is minus the gradient) through
   ``MegatronPolicy``: logprobs, entropies, loss and every gradient (q/k norms included)
   against HF's float64 gradients, padded at TP2+SP and packed (THD) at CP2 (one launch);
3. greedy generation of the Megatron engine (KV cache) equals HF ``generate``, and the
   export's writer gives back the checkpoint's tensors bit for bit with a config that
   reads back as the same ModelArch (one process).

Megatron is imported inside the rank functions only.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
import transformers
from launch import run_distributed
from megatron_setup import megatron_model, tiny_hf_checkpoint
from safetensors.torch import load_file
from test_megatron_model import _gather_vocab, _schedule_logits
from test_packed_policy_step import LENGTHS, _packed_config
from test_policy_step import S, _batch, _config, _reference

from dapo_megatron.config.model_arch import ModelArch, arch_from_hf_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.run_plan import build_loss_spec
from dapo_megatron.shared.batch import PolicyBatch

pytestmark = pytest.mark.distributed

BATCH, SEQ = 2, 16  # 16 = 2 * cp * 4: CP2 chunks of 4 tokens
LOGITS_ATOL = 1e-5  # fp32 Megatron against float64 HF (test_megatron_model.py's bound)
GRAD_ATOL = 1e-5  # test_policy_step.py's bound
PROMPTS = [[5, 17, 3, 44, 9, 12], [61], [2, 30, 7, 88]]
GREEDY_TOKENS = 10


def _hf_configs() -> dict[str, transformers.Qwen3Config]:
    common = dict(
        vocab_size=160,  # two TP ranks both hold real rows (padded to 256 at TP2)
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=128,
        rope_theta=20000.0,
        rms_norm_eps=1e-6,
        attn_implementation="eager",  # softmax(QK^T)V written out, as the local spec
    )
    return {
        "wide": transformers.Qwen3Config(
            num_attention_heads=4, tie_word_embeddings=False, **common
        ),
        "tied": transformers.Qwen3Config(num_attention_heads=2, tie_word_embeddings=True, **common),
    }


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A saved HF Qwen3 and its float64 logits for ``input_ids``."""

    hf_dir: str
    arch: ModelArch
    input_ids: torch.Tensor
    logits: torch.Tensor


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    root = tmp_path_factory.mktemp("qwen3")
    result = {}
    for i, (name, config) in enumerate(_hf_configs().items()):
        model, arch = tiny_hf_checkpoint(root / name, config, seed=10 + i)
        assert arch.qk_layernorm and arch.head_dim == 32
        input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        with torch.no_grad():
            logits = model.double()(input_ids).logits
        result[name] = Checkpoint(str(root / name), arch, input_ids, logits)
    assert result["wide"].arch.query_width == 2 * result["wide"].arch.hidden_size
    return result


# ------------------------------------------------------------- 1. logits and export


LAYOUTS = {  # all on two processes
    "tp1": ParallelDims(tp=1, pp=1, cp=1, dp=2, sequence_parallel=False),
    "tp2-sp": ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=True),
    "pp2": ParallelDims(tp=1, pp=2, cp=1, dp=1, sequence_parallel=False),
    "cp2": ParallelDims(tp=1, pp=1, cp=2, dp=1, sequence_parallel=False),
}


def _cp_logits(model: torch.nn.Module, input_ids: torch.Tensor, cp: int) -> torch.Tensor:
    """Full logits of a CP model fed each rank's load-balanced split."""
    from megatron.core import parallel_state

    from dapo_megatron.megatron.context_parallel import (
        gather_from_context_parallel,
        split_for_context_parallel,
    )

    rank = parallel_state.get_context_parallel_rank()

    def split(t: torch.Tensor) -> torch.Tensor:
        return split_for_context_parallel(t, seq_dim=1, cp_rank=rank, cp_size=cp)

    positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
    local = model(split(input_ids), split(positions), None).detach()
    group = parallel_state.get_context_parallel_group()
    return gather_from_context_parallel(_gather_vocab(local), seq_dim=1, group=group)


def _layouts_worker(checkpoints: dict[str, Checkpoint]) -> dict:
    """Per layout and model: max |logits - HF| (last stage) and export mismatches."""
    from megatron.core import parallel_state

    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
    from dapo_megatron.megatron.hf_weights import export_hf_weights

    results: dict = {}
    for layout, dims in LAYOUTS.items():
        initialize_parallel(dims, seed=1234)
        for name, ckpt in checkpoints.items():
            model = megatron_model(ckpt.hf_dir, ckpt.arch, dims, "fp32").eval()
            if dims.cp > 1:
                logits = _cp_logits(model, ckpt.input_ids, dims.cp)
            else:
                logits = _schedule_logits(model, ckpt.input_ids)
            diff = None
            if logits is not None:
                assert not logits[..., ckpt.arch.vocab_size :].any()  # zero padding rows
                diff = (logits[..., : ckpt.arch.vocab_size].double() - ckpt.logits).abs().max()
            expected: dict[str, torch.Tensor] = {}
            for path in Path(ckpt.hf_dir).glob("*.safetensors"):
                expected.update(load_file(path))
            exported = dict(export_hf_weights(model, ckpt.arch, dims))
            results[layout, name] = {
                "logits_diff": None if diff is None else diff.item(),
                "names": sorted(exported),
                "expected_names": sorted(expected),
                "mismatched": [
                    n
                    for n, t in exported.items()
                    if n in expected and not torch.equal(t, expected[n])
                ],
            }
        parallel_state.destroy_model_parallel()
    destroy_parallel()
    return results


def test_qwen3_logits_match_hf_and_export_is_exact(checkpoints: dict[str, Checkpoint]) -> None:
    per_rank = run_distributed(_layouts_worker, 2, checkpoints, timeout=300)
    for layout in LAYOUTS:
        for name in checkpoints:
            diffs = [r[layout, name]["logits_diff"] for r in per_rank]
            diffs = [d for d in diffs if d is not None]
            assert diffs, f"{layout} {name}: no rank reported logits"
            print(f"[qwen3 {layout}] {name}: max |megatron - hf float64| logits = {max(diffs):.2e}")
            assert max(diffs) <= LOGITS_ATOL, (layout, name, diffs)
            for result in per_rank:
                ours = result[layout, name]
                assert ours["names"] == ours["expected_names"], (layout, name, ours["names"])
                assert any("q_norm" in n for n in ours["names"])
                assert not ours["mismatched"], (layout, name, ours["mismatched"])


# ------------------------------------------------------------ 2. one train step


def _qwen3_reference_model(hf_dir: Path) -> transformers.PreTrainedModel:
    cfg = _hf_configs()["wide"]
    cfg.vocab_size = 96  # test_policy_step's batch draws ids below 90
    return tiny_hf_checkpoint(hf_dir, cfg, seed=3)[0]


@pytest.fixture(scope="module")
def step_setup(tmp_path_factory: pytest.TempPathFactory):
    hf_dir = tmp_path_factory.mktemp("qwen3-step") / "wide"
    model = _qwen3_reference_model(hf_dir)
    batch = _batch(model)
    batch.lengths = torch.tensor(LENGTHS)
    spec = build_loss_spec(_config(hf_dir, ParallelDims(1, 1, 1, 1, False), 8))
    return hf_dir, batch, _reference(hf_dir, batch, spec)


STEP_LAYOUTS = {
    # name: (dims, packed token budget or None for padded micro-batches of 4 rows)
    "tp2-sp": (ParallelDims(2, 1, 1, 1, True), None),
    "cp2-packed": (ParallelDims(1, 1, 2, 1, False), 24),
}


def _step_worker(hf_dir: Path, batch: PolicyBatch) -> dict:
    from megatron.core import parallel_state

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.distributed import destroy_parallel
    from dapo_megatron.megatron.policy import MegatronPolicy

    out = {}
    for layout, (dims, budget) in STEP_LAYOUTS.items():
        if budget is None:
            config = _config(hf_dir, dims, 4)
        else:
            config = _packed_config(hf_dir, dims, budget)
        policy = MegatronPolicy(policy_plan(config, dims))
        lp, ent = policy.logprobs(batch, compute_entropy=True)
        before = dict(policy.export_weights())
        metrics = policy.train_step(batch)
        after = dict(policy.export_weights())
        out[layout] = {
            "lp": lp,
            "ent": ent,
            "loss": metrics["loss"],
            "delta": {k: after[k] - before[k] for k in before},
        }
        parallel_state.destroy_model_parallel()  # the next layout reuses the process group
    destroy_parallel()
    return out


def test_qwen3_train_step_gradients_match_hf(step_setup) -> None:
    hf_dir, batch, ref = step_setup
    per_rank = run_distributed(_step_worker, 2, hf_dir, batch, timeout=300)
    valid = torch.arange(S)[None, :] < batch.lengths[:, None]
    assert any("q_norm" in n for n in ref["grads"])
    for layout in STEP_LAYOUTS:
        for result in per_rank:
            ours = result[layout]
            lp_diff = (ours["lp"].double() - ref["lp"]).abs()[valid].max().item()
            ent_diff = (ours["ent"].double() - ref["ent"]).abs()[valid].max().item()
            assert lp_diff <= GRAD_ATOL and ent_diff <= GRAD_ATOL, (layout, lp_diff, ent_diff)
            assert abs(ours["loss"] - ref["loss"]) <= GRAD_ATOL, (layout, ours["loss"])
        delta = per_rank[0][layout]["delta"]
        assert set(delta) == set(ref["grads"])
        worst = {n: (delta[n].double() + g).abs().max().item() for n, g in ref["grads"].items()}
        scale = max(g.abs().max().item() for g in ref["grads"].values())
        print(
            f"[qwen3 step {layout}] max |grad - hf float64 grad| = {max(worst.values()):.2e}"
            f" (max |grad| {scale:.2e}), max |lp diff| = {lp_diff:.2e}"
        )
        bad = {n: f"{d:.1e}" for n, d in worst.items() if d > GRAD_ATOL}
        assert not bad, f"{layout}: gradients differ from the HF reference: {bad}"


# -------------------------------------------------- 3. generation and the export writer


@functools.cache
def _hf_model(hf_dir: str) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    model.generation_config.eos_token_id = None  # greedy references run to the cap
    return model.eval()


def _greedy_reference(hf_dir: str, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = _hf_model(hf_dir).generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=GREEDY_TOKENS,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def _generation_worker(checkpoints: dict[str, Checkpoint], out_root: str) -> dict:
    from dapo_megatron.data.tokenizer import build_char_tokenizer, save_char_tokenizer
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
    from dapo_megatron.megatron.export_hf import write_hf_checkpoint
    from dapo_megatron.megatron.hf_weights import export_hf_weights
    from dapo_megatron.megatron.inference import MegatronGenerationBackend
    from dapo_megatron.shared.sampling import SamplingParams

    dims = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)
    initialize_parallel(dims, seed=0)
    tokenizer_dir = Path(out_root) / "tokenizer"
    save_char_tokenizer(build_char_tokenizer(model_max_length=128), tokenizer_dir)
    greedy = SamplingParams(top_k=1, max_tokens=GREEDY_TOKENS)
    out = {}
    for name, ckpt in checkpoints.items():
        engine = MegatronGenerationBackend.from_hf_checkpoint(ckpt.hf_dir, ckpt.arch, dims, "fp32")
        samples = engine.generate(PROMPTS, greedy)
        exported = write_hf_checkpoint(
            export_hf_weights(engine._model, ckpt.arch, dims),
            Path(out_root) / name,
            arch=ckpt.arch,
            tokenizer_dir=tokenizer_dir,
            base_model_dir=ckpt.hf_dir,
        )
        out[name] = {
            "greedy": [[s.response_token_ids for s in group] for group in samples],
            "exported": str(exported),
        }
    destroy_parallel()
    return out


def test_qwen3_greedy_generation_and_export_writer(
    checkpoints: dict[str, Checkpoint], tmp_path: Path
) -> None:
    (result,) = run_distributed(_generation_worker, 1, checkpoints, str(tmp_path), timeout=300)
    for name, ckpt in checkpoints.items():
        expected = [[_greedy_reference(ckpt.hf_dir, p)] for p in PROMPTS]
        assert result[name]["greedy"] == expected, name
        exported = Path(result[name]["exported"])
        config = transformers.AutoConfig.from_pretrained(exported)
        assert config.architectures == ["Qwen3ForCausalLM"]
        assert arch_from_hf_config(config.to_dict(), "export") == ckpt.arch
        original = {}
        for path in Path(ckpt.hf_dir).glob("*.safetensors"):
            original.update(load_file(path))
        written = {}
        for path in exported.glob("*.safetensors"):
            written.update(load_file(path))
        assert sorted(written) == sorted(original), name
        assert all(torch.equal(written[n], t) for n, t in original.items()), name
