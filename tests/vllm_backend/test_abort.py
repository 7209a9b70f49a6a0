"""Cutting a call's tail on a real vLLM engine (CPU build): ``finish_after_fraction``.

A tiny random fp32 Qwen2 and one in-process engine that runs at most 4 sequences at once, so
that a call over 6 prompts x 3 samples queues: when the cut comes, some samples are running
(partial tokens) and some were never scheduled (empty). Stop tokens make the samples end at
very different lengths (1 to 54 tokens for the seed used here). Each test runs a seeded call
in full on the clean engine, the same call cut, and the full call again:

* the cut call returns every prompt's n samples; at least ceil(fraction x prompts) prompts
  finished, each equal to the full call's token for token (same logprobs, same reasons: the
  engine schedules and samples as ``LLM.generate`` until the cut, and per-request seeds make
  a sample independent of the batch it runs in); every other prompt has an "abort" sample,
  whose tokens and logprobs are a strict prefix of the full call's sample (a never-scheduled
  one is empty);
* the cut call took fewer engine steps and generated fewer tokens (printed);
* afterwards the engine holds no request (output processor, scheduler, parent requests of
  the n > 1 fan-out) and every KV block is free, and the full call gives the same result as
  on the clean engine (nothing leaked);
* the same with the engine core in another process (the GPU default), as far as this
  process can see it.

The whole directory is skipped where vllm is not importable (conftest.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from engine_builder import start_engine

from dapo_megatron.shared.sampling import Sample, SamplingParams

VOCAB = 64
MAX_MODEL_LEN = 128
STOP_IDS = [2, 9, 17, 33]


def _save_model(out: Path) -> None:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_MODEL_LEN,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(
                1.0 + 0.2 * torch.randn_like(param)
                if name.endswith("norm.weight")
                else 0.2 * torch.randn_like(param)
            )
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("vllm_abort_model")
    _save_model(out)
    return str(out)


@pytest.fixture(scope="module")
def engine(model_dir: str) -> Iterator[Any]:
    # max_num_seqs 4: a call queues, so the cut finds samples not yet scheduled.
    backend = start_engine(model_dir, max_model_len=MAX_MODEL_LEN, max_num_seqs=4)
    yield backend
    backend.shutdown()


def _prompts(count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [
        torch.randint(
            3, VOCAB, (int(torch.randint(4, 9, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(count)
    ]


def _run(engine: Any, prompts: list[list[int]], sampling: SamplingParams) -> tuple[Any, int]:
    """The call's groups and the engine steps it took (``LLMEngine.step`` calls: both
    ``LLM.generate`` and the cut loop step the engine through it)."""
    llm_engine = engine._llm.llm_engine
    step = llm_engine.step
    steps = 0

    def counted() -> Any:
        nonlocal steps
        steps += 1
        return step()

    llm_engine.step = counted
    try:
        return engine.generate(prompts, sampling), steps
    finally:
        del llm_engine.step  # the instance attribute: the class method again


def _check_engine_empty(engine: Any) -> None:
    llm_engine = engine._llm.llm_engine
    assert not llm_engine.has_unfinished_requests()
    assert not llm_engine.output_processor.parent_requests
    assert not llm_engine.output_processor.external_req_ids
    core = llm_engine.engine_core.engine_core  # in process: VLLM_ENABLE_V1_MULTIPROCESSING=0
    scheduler = core.scheduler
    assert not scheduler.requests and not scheduler.running and not scheduler.waiting
    pool = scheduler.kv_cache_manager.block_pool
    # Every block but vLLM's reserved null block is free (cached prefixes count as free).
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def _check_cut(
    full: list[list[Sample]], cut: list[list[Sample]], sampling: SamplingParams
) -> dict[str, int]:
    target = sampling.finish_target(len(full))
    assert target is not None
    assert len(cut) == len(full)
    stats = {"finished": 0, "aborted": 0, "never_started": 0, "tokens_saved": 0}
    for full_group, cut_group in zip(full, cut, strict=True):
        assert len(cut_group) == sampling.n
        if all(s.finish_reason != "abort" for s in cut_group):
            assert cut_group == full_group
            stats["finished"] += 1
            continue
        for sample, uncut in zip(cut_group, full_group, strict=True):
            if sample.finish_reason != "abort":
                assert sample == uncut
                continue
            length = sample.response_length
            assert len(sample.logprobs) == length < uncut.response_length
            assert sample.response_token_ids == uncut.response_token_ids[:length]
            assert sample.logprobs == uncut.logprobs[:length]
            stats["aborted"] += 1
            stats["never_started"] += length == 0
            stats["tokens_saved"] += uncut.response_length - length
    assert stats["finished"] >= target
    assert stats["finished"] < len(full), "nothing was cut"
    return stats


@pytest.mark.parametrize(("num_prompts", "n"), [(6, 3), (8, 1)])
def test_cut_call_aborts_the_tail_and_leaves_the_engine_clean(engine, num_prompts, n) -> None:
    prompts = _prompts(num_prompts)
    sampling = SamplingParams(temperature=1.0, max_tokens=64, n=n, seed=7, stop_token_ids=STOP_IDS)
    cut_sampling = dataclasses.replace(sampling, finish_after_fraction=0.5)
    full, full_steps = _run(engine, prompts, sampling)
    _check_engine_empty(engine)
    cut, cut_steps = _run(engine, prompts, cut_sampling)
    _check_engine_empty(engine)
    stats = _check_cut(full, cut, cut_sampling)
    print(
        f"prompts {num_prompts} x n {n}: {stats}; engine steps {cut_steps} cut, {full_steps} full"
    )
    assert cut_steps < full_steps
    assert stats["tokens_saved"] > 0
    if n > 1:
        # 18 samples, 4 at a time: the cut comes before the last ones were scheduled.
        assert stats["never_started"] > 0
    again, _ = _run(engine, prompts, sampling)
    assert again == full


def test_a_cut_that_cuts_nothing_is_the_plain_call(engine) -> None:
    """fraction 1.0 (every prompt must finish) runs ``LLM.generate``: the same samples."""
    prompts = _prompts(4)
    sampling = SamplingParams(temperature=1.0, max_tokens=16, n=2, seed=5, stop_token_ids=[2])
    full = engine.generate(prompts, sampling)
    assert (
        engine.generate(prompts, dataclasses.replace(sampling, finish_after_fraction=1.0)) == full
    )


def test_continuing_the_aborted_samples_gives_the_uncut_responses(engine) -> None:
    """Partial rollouts on vLLM: greedy (top_k=1), so an uncut call is the reference. The
    aborted samples, continued as prompt + tokens so far with the cap they have left
    (``max_tokens_per_prompt``), end exactly as the uncut call's samples, with the same
    logprobs (fp32 rounding), and never run past the response cap."""
    prompts = _prompts(6)
    cap = 48
    sampling = SamplingParams(
        temperature=1.0, top_k=1, max_tokens=cap, n=1, seed=3, stop_token_ids=STOP_IDS
    )
    full = engine.generate(prompts, sampling)
    cut = engine.generate(prompts, dataclasses.replace(sampling, finish_after_fraction=0.3))
    aborted = [i for i, (s,) in enumerate(cut) if s.finish_reason == "abort"]
    assert aborted, "nothing was cut"
    heads = [cut[i][0] for i in aborted]
    continued = engine.generate(
        [[*prompts[i], *h.response_token_ids] for i, h in zip(aborted, heads, strict=True)],
        dataclasses.replace(
            sampling, max_tokens_per_prompt=tuple(cap - h.response_length for h in heads)
        ),
    )
    _check_engine_empty(engine)
    for i, head, (tail,) in zip(aborted, heads, continued, strict=True):
        (want,) = full[i]
        tokens = head.response_token_ids + tail.response_token_ids
        assert tokens == want.response_token_ids and tail.finish_reason == want.finish_reason
        assert len(tokens) <= cap
        torch.testing.assert_close(
            torch.tensor(head.logprobs + tail.logprobs),
            torch.tensor(want.logprobs),
            atol=1e-4,
            rtol=0,
        )


def test_cut_call_on_an_engine_in_another_process(model_dir, monkeypatch) -> None:
    """vLLM's multiprocessing (the GPU default): the core runs ahead of the outputs we read
    and receives the abort asynchronously. What this process can reach: the cut call's
    samples (same checks), no request left in the output processor, and the full call after
    the cut equal to the one before (second engine start, ~15-35 s)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    prompts = _prompts(6)
    sampling = SamplingParams(temperature=1.0, max_tokens=64, n=3, seed=7, stop_token_ids=STOP_IDS)
    cut_sampling = dataclasses.replace(sampling, finish_after_fraction=0.5)
    with start_engine(model_dir, max_model_len=MAX_MODEL_LEN, max_num_seqs=4) as engine:
        assert not engine._in_process
        full = engine.generate(prompts, sampling)
        cut = engine.generate(prompts, cut_sampling)
        llm_engine = engine._llm.llm_engine
        assert not llm_engine.has_unfinished_requests()
        assert not llm_engine.output_processor.parent_requests
        print(f"in another process: {_check_cut(full, cut, cut_sampling)}")
        assert engine.generate(prompts, sampling) == full
