"""HF-parity helpers shared by the vLLM engine tests of new model families (Qwen3, MoE):
the HF model of a checkpoint and greedy parity (the engine: engine_builder.py)."""

from __future__ import annotations

import functools

import torch
import transformers

from dapo_megatron.generation.base import GenerationBackend
from dapo_megatron.shared.sampling import SamplingParams

MAX_MODEL_LEN = 64
LOGPROB_ATOL = 1e-4
GREEDY_TOKENS = 8


@functools.cache
def hf_model(hf_dir: str) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval()


@torch.no_grad()
def check_against_hf(engine: GenerationBackend, hf_dir: str, prompts: list[list[int]]) -> float:
    """Greedy responses equal HF's; returns max |engine logprob - HF log_softmax|."""
    model = hf_model(hf_dir)
    greedy = SamplingParams(temperature=1.0, top_k=1, max_tokens=GREEDY_TOKENS)
    worst = 0.0
    for prompt, (sample,) in zip(prompts, engine.generate(prompts, greedy), strict=True):
        ids = torch.tensor([prompt])
        expected = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=GREEDY_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        assert sample.response_token_ids == expected
        logits = model(torch.tensor([prompt + expected])).logits[0].float()
        ref = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        ref = ref.gather(-1, torch.tensor(expected)[:, None]).squeeze(-1)
        worst = max(worst, (torch.tensor(sample.logprobs) - ref).abs().max().item())
    assert worst <= LOGPROB_ATOL
    return worst
