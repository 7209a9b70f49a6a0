"""The Megatron generation backend against HF transformers and against the policy, on gloo.

Two tiny random fp32 models: a Qwen2 (q/k/v bias, tied embeddings, padded vocabulary
rows on TP rank 1) and a Llama (no bias, untied, 4 query heads per KV head, Llama 3 RoPE
scaling). One worker per layout (TP1: one process, TP2: two) runs every engine call and
returns its outputs; the pytest process checks them against HF:

* greedy (top_k=1) responses equal HF's greedy ``generate`` for prompts of different
  lengths (one batch, left-padded), logprobs equal HF's log_softmax (<= 1e-5), at TP1, TP2
  and TP2 with sequence parallelism;
* sampling: the same seed gives the same samples, another seed other samples; stop tokens
  end a response (kept as its last token, reason "stop"), max_tokens caps it ("length");
  n samples per prompt; top-k/top-p only ever pick allowed tokens, with the frequencies
  of the truncated distribution; logprobs are log_softmax(HF logits / temperature);
* refit: an engine with a model of its own (other random weights) gets the weights of a
  MegatronPolicy after an SFT step through ``update_weights(policy.export_weights())`` and
  then generates what an engine sharing the policy's model generates, with logprobs equal
  to the policy's own scoring (mean |exp(lp_engine - lp_policy) - 1| < 1e-6).
  The policy packs (the tiny recipe's token budget, as in the main job), so its model's
  core attention is ContextParallelAttention; the separate model is a plain local spec:
  both engines must still batch and compute alike (bit-identical samples).

Megatron is imported inside the rank functions only.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import transformers
from launch import run_distributed

from dapo_megatron.config.model_arch import ModelArch, arch_from_hf_config
from dapo_megatron.config.parallel import ParallelDims
from dapo_megatron.shared.sampling import Sample, SamplingParams

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 17, 3, 44, 9, 12], [61], [2, 30, 7], [8, 1, 70, 33, 21, 9, 4, 50, 13]]
GREEDY_TOKENS = 10
LOGPROB_ATOL = 1e-5
SAMPLE_T = 0.8
STOP_IDS = list(range(0, 96, 8))  # 12 of 96 tokens: most samples stop, some run to the cap
TRUNC = dict(top_k=8, top_p=0.9)
DIST_DRAWS = 4000
REFIT_T = 0.9

LAYOUTS = {
    "tp1": ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False),
    "tp2": ParallelDims(tp=2, pp=1, cp=1, dp=1, sequence_parallel=False),
}


def _hf_configs() -> dict[str, transformers.PretrainedConfig]:
    # Eager attention: softmax(QK^T)V like Megatron's local spec (fp32 rounding level).
    common = dict(num_hidden_layers=2, max_position_embeddings=64, attn_implementation="eager")
    return {
        "qwen2": transformers.Qwen2Config(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=10000.0,
            tie_word_embeddings=True,
            **common,
        ),
        "llama": transformers.LlamaConfig(
            vocab_size=150,
            hidden_size=64,
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


def _arch(config: transformers.PretrainedConfig) -> ModelArch:
    return arch_from_hf_config(config.to_dict(), f"{config.model_type} test config")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, ModelArch]]:
    """HF checkpoints with every weight randomised (HF's zero biases would hide bugs)."""
    root = tmp_path_factory.mktemp("gen")
    result = {}
    for i, (family, config) in enumerate(_hf_configs().items()):
        torch.manual_seed(i)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(
                    1.0 + 0.2 * torch.randn_like(param)
                    if name.endswith("norm.weight")
                    else 0.2 * torch.randn_like(param)
                )
        model.save_pretrained(root / family)
        result[family] = (str(root / family), _arch(config))
    return result


@functools.cache
def _hf_model(hf_dir: str) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    model.generation_config.eos_token_id = None  # greedy references run to the cap
    return model.eval()


@torch.no_grad()
def _hf_logits(hf_dir: str, prompt: list[int], response: list[int]) -> torch.Tensor:
    """HF logits [len(response), vocab] that predicted each response token."""
    ids = torch.tensor([prompt + response])
    return _hf_model(hf_dir)(ids).logits[0, len(prompt) - 1 : -1].float()


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


# ---------------------------------------------------------------------------------------
# Rank functions


def _policy_config(hf_dir: str):
    from dapo_megatron.config.loader import load_config

    overrides = [
        f"policy.model_name_or_path={hf_dir}",
        "policy.model_arch=null",
        "policy.init_model_if_missing=false",
        "policy.precision=fp32",
        "policy.optimizer.name=sgd",
        "policy.optimizer.lr=0.5",
        "policy.optimizer.min_lr=0.0",
        "policy.optimizer.weight_decay=0.0",
        "policy.optimizer.clip_grad=0.0",
        "policy.scheduler.lr_warmup_steps=0",
        "policy.scheduler.lr_decay_style=constant",
        "policy.train_micro_batch_size=4",
        "policy.logprob_micro_batch_size=4",
        f"generation.temperature={REFIT_T}",
        "policy.megatron.use_distributed_optimizer=false",
    ]
    return load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", overrides, validate=False).config


def _as_lists(groups: list[list[Sample]]) -> list[list[tuple]]:
    """Samples as plain tuples (picklable, comparable)."""
    return [[(s.response_token_ids, s.logprobs, s.finish_reason) for s in g] for g in groups]


def _score_with_policy(
    policy, prompts: list[list[int]], groups: list[list[Sample]]
) -> list[list[float]]:
    """The policy's logprobs of each response token (its training-time forward)."""
    from dapo_megatron.shared.batch import PolicyBatch

    rows = [(p, s.response_token_ids) for p, g in zip(prompts, groups, strict=True) for s in g]
    seq = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.zeros(len(rows), seq, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), seq)
    for b, (p, r) in enumerate(rows):
        input_ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        loss_mask[b, len(p) : len(p) + len(r)] = 1.0
    lp, _ = policy.logprobs(PolicyBatch(input_ids=input_ids, loss_mask=loss_mask))
    return [lp[b, len(p) : len(p) + len(r)].tolist() for b, (p, r) in enumerate(rows)]


def _refit(policy, dims: ParallelDims) -> dict:
    """A policy, an engine sharing its model and an engine with a model of its own."""
    from dapo_megatron.megatron.inference import MegatronGenerationBackend
    from dapo_megatron.megatron.model import build_model
    from dapo_megatron.shared.batch import PolicyBatch

    arch = policy.arch
    shared = MegatronGenerationBackend(policy.model[0], arch, dims, shares_policy_model=True)
    # build_model initialises random weights (Megatron's init, not the checkpoint's).
    separate = MegatronGenerationBackend(build_model(arch, dims, "fp32"), arch, dims)
    greedy = SamplingParams(temperature=REFIT_T, top_k=1, max_tokens=GREEDY_TOKENS)
    sampled = SamplingParams(temperature=REFIT_T, max_tokens=8, n=2, seed=11)
    before = _as_lists(separate.generate(PROMPTS, greedy))

    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, arch.vocab_size, (4, 12), generator=gen)
    loss_mask = torch.ones(4, 12)
    loss_mask[:, 0] = 0.0
    policy.sft_step(PolicyBatch(input_ids=input_ids, loss_mask=loss_mask))
    separate.update_weights(policy.export_weights())
    shared.update_weights(policy.export_weights())  # shares the parameters: a no-op

    # The policy's model is built for packing (ContextParallelAttention around Megatron's
    # DotProductAttention), the separate one plain: both must batch rows alike (padded).
    out = {
        "before": before,
        "padding_mask_ok": (shared._padding_mask_ok, separate._padding_mask_ok),
    }
    for name, params in (("greedy", greedy), ("sampled", sampled)):
        groups = {
            "shared": shared.generate(PROMPTS, params),
            "separate": separate.generate(PROMPTS, params),
        }
        out[name] = {k: _as_lists(v) for k, v in groups.items()}
        out[name]["policy_lp"] = _score_with_policy(policy, PROMPTS, groups["separate"])
    return out


def _checkpoint_engines(dims: ParallelDims, models: dict) -> dict:
    """Greedy / sampled outputs of engines loaded from the HF checkpoints."""
    from dapo_megatron.megatron.hf_weights import (
        export_hf_weights,
        hf_weight_specs,
        load_hf_checkpoint,
    )
    from dapo_megatron.megatron.inference import MegatronGenerationBackend
    from dapo_megatron.megatron.model import build_model

    greedy = SamplingParams(top_k=1, max_tokens=GREEDY_TOKENS)
    out: dict = {}
    for family, (hf_dir, arch) in models.items():
        model = build_model(arch, dims, "fp32")
        load_hf_checkpoint(model, hf_dir, arch, dims)
        engine = MegatronGenerationBackend(model, arch, dims)
        res = out[family] = {"greedy": _as_lists(engine.generate(PROMPTS, greedy))}
        # The path for attention that cannot mask padding (Transformer Engine): batches of
        # one prompt length, here also capped at 3 rows.
        grouped = MegatronGenerationBackend(model, arch, dims, max_batch_size=3)
        grouped._padding_mask_ok = False
        res["greedy_grouped"] = _as_lists(grouped.generate(PROMPTS, greedy))
        if dims.tp > 1 and family == "qwen2":
            sp = ParallelDims(dims.tp, 1, 1, 1, sequence_parallel=True)
            sp_engine = MegatronGenerationBackend.from_hf_checkpoint(hf_dir, arch, sp, "fp32")
            res["greedy_sp"] = _as_lists(sp_engine.generate(PROMPTS, greedy))
        # A second model with other random weights, refitted from the first's export
        # (load_hf_tensors; Llama covers the untied output layer).
        copy = MegatronGenerationBackend(build_model(arch, dims, "fp32"), arch, dims)
        copy.update_weights(export_hf_weights(model, arch, dims))
        res["greedy_copy"] = _as_lists(copy.generate(PROMPTS, greedy))
        # The refit plans its buckets from hf_weight_specs before exporting: it must list
        # exactly the export's names and shapes, in the export's order.
        exported = [(n, list(t.shape)) for n, t in export_hf_weights(model, arch, dims)]
        res["specs_match_export"] = exported == [
            (n, list(s)) for n, s in hf_weight_specs(arch, dims)
        ]
        if family != "qwen2":
            continue
        sampling = dict(temperature=SAMPLE_T, max_tokens=12, n=3, stop_token_ids=STOP_IDS)
        res["seed1"] = _as_lists(engine.generate(PROMPTS, SamplingParams(seed=1, **sampling)))
        res["seed1_again"] = _as_lists(engine.generate(PROMPTS, SamplingParams(seed=1, **sampling)))
        res["seed2"] = _as_lists(engine.generate(PROMPTS, SamplingParams(seed=2, **sampling)))
        # Cutting the tail: the same seeded call, stopped once 1 of the 4 prompts finished
        # (one batch), and on the grouped engine (batches of <= 3 rows: 4 batches).
        cut = SamplingParams(seed=1, finish_after_fraction=0.25, **sampling)
        res["cut"] = _as_lists(engine.generate(PROMPTS, cut))
        res["grouped_full"] = _as_lists(
            grouped.generate(PROMPTS, SamplingParams(seed=1, **sampling))
        )
        res["grouped_cut"] = _as_lists(grouped.generate(PROMPTS, cut))
        res["no_logprobs"] = _as_lists(
            engine.generate(PROMPTS, SamplingParams(seed=1, logprobs=False, **sampling))
        )
        res["truncated"] = _as_lists(
            engine.generate(
                PROMPTS, SamplingParams(temperature=SAMPLE_T, max_tokens=8, n=4, seed=3, **TRUNC)
            )
        )
        draws = engine.generate(
            PROMPTS[:1],
            SamplingParams(temperature=SAMPLE_T, max_tokens=1, n=DIST_DRAWS, seed=4, **TRUNC),
        )[0]
        res["first_tokens"] = [s.response_token_ids[0] for s in draws]
        if dims.tp == 1:
            res["errors"] = _error_messages(engine, model, copy, arch, dims)
    return out


def _error_messages(engine, model, copy, arch: ModelArch, dims: ParallelDims) -> dict[str, str]:
    from dapo_megatron.megatron.hf_weights import export_hf_weights
    from dapo_megatron.megatron.inference import MegatronGenerationBackend

    messages = {}
    exported = list(export_hf_weights(model, arch, dims))
    cases = {
        "missing": lambda: copy.update_weights(exported[:-1]),
        "shape": lambda: copy.update_weights([(exported[0][0], exported[0][1][:-1])]),
        "unknown": lambda: copy.update_weights([("model.foo.weight", exported[0][1])]),
        "pp2": lambda: MegatronGenerationBackend(model, arch, ParallelDims(1, 2, 1, 1, False)),
        "empty_prompt": lambda: engine.generate([[]], SamplingParams()),
        "vocab": lambda: engine.generate([[arch.vocab_size]], SamplingParams()),
    }
    for name, call in cases.items():
        try:
            call()
            messages[name] = "no error"
        except (KeyError, ValueError, NotImplementedError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
    engine.shutdown()
    try:
        engine.generate(PROMPTS, SamplingParams())
        messages["shutdown"] = "no error"
    except RuntimeError as e:
        messages["shutdown"] = str(e)
    return messages


def _worker(dims: ParallelDims, models: dict) -> dict:
    from dapo_megatron.config.run_plan import policy_plan
    from dapo_megatron.megatron.policy import MegatronPolicy

    # The policy initialises torch.distributed and Megatron's groups for everything here.
    policy = MegatronPolicy(policy_plan(_policy_config(models["qwen2"][0]), dims))
    result = {"refit": _refit(policy, dims), **_checkpoint_engines(dims, models)}
    policy.shutdown()
    return result


@functools.cache
def _results(layout: str, models_key: tuple) -> dict:
    """Run a layout once per session; every rank must return the same outputs."""
    dims = LAYOUTS[layout]
    per_rank = run_distributed(_worker, dims.world_size, dims, dict(models_key), timeout=300)
    for rank, result in enumerate(per_rank[1:], start=1):
        assert result == per_rank[0], f"{layout}: TP rank {rank} returned other samples"
    return per_rank[0]


@pytest.fixture(params=list(LAYOUTS))
def results(request, models) -> dict:
    return _results(request.param, tuple(models.items()))


# ---------------------------------------------------------------------------------------
# Checks


def _max_logprob_diff(hf_dir: str, prompt: list[int], sample: tuple, temperature: float) -> float:
    tokens, logprobs, _ = sample
    ref = torch.log_softmax(_hf_logits(hf_dir, prompt, tokens) / temperature, dim=-1)
    ref = ref.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    return (torch.tensor(logprobs) - ref).abs().max().item()


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_greedy_matches_hf_generate(results, models, family):
    hf_dir, _ = models[family]
    variants = [k for k in results[family] if k.startswith("greedy")]
    worst = 0.0
    for variant in variants:
        for prompt, (sample,) in zip(PROMPTS, results[family][variant], strict=True):
            tokens, logprobs, reason = sample
            assert tokens == _greedy_reference(hf_dir, prompt), (variant, prompt)
            assert reason == "length" and len(logprobs) == GREEDY_TOKENS
            worst = max(worst, _max_logprob_diff(hf_dir, prompt, sample, 1.0))
    print(f"{family} {variants}: max |logprob - hf| = {worst:.2e}")
    assert worst <= LOGPROB_ATOL


def test_seeded_sampling_is_reproducible(results, models):
    res = results["qwen2"]
    assert res["seed1"] == res["seed1_again"]
    assert res["seed1"] != res["seed2"]
    assert [[s[0] for s in g] for g in res["no_logprobs"]] == [
        [s[0] for s in g] for g in res["seed1"]
    ]
    assert all(s[1] == [] for g in res["no_logprobs"] for s in g)
    for groups in (res["seed1"], res["seed2"]):
        assert [len(g) for g in groups] == [3] * len(PROMPTS)
        # Independent samples of one prompt differ.
        assert all(len({tuple(s[0]) for s in g}) > 1 for g in groups)


def test_stop_tokens_and_max_tokens(results, models):
    hf_dir, _ = models["qwen2"]
    reasons = []
    for prompt, group in zip(PROMPTS, results["qwen2"]["seed1"], strict=True):
        for sample in group:
            tokens, logprobs, reason = sample
            reasons.append(reason)
            assert len(logprobs) == len(tokens) >= 1
            if reason == "stop":
                assert tokens[-1] in STOP_IDS and not set(tokens[:-1]) & set(STOP_IDS)
            else:
                assert len(tokens) == 12 and not set(tokens) & set(STOP_IDS)
            assert _max_logprob_diff(hf_dir, prompt, sample, SAMPLE_T) <= LOGPROB_ATOL
    assert {"stop", "length"} <= set(reasons), reasons


def _check_cut(full: list[list[tuple]], cut: list[list[tuple]], target: int) -> int:
    """A cut call against the same uncut call: ``target`` prompts or more finished exactly
    as uncut; every other prompt has an aborted sample; every aborted sample is a strict
    prefix of its uncut sample (the call stopped before it ended, on the same random
    stream). Returns the tokens the cut saved."""
    finished = 0
    saved = 0
    for full_group, cut_group in zip(full, cut, strict=True):
        assert len(cut_group) == len(full_group)
        if all(reason != "abort" for _, _, reason in cut_group):
            assert cut_group == full_group
            finished += 1
            continue
        for (tokens, logprobs, reason), (full_tokens, full_lp, _) in zip(
            cut_group, full_group, strict=True
        ):
            if reason == "abort":
                assert len(tokens) < len(full_tokens) and tokens == full_tokens[: len(tokens)]
                assert logprobs == full_lp[: len(tokens)]
                saved += len(full_tokens) - len(tokens)
            else:
                assert (tokens, logprobs) == (full_tokens, full_lp)
    assert finished >= target, (finished, target)
    assert finished < len(full), "nothing was cut"
    return saved


def test_a_cut_call_stops_once_enough_prompts_finished(results):
    res = results["qwen2"]
    saved = _check_cut(res["seed1"], res["cut"], target=1)
    saved_grouped = _check_cut(res["grouped_full"], res["grouped_cut"], target=1)
    print(f"tokens not generated: one batch {saved}, batches of 3 rows {saved_grouped}")
    assert saved > 0 and saved_grouped > 0
    # Batches of 3 rows: batches after the target was reached never start (empty aborts).
    assert any(s == ([], [], "abort") for g in res["grouped_cut"] for s in g)


def _allowed(logits_V: torch.Tensor) -> tuple[set[int], torch.Tensor]:
    """Tokens top-k then top-p may pick, and the truncated renormalised distribution."""
    probs = torch.softmax(logits_V.double() / SAMPLE_T, dim=-1)
    top = probs.topk(TRUNC["top_k"])
    renorm = top.values / top.values.sum()
    keep = (renorm.cumsum(0) - renorm) < TRUNC["top_p"]
    dist = torch.zeros_like(probs)
    dist[top.indices[keep]] = renorm[keep] / renorm[keep].sum()
    return set(top.indices[keep].tolist()), dist


def test_top_k_top_p_truncation(results, models):
    hf_dir, _ = models["qwen2"]
    res = results["qwen2"]
    for prompt, group in zip(PROMPTS, res["truncated"], strict=True):
        for sample in group:
            logits = _hf_logits(hf_dir, prompt, sample[0])
            for pos, token in enumerate(sample[0]):
                assert token in _allowed(logits[pos])[0], (prompt, pos, token)
            assert _max_logprob_diff(hf_dir, prompt, sample, SAMPLE_T) <= LOGPROB_ATOL
    allowed, expected = _allowed(_hf_logits(hf_dir, PROMPTS[0], [0])[0])
    counts = torch.bincount(torch.tensor(res["first_tokens"]), minlength=expected.numel())
    assert set(res["first_tokens"]) <= allowed
    total_variation = 0.5 * (counts / DIST_DRAWS - expected).abs().sum().item()
    print(
        f"top-k/top-p first-token total variation over {DIST_DRAWS} draws: "
        f"{total_variation:.4f} ({len(allowed)} allowed tokens)"
    )
    assert total_variation < 0.05


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_weight_specs_list_the_export(results, family):
    assert results[family]["specs_match_export"]


def _engine_difference(shared: list[list[tuple]], separate: list[list[tuple]]) -> str:
    """Where two engines' samples first differ, and their largest logprob difference over
    the tokens they share (before the first differing token of each sample)."""
    first, worst = None, 0.0
    for i, (g_a, g_b) in enumerate(zip(shared, separate, strict=True)):
        for j, ((tok_a, lp_a, _), (tok_b, lp_b, _)) in enumerate(zip(g_a, g_b, strict=True)):
            same = 0
            while same < min(len(tok_a), len(tok_b)) and tok_a[same] == tok_b[same]:
                same += 1
            if same < max(len(tok_a), len(tok_b)) and first is None:
                first = f"prompt {i} sample {j} token {same}"
            # The logprob of the first differing token is still comparable (same prefix).
            n = min(same + 1, len(lp_a), len(lp_b))
            if n:
                diff = (torch.tensor(lp_a[:n]) - torch.tensor(lp_b[:n])).abs().max().item()
                worst = max(worst, diff)
    return f"first differing token: {first or 'none'}, max |logprob diff| = {worst:.3e}"


def test_refit_matches_policy(results):
    refit = results["refit"]
    assert refit["padding_mask_ok"] == (True, True)
    for name in ("greedy", "sampled"):
        print(
            f"refit {name} shared vs separate: "
            f"{_engine_difference(refit[name]['shared'], refit[name]['separate'])}"
        )
    for name in ("greedy", "sampled"):
        assert refit[name]["shared"] == refit[name]["separate"], name
    assert refit["before"] != refit["greedy"]["separate"]  # the refit changed something
    engine_lp = torch.tensor(
        [lp for g in refit["greedy"]["separate"] for s in g for lp in s[1]]
        + [lp for g in refit["sampled"]["separate"] for s in g for lp in s[1]]
    )
    policy_lp = torch.tensor(
        [lp for row in refit["greedy"]["policy_lp"] for lp in row]
        + [lp for row in refit["sampled"]["policy_lp"] for lp in row]
    )
    mismatch = (torch.exp(engine_lp - policy_lp) - 1).abs().mean().item()
    max_diff = (engine_lp - policy_lp).abs().max().item()
    print(
        f"refit: mean |exp(lp_engine - lp_policy) - 1| = {mismatch:.2e}, "
        f"max |diff| = {max_diff:.2e} over {engine_lp.numel()} tokens"
    )
    assert mismatch < 1e-6


def test_errors_are_clear(models):
    messages = _results("tp1", tuple(models.items()))["qwen2"]["errors"]
    assert messages["missing"].startswith("KeyError") and "model.norm.weight" in messages["missing"]
    assert messages["shape"].startswith("ValueError") and "shape" in messages["shape"]
    assert messages["unknown"].startswith("KeyError") and "model.foo.weight" in messages["unknown"]
    assert messages["pp2"].startswith("NotImplementedError") and "pp=2" in messages["pp2"]
    assert messages["empty_prompt"].startswith("ValueError")
    assert messages["vocab"].startswith("ValueError") and "outside" in messages["vocab"]
    assert "shut down" in messages["shutdown"]


def test_sampling_params_from_run_config():
    from dapo_megatron.config.loader import load_config

    config = load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", validate=False).config
    params = SamplingParams.from_generation_config(config.generation, n=8, eos_token_ids=[2])
    gen = config.generation
    assert (params.temperature, params.top_p, params.top_k) == (
        gen.temperature,
        gen.top_p,
        gen.top_k,
    )
    assert params.max_tokens == gen.max_response_length and params.n == 8
    assert params.stop_token_ids == (gen.stop_token_ids or [2])


def test_sampling_params_validation():
    for bad in (
        dict(temperature=0.0),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=0),
        dict(max_tokens=0),
        dict(n=0),
        dict(stop_token_ids=[-1]),
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    sample = Sample(response_token_ids=[1, 2, 3], logprobs=[-0.1] * 3, finish_reason="stop")
    assert sample.response_length == 3
