"""Qwen3-MoE with expert parallelism against HF transformers' Qwen3MoeForCausalLM, on gloo.

Two tiny random models of the tiny-qwen3-moe shape (4 experts, top-2, expert width 32,
q/k norms, tied embeddings; vocabulary 96 for test_policy_step's batch), one per value of
``norm_topk_prob``, every weight randomised (router and norms included: HF zero-inits the
router and one-inits the norms, which would hide a mapping error). Reference: the HF model
in float64 with eager attention.

Per case, through ``MegatronPolicy`` (its own model build, HF import, DDP, SGD with lr 1
so that the weight change of one train step is minus the gradient):

* the logits of a plain forward on this rank's data-parallel rows, against HF's;
* logprobs, entropies, the DAPO loss and every gradient (router, experts, attention) of
  one train step over the GLOBAL valid-token count, against HF's float64 gradients of the
  whole batch (HF holds experts stacked, ``gate_up_proj [E, 2F, h]``; they are split per
  expert to compare with the exported per-expert tensors);
* ``export_hf_weights`` before the step: bitwise the checkpoint's tensors, in the order of
  ``hf_weight_specs``, the same on every rank.

Cases: EP1 with both norm_topk_prob values and EP2 with both token dispatchers (one
two-process launch; Megatron's groups are rebuilt between cases), EP2 x TP2 with sequence
parallelism (one four-process launch). Each launch ends with greedy generation of the
Megatron engine (KV cache) at EP2 (resp. EP2 x TP2), each data-parallel replica with
prompts and a token budget of its own, so that one replica finishes first and must keep
running idle forwards for the other's expert dispatch: the responses equal HF ``generate``,
and so do those of a second engine refitted from the first one's export
(``load_hf_tensors``: each rank keeps its own experts' shards).

Megatron is imported inside the rank functions only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
from launch import run_distributed
from safetensors.torch import load_file
from test_megatron_model import _gather_vocab
from test_policy_step import B, _batch, _config, _hf_logprobs

from dapo_megatron.algorithms.loss import loss_denominator, torch_policy_loss
from dapo_megatron.algorithms.loss_inputs import LossInputs
from dapo_megatron.algorithms.loss_spec import LossSpec
from dapo_megatron.config.model_arch import PRESETS, ModelArch, hf_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.config.run_plan import build_loss_spec
from dapo_megatron.shared.batch import PolicyBatch

pytestmark = pytest.mark.distributed

ATOL = 1e-5  # fp32 Megatron against float64 HF: test_policy_step.py's bound
# Per data-parallel replica: prompts and greedy budget (replica 1 finishes long before 0).
GENERATION = {0: ([[5, 17, 3, 44, 9, 12], [61], [2, 30, 7, 88]], 10), 1: ([[33, 8]], 3)}
VOCAB = 96  # test_policy_step's batch draws ids below 90


def _arch(norm_topk_prob: bool) -> ModelArch:
    tiny = PRESETS["tiny-qwen3-moe"]
    assert tiny.moe is not None
    return dataclasses.replace(
        tiny, vocab_size=VOCAB, moe=dataclasses.replace(tiny.moe, norm_topk_prob=norm_topk_prob)
    )


def _write_checkpoint(arch: ModelArch, hf_dir: Path, seed: int) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    # Eager experts (a loop over experts): HF's default grouped GEMM refuses float64.
    config = hf_config(arch, attn_implementation="eager", experts_implementation="eager")
    model = transformers.Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # also self_attn.q_norm / k_norm
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:  # experts, router, attention, embedding
                param.normal_(0.0, 0.1)
    model.save_pretrained(hf_dir)
    return model


def _reference(model: transformers.PreTrainedModel, batch: PolicyBatch, spec: LossSpec) -> dict:
    """test_policy_step's float64 reference (DAPO loss of the whole batch and its gradients)
    on the model in memory: a reloaded one would get HF's grouped-GEMM experts back."""
    model = model.double()
    model.zero_grad()
    lp, ent = _hf_logprobs(model, batch.input_ids)
    normalizer = loss_denominator(
        batch.loss_mask, spec.loss_agg_mode, loss_scale_length=spec.loss_scale_length
    )
    inputs = LossInputs(
        lp, batch.old_logprobs.double(), batch.advantages.double(), batch.loss_mask, normalizer
    )
    out = torch_policy_loss(inputs, spec)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return {"loss": out.loss.item(), "grads": grads, "lp": lp.detach(), "ent": ent.detach()}


def _per_expert(grads: dict[str, torch.Tensor], arch: ModelArch) -> dict[str, torch.Tensor]:
    """HF's stacked expert gradients under the per-expert names of the checkpoint files."""
    assert arch.moe is not None
    f = arch.moe.moe_ffn_hidden_size
    out = {}
    for name, grad in grads.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf == "gate_up_proj":
            for e in range(arch.moe.num_experts):
                out[f"{prefix}.{e}.gate_proj.weight"] = grad[e, :f]
                out[f"{prefix}.{e}.up_proj.weight"] = grad[e, f:]
        elif leaf == "down_proj" and prefix.endswith("experts"):
            for e in range(arch.moe.num_experts):
                out[f"{prefix}.{e}.down_proj.weight"] = grad[e]
        else:
            out[name] = grad
    return out


@dataclasses.dataclass(frozen=True)
class Setup:
    """One checkpoint, the batch and the float64 HF reference of one train step."""

    hf_dir: Path
    arch: ModelArch
    batch: PolicyBatch
    logits: torch.Tensor
    ref: dict


@pytest.fixture(scope="module")
def setups(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Setup]:
    root = tmp_path_factory.mktemp("qwen3-moe")
    result = {}
    for seed, norm in enumerate((True, False)):
        arch, hf_dir = _arch(norm), root / f"norm-{norm}"
        model = _write_checkpoint(arch, hf_dir, seed)
        batch = _batch(model)
        with torch.no_grad():
            logits = model.double()(batch.input_ids).logits
        spec = build_loss_spec(_config(hf_dir, ParallelDims(1, 1, 1, 1, False), 8))
        ref = _reference(model, batch, spec)
        ref["grads"] = _per_expert(ref["grads"], arch)
        result[norm] = Setup(hf_dir, arch, batch, logits, ref)
    return result


# name: (dims, norm_topk_prob, token dispatcher, micro-batch rows per DP rank)
CASES = {
    "ep1-norm": (ParallelDims(1, 1, 1, 2, False, ep=1), True, "alltoall", 2),
    "ep1-no-norm": (ParallelDims(1, 1, 1, 2, False, ep=1), False, "alltoall", 4),
    "ep2-alltoall": (ParallelDims(1, 1, 1, 2, False, ep=2), True, "alltoall", 2),
    "ep2-allgather": (ParallelDims(1, 1, 1, 2, False, ep=2), False, "allgather", 4),
}
WIDE_CASES = {"ep2xtp2-sp": (ParallelDims(2, 1, 1, 2, True, ep=2), True, "alltoall", 2)}


def _cases_worker(setups: dict[bool, Setup], cases: dict, generation: ParallelDims) -> dict:
    from megatron.core import parallel_state

    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
    from dapo_megatron.megatron.hf_weights import export_hf_weights, hf_weight_specs
    from dapo_megatron.megatron.inference import MegatronGenerationBackend
    from dapo_megatron.megatron.model import build_model
    from dapo_megatron.megatron.policy import MegatronPolicy
    from dapo_megatron.shared.sampling import SamplingParams

    out = {}
    for case, (dims, norm, dispatcher, micro) in cases.items():
        setup = setups[norm]
        config = _config(setup.hf_dir, dims, micro)
        config.policy.moe.token_dispatcher = dispatcher
        policy = MegatronPolicy(policy_plan(config, dims))
        dp_rank = parallel_state.get_data_parallel_rank()
        rows = slice(dp_rank * B // dims.dp, (dp_rank + 1) * B // dims.dp)
        shard = setup.batch.select(rows)
        with torch.no_grad():
            ids = shard.input_ids
            local = policy._gpt(ids, torch.arange(ids.shape[1]).expand_as(ids), None)
        logits = _gather_vocab(local)[..., : setup.arch.vocab_size].double()
        lp, ent = policy.logprobs(shard, compute_entropy=True)
        exported = list(policy.export_weights())
        metrics = policy.train_step(shard)
        after = dict(policy.export_weights())
        expected: dict[str, torch.Tensor] = {}
        for path in setup.hf_dir.glob("*.safetensors"):
            expected.update(load_file(path))
        out[case] = {
            "rows": rows,
            "logits_diff": (logits - setup.logits[rows]).abs().max().item(),
            "lp": lp,
            "ent": ent,
            "loss": metrics["loss"],
            "names": [n for n, _ in exported],
            "specs": [n for n, _ in hf_weight_specs(setup.arch, dims)],
            "expected_names": sorted(expected),
            "mismatched": [n for n, t in exported if not torch.equal(t, expected.get(n))],
            "delta": {n: after[n] - t for n, t in exported},
            "ep_rank": parallel_state.get_expert_model_parallel_rank(),
        }
        parallel_state.destroy_model_parallel()  # the next case reuses the process group
    initialize_parallel(generation, seed=0)
    setup = setups[True]
    engine = MegatronGenerationBackend.from_hf_checkpoint(
        setup.hf_dir, setup.arch, generation, "fp32"
    )
    prompts, budget = GENERATION[parallel_state.get_data_parallel_rank()]
    greedy = SamplingParams(top_k=1, max_tokens=budget)
    samples = engine.generate(prompts, greedy)
    out["greedy"] = (prompts, budget, [group[0].response_token_ids for group in samples])
    # The refit of an engine's own copy: random weights, then the HF tensors of the export.
    copy = MegatronGenerationBackend(
        build_model(setup.arch, generation, "fp32"), setup.arch, generation
    )
    copy.update_weights(export_hf_weights(engine._model, setup.arch, generation))
    out["refit_greedy"] = [group[0].response_token_ids for group in copy.generate(prompts, greedy)]
    destroy_parallel()
    return out


def _check(per_rank: list[dict], setups: dict[bool, Setup], cases: dict) -> None:
    for case, (dims, norm, _, _) in cases.items():
        setup = setups[norm]
        ref = setup.ref
        results = [r[case] for r in per_rank]
        assert sorted({r["ep_rank"] for r in results}) == list(range(dims.ep))
        logits_diff = max(r["logits_diff"] for r in results)
        lp_diff = ent_diff = 0.0
        for ours in results:
            lp_diff = max(lp_diff, (ours["lp"].double() - ref["lp"][ours["rows"]]).abs().max())
            ent_diff = max(ent_diff, (ours["ent"].double() - ref["ent"][ours["rows"]]).abs().max())
            assert abs(ours["loss"] - ref["loss"]) <= ATOL, (case, ours["loss"], ref["loss"])
            assert ours["names"] == results[0]["names"] == ours["specs"], case
            assert sorted(ours["names"]) == ours["expected_names"], case
            assert not ours["mismatched"], (case, ours["mismatched"])
        delta = results[0]["delta"]
        assert set(delta) == set(ref["grads"]), case
        worst = {n: (delta[n].double() + g).abs().max().item() for n, g in ref["grads"].items()}
        experts = max(d for n, d in worst.items() if ".experts." in n)
        router = max(d for n, d in worst.items() if n.endswith("mlp.gate.weight"))
        print(
            f"[qwen3-moe {case}] max |logits - hf| {logits_diff:.1e}, |lp| {lp_diff:.1e}, "
            f"|grad - hf grad| {max(worst.values()):.1e} (experts {experts:.1e}, router "
            f"{router:.1e}); export exact"
        )
        assert logits_diff <= ATOL and lp_diff <= ATOL and ent_diff <= ATOL, case
        # Every expert must have received tokens, or its gradient check would be vacuous.
        assert all(g.abs().max() > 0 for n, g in ref["grads"].items() if ".experts." in n)
        bad = {n: f"{d:.1e}" for n, d in worst.items() if d > ATOL}
        assert not bad, f"{case}: gradients differ from the HF reference: {bad}"


def _check_greedy(per_rank: list[dict], hf_dir: Path) -> None:
    """Every rank's greedy responses against HF ``generate`` (fp32, eager attention)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    model.generation_config.eos_token_id = None  # the references run to the budget
    for rank, result in enumerate(per_rank):
        prompts, budget, responses = result["greedy"]
        assert result["refit_greedy"] == responses, rank
        for prompt, response in zip(prompts, responses, strict=True):
            ids = torch.tensor([prompt])
            expected = model.eval().generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=budget,
                pad_token_id=0,
            )[0, len(prompt) :]
            assert response == expected.tolist(), (rank, prompt)
    budgets = {r["greedy"][1] for r in per_rank}
    assert len(budgets) == 2  # the replicas really decoded different numbers of steps


def test_qwen3_moe_matches_hf_at_ep1_and_ep2(setups: dict[bool, Setup]) -> None:
    ep2 = ParallelDims(1, 1, 1, 2, False, ep=2)
    per_rank = run_distributed(_cases_worker, 2, setups, CASES, ep2, timeout=300)
    _check(per_rank, setups, CASES)
    _check_greedy(per_rank, setups[True].hf_dir)


def test_qwen3_moe_matches_hf_at_ep2_tp2(setups: dict[bool, Setup]) -> None:
    ep2_tp2 = ParallelDims(2, 1, 1, 2, False, ep=2)
    per_rank = run_distributed(_cases_worker, 4, setups, WIDE_CASES, ep2_tp2, timeout=300)
    _check(per_rank, setups, WIDE_CASES)
    _check_greedy(per_rank, setups[True].hf_dir)
