"""controller/rollouts/startup_check: the engines-vs-policy logprob probe run after the first refit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dapo_megatron.config.loader import load_config
from dapo_megatron.controller.rollouts.startup_check import (
    TOLERANCES,
    EngineLogprobMismatch,
    check_engine_logprobs,
    compare_logprobs,
    probe_batch,
)
from dapo_megatron.shared.sampling import Sample, SamplingParams

SAMPLING = SamplingParams(temperature=0.7, top_p=0.7)


def _logits(tokens: int = 16, vocab: int = 32_000, seed: int = 0) -> torch.Tensor:
    # Peaked rows like a language model's: a few likely tokens, a long tail.
    generator = torch.Generator().manual_seed(seed)
    return 3.0 * torch.randn(tokens, vocab, generator=generator, dtype=torch.float64)


def _draws(logits: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, ...]:
    """Sampled tokens (top-p at T), the contract's logprobs, and two wrong reports."""
    scaled = torch.log_softmax(logits / temperature, dim=-1)
    probs, order = scaled.exp().sort(dim=-1, descending=True)
    kept = (probs.cumsum(-1) - probs) < top_p
    mass = (probs * kept).sum(-1)
    choice = torch.multinomial(
        (probs * kept).float(), 1, generator=torch.Generator().manual_seed(1)
    )
    tokens = order.gather(-1, choice).squeeze(-1)
    right = scaled.gather(-1, tokens[:, None]).squeeze(-1)
    renormalised = right - mass.log()  # processed_logprobs: over the kept tokens only
    late_temperature = (
        torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1) / temperature
    )
    return right, renormalised, late_temperature


def test_agreement_within_tolerance_returns_metrics() -> None:
    right, _, _ = _draws(_logits(), SAMPLING.temperature, SAMPLING.top_p)
    noise = 0.01 * torch.randn(right.shape, generator=torch.Generator().manual_seed(2))
    metrics = compare_logprobs(right + noise, right, sampling=SAMPLING, precision="bf16")
    assert metrics["startup/engine_logprob_tokens"] == 16
    assert (
        0 < metrics["startup/engine_logprob_diff_mean"] < metrics["startup/engine_logprob_diff_max"]
    )


@pytest.mark.parametrize("wrong", ["renormalised", "late_temperature"])
def test_the_faults_it_is_for_exceed_the_half_precision_tolerance(wrong: str) -> None:
    right, renormalised, late = _draws(_logits(), SAMPLING.temperature, SAMPLING.top_p)
    engine = renormalised if wrong == "renormalised" else late
    with pytest.raises(EngineLogprobMismatch) as info:
        compare_logprobs(engine, right, sampling=SAMPLING, precision="bf16")
    message = str(info.value)
    for part in ("temperature=0.7", "top_p=0.7", "logprobs_mode='processed_logits'", "max |engine"):
        assert part in message
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in message and "policy.precision=bf16" in message


def test_fp32_is_tight_and_non_finite_fails() -> None:
    lp = torch.tensor([-0.5, -1.0, -2.0])
    assert compare_logprobs(lp + 1e-5, lp, sampling=SAMPLING, precision="fp32")
    with pytest.raises(EngineLogprobMismatch, match="max"):
        compare_logprobs(lp + 0.02, lp, sampling=SAMPLING, precision="fp32")
    with pytest.raises(EngineLogprobMismatch):
        compare_logprobs(
            torch.tensor([-0.5, float("nan"), -2.0]), lp, sampling=SAMPLING, precision="bf16"
        )
    with pytest.raises(ValueError, match="two"):
        compare_logprobs(lp, lp[:2], sampling=SAMPLING, precision="fp32")
    assert set(TOLERANCES) == {"fp32", "bf16", "fp16"}


def test_probe_batch_aligns_the_engine_logprobs_with_the_response_tokens() -> None:
    prompts = [[5, 6, 7], [5, 6, 7]]
    samples = [
        Sample([8, 9], [-0.1, -0.2], "length"),
        Sample([10, 11, 12], [-0.3, -0.4, -0.5], "stop"),
    ]
    batch = probe_batch(prompts, samples, pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 0], [5, 6, 7, 10, 11, 12]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    assert batch.lengths.tolist() == [5, 6]
    assert batch.rollout_logprobs[batch.loss_mask.bool()].tolist() == pytest.approx(
        [-0.1, -0.2, -0.3, -0.4, -0.5]
    )


class _Model:
    """A stand-in model: the logprob of token t after any context is -t / 100."""

    @staticmethod
    def logprob(token: int) -> float:
        return -token / 100


class _Engines:
    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.calls: list[tuple[int, SamplingParams]] = []

    def generate(self, prompts, sampling):
        self.calls.append((len(prompts), sampling))
        return [
            [
                Sample(
                    [3 + i, 4 + i],
                    [_Model.logprob(3 + i) + self.offset, _Model.logprob(4 + i)],
                    "length",
                )
            ]
            for i in range(len(prompts))
        ]


class _Policy:
    dp = 3

    def logprobs(self, batch):
        # Token-aligned like MegatronPolicy: position t holds token t's logprob.
        return batch.input_ids.double().neg() / 100 * (batch.input_ids != 0), None


def _ctx(precision: str = "fp32") -> SimpleNamespace:
    recipe = Path(__file__).resolve().parents[4] / "recipes" / "dapo-tiny-cpu-vllm.yaml"
    config = load_config(recipe, [f"policy.precision={precision}"], validate=False).config
    return SimpleNamespace(
        config=config, eos_ids=[2], pad_id=0, train=SimpleNamespace(input_ids=[[1, 5, 6]])
    )


def test_check_runs_the_probe_with_the_training_sampling(capsys) -> None:
    ctx = _ctx()
    engines = _Engines()
    metrics = check_engine_logprobs(ctx, engines, _Policy())  # type: ignore[arg-type]
    assert metrics["startup/engine_logprob_diff_max"] < 1e-6
    ((rows, sampling),) = engines.calls
    assert rows == 3  # max(engines, policy DP replicas)
    generation = ctx.config.generation
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (
        generation.temperature,
        generation.top_p,
        generation.top_k,
    )
    assert sampling.logprobs and sampling.n == 1 and sampling.max_tokens <= 16
    assert "[startup] engine logprobs match" in capsys.readouterr().out


def test_check_raises_when_the_engines_disagree() -> None:
    with pytest.raises(EngineLogprobMismatch, match="the rollout engines' logprobs disagree"):
        check_engine_logprobs(_ctx(), _Engines(offset=0.5), _Policy())  # type: ignore[arg-type]
