"""The vLLM generation backend against HF transformers, on a real vLLM engine (CPU build).

Two tiny random fp32 Qwen2 checkpoints A and B (head_dim 32: vLLM's CPU attention supports
head sizes 32, 64, 80, ...; every weight randomised, HF's zero biases would hide bugs) with
the char tokenizer, and ONE in-process engine started from A (start-up dominates):

* greedy (top_k=1) responses equal HF's greedy ``generate`` at two temperatures, and the
  logprobs equal HF's ``log_softmax(logits / T)`` (measured max |diff| 2.4e-6; bound 1e-4);
* sampled logprobs with top-k/top-p truncation (T 0.8, top-k 8, top-p 0.9; and T 0.7,
  top-p 0.7) are still the FULL-vocabulary ``log_softmax(logits / T)`` (the base-module
  convention; measured 6.2e-6), and every sampled token is inside the truncated set;
* the engine runs vLLM's V1 model runner, pinned as on GPU (test_engine_config.py);
* the same seed reproduces the samples, another seed changes them, the n samples of a
  group differ, and so do the groups of two copies of one prompt; stop tokens end a
  response as its last token ("stop"), max_tokens and the context limit give "length";
* refit: ``update_weights`` with B's HF state dict (a generator) makes the engine generate
  B's greedy responses and logprobs (measured 4.9e-6); a second refit brings A back;
* the same refit into an engine in other processes (vLLM multiprocessing, the GPU
  default), where the tensors travel as bytes; a second engine start (~15-35 s).

The whole directory is skipped where vllm is not importable (conftest.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers
from engine_builder import start_engine

from dapo_megatron.data.tokenizer import build_char_tokenizer, save_char_tokenizer
from dapo_megatron.generation.base import GenerationBackend
from dapo_megatron.shared.sampling import Sample, SamplingParams

VOCAB = 64
MAX_MODEL_LEN = 64
LOGPROB_ATOL = 1e-4
GREEDY_TOKENS = 10
TEXTS = ["12+7=", "3*4=", "100-58=9", "5"]
STOP_IDS = list(range(2, VOCAB, 6))  # <eos> (2) and 10 other tokens: most samples stop


def _hf_config() -> transformers.Qwen2Config:
    return transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_MODEL_LEN,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def _save_model(out: Path, seed: int) -> None:
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(_hf_config())
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(
                1.0 + 0.2 * torch.randn_like(param)
                if name.endswith("norm.weight")
                else 0.2 * torch.randn_like(param)
            )
    model.save_pretrained(out)
    save_char_tokenizer(build_char_tokenizer(model_max_length=MAX_MODEL_LEN), out)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vllm_models")
    for seed, name in enumerate(("a", "b")):
        _save_model(root / name, seed)
    return {name: str(root / name) for name in ("a", "b")}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = build_char_tokenizer()
    return [tokenizer.encode(text) for text in TEXTS]


@pytest.fixture(scope="module")
def engine(model_dirs: dict[str, str]) -> Iterator[GenerationBackend]:
    backend = start_engine(model_dirs["a"], max_model_len=MAX_MODEL_LEN)
    yield backend
    backend.shutdown()


@functools.cache
def _hf_model(hf_dir: str) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval()


@torch.no_grad()
def _hf_logprobs(hf_dir: str, prompt: list[int], response: list[int], temperature: float):
    """HF ``log_softmax(logits / T)`` [len(response), V] that predicted each response token."""
    logits = _hf_model(hf_dir)(torch.tensor([prompt + response])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)


@torch.no_grad()
def _hf_greedy(hf_dir: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = _hf_model(hf_dir).generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=None,  # run to the cap, like the engine without stop tokens
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def _max_logprob_error(
    hf_dir: str, prompts: list[list[int]], groups: list[list[Sample]], temperature: float
) -> float:
    """Max |engine logprob - HF log_softmax(logits / T)| over every sampled token."""
    worst = 0.0
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in group:
            ref = _hf_logprobs(hf_dir, prompt, sample.response_token_ids, temperature)
            tokens = torch.tensor(sample.response_token_ids)
            expected = ref.gather(-1, tokens[:, None]).squeeze(-1)
            diff = (torch.tensor(sample.logprobs) - expected).abs().max().item()
            worst = max(worst, diff)
    return worst


def _assert_greedy_matches(engine, hf_dir, prompts, temperature) -> float:
    greedy = SamplingParams(temperature=temperature, top_k=1, max_tokens=GREEDY_TOKENS)
    groups = engine.generate(prompts, greedy)
    for prompt, (sample,) in zip(prompts, groups, strict=True):
        assert sample.response_token_ids == _hf_greedy(hf_dir, prompt, GREEDY_TOKENS)
        assert sample.finish_reason == "length"
        assert len(sample.logprobs) == GREEDY_TOKENS
    error = _max_logprob_error(hf_dir, prompts, groups, temperature)
    assert error <= LOGPROB_ATOL
    return error


def test_backend_satisfies_protocol(engine: GenerationBackend) -> None:
    assert isinstance(engine, GenerationBackend)
    # The model runner GPU engines run too (test_engine_config.py): V1, pinned.
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert engine._llm.llm_engine.vllm_config.use_v2_model_runner is False  # type: ignore[attr-defined]
    # Without CUDA the backend runs vLLM's CPU build with its CPU settings.
    if not torch.cuda.is_available():
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
        assert "VLLM_CPU_KVCACHE_SPACE" in os.environ


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_greedy_equals_hf(engine, model_dirs, prompts, temperature: float) -> None:
    error = _assert_greedy_matches(engine, model_dirs["a"], prompts, temperature)
    print(f"greedy T={temperature}: max |logprob - HF| = {error:.2e}")


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(0.8, 8, 0.9), (0.7, -1, 0.7)],  # the second: top-p alone (validation's 0.7), T 0.7
)
def test_truncated_sampling_reports_full_vocab_logprobs(
    engine, model_dirs, prompts, temperature: float, top_k: int, top_p: float
) -> None:
    sampling = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=12, n=4, seed=11
    )
    groups = engine.generate(prompts, sampling)
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in group:
            ref = _hf_logprobs(model_dirs["a"], prompt, sample.response_token_ids, temperature)
            for row, token in zip(ref, sample.response_token_ids, strict=True):
                # vLLM: top-k, then top-p over the renormalised top-k probabilities.
                probs, order = row.exp().topk(VOCAB if top_k == -1 else top_k)
                probs = probs / probs.sum()
                allowed = order[probs.cumsum(0) - probs < top_p]
                assert token in allowed.tolist()
    error = _max_logprob_error(model_dirs["a"], prompts, groups, temperature)
    print(f"T={temperature} top-k {top_k} top-p {top_p}: max |logprob - HF| = {error:.2e}")
    assert error <= LOGPROB_ATOL


def test_seeded_sampling_is_reproducible(engine, prompts) -> None:
    def draw(seed: int) -> list[list[tuple[list[int], list[float]]]]:
        sampling = SamplingParams(temperature=1.0, max_tokens=8, n=3, seed=seed)
        groups = engine.generate(prompts, sampling)
        return [[(s.response_token_ids, s.logprobs) for s in g] for g in groups]

    first = draw(seed=5)
    assert draw(seed=5) == first
    assert draw(seed=6) != first
    # The n samples of a prompt are independent draws, not n copies of one.
    assert any(len({tuple(tokens) for tokens, _ in group}) > 1 for group in first)
    # So are the samples of two copies of a prompt: each prompt has its own random streams
    # (vLLM alone would give both the streams seed + j).
    twice = engine.generate([prompts[0]] * 2, SamplingParams(max_tokens=8, n=3, seed=5))
    assert [s.response_token_ids for s in twice[0]] != [s.response_token_ids for s in twice[1]]


def test_stop_tokens_length_cap_and_n(engine, model_dirs, prompts) -> None:
    n, cap = 8, 12
    sampling = SamplingParams(temperature=1.0, max_tokens=cap, stop_token_ids=STOP_IDS, n=n, seed=3)
    groups = engine.generate(prompts, sampling)
    assert len(groups) == len(prompts) and all(len(g) == n for g in groups)
    reasons = set()
    for group in groups:
        for sample in group:
            tokens = sample.response_token_ids
            assert len(sample.logprobs) == len(tokens) >= 1
            assert all(t not in STOP_IDS for t in tokens[:-1])
            if sample.finish_reason == "stop":
                assert tokens[-1] in STOP_IDS and len(tokens) <= cap
            else:
                assert sample.finish_reason == "length"
                assert len(tokens) == cap and tokens[-1] not in STOP_IDS
            reasons.add(sample.finish_reason)
    assert reasons == {"stop", "length"}
    # The stop token's logprob is the model's like any other.
    assert _max_logprob_error(model_dirs["a"], prompts, groups, 1.0) <= LOGPROB_ATOL

    # logprobs=False leaves them empty.
    quiet = SamplingParams(temperature=1.0, max_tokens=4, n=2, seed=3, logprobs=False)
    assert all(not s.logprobs for g in engine.generate(prompts, quiet) for s in g)


def test_context_limit_finishes_with_length(engine, prompts) -> None:
    prompt = prompts[0]
    sampling = SamplingParams(temperature=1.0, top_k=1, max_tokens=MAX_MODEL_LEN)
    ((sample,),) = engine.generate([prompt], sampling)
    assert sample.finish_reason == "length"
    assert len(prompt) + sample.response_length == MAX_MODEL_LEN


def test_rejects_temperature_vllm_treats_as_greedy(engine, prompts) -> None:
    with pytest.raises(ValueError, match="top_k=1"):
        engine.generate(prompts, SamplingParams(temperature=1e-6, top_k=1, max_tokens=2))


def test_refit_from_hf_state_dict(engine, model_dirs, prompts) -> None:
    def state_dict(name: str) -> Iterator[tuple[str, torch.Tensor]]:
        # A generator, as a trainer's weight export is: the engine must stream it.
        yield from _hf_model(model_dirs[name]).state_dict().items()

    _assert_greedy_matches(engine, model_dirs["a"], prompts, 1.0)
    try:
        engine.update_weights(state_dict("b"))
        error = _assert_greedy_matches(engine, model_dirs["b"], prompts, 1.0)
        print(f"after refit to B: max |logprob - HF(B)| = {error:.2e}")
        # sleep/wake around a refit, as the controller does (no-ops on CPU).
        engine.sleep()
        engine.wake()
    finally:
        engine.update_weights(state_dict("a"))
    _assert_greedy_matches(engine, model_dirs["a"], prompts, 1.0)


def test_serialised_weights_round_trip() -> None:
    from dapo_megatron.generation.vllm_worker import deserialise_weights, serialise_weights

    weights = {
        "a.weight": torch.randn(3, 5),
        "b.weight": torch.randn(4, 2, dtype=torch.float64).to(torch.bfloat16),
        "c.bias": torch.arange(7, dtype=torch.float16)[::2],  # non-contiguous
    }
    back = dict(deserialise_weights(serialise_weights(weights.items())))
    assert list(back) == list(weights)
    for name, tensor in weights.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)


def test_refit_of_engine_in_other_processes(model_dirs, prompts, monkeypatch) -> None:
    """vLLM's multiprocessing (the GPU default): tensors reach the workers as bytes."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with start_engine(model_dirs["a"], max_model_len=MAX_MODEL_LEN, max_num_seqs=8) as engine:
        assert not engine._in_process
        engine.update_weights(_hf_model(model_dirs["b"]).state_dict().items())
        _assert_greedy_matches(engine, model_dirs["b"], prompts, 0.7)
