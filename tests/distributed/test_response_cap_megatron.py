"""``generation.response_cap: context`` with the Megatron engine on gloo (one CPU rank).

A tiny random Qwen2 (the tiny recipe's preset, context 512 positions, so the engine's own
limit never applies) generates with the caps the controller computes from the run config
(``controller.rollouts.response_cap.capped``): a short prompt's responses reach
generation.max_response_length, a long prompt's stop at max_total_sequence_length - its
length, both with finish reason "length", as NeMo RL's vLLM engine with max_model_len =
policy.max_total_sequence_length does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import run_distributed

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
TOTAL, CAP = 48, 16  # the tiny recipe's max_total_sequence_length and max_response_length
SHORT, LONG = 5, 41  # prompt lengths: caps min(16, 43) = 16 and min(16, 7) = 7


def _generate() -> list[list[tuple[int, str]]]:
    from dapo_megatron.config.loader import load_config
    from dapo_megatron.config.model_arch import PRESETS
    from dapo_megatron.config.parallel import ParallelDims
    from dapo_megatron.controller.rollouts.response_cap import capped
    from dapo_megatron.megatron.distributed import destroy_parallel, initialize_parallel
    from dapo_megatron.megatron.inference import MegatronGenerationBackend
    from dapo_megatron.megatron.model import build_model
    from dapo_megatron.shared.sampling import SamplingParams

    config = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        ["generation.response_cap=context", "data.max_prompt_length=44"],
    ).config
    dims = ParallelDims(tp=1, pp=1, cp=1, dp=1, sequence_parallel=False)
    initialize_parallel(dims, seed=0)
    arch = PRESETS["tiny-qwen2"]
    engine = MegatronGenerationBackend(build_model(arch, dims, "fp32"), arch, dims)
    prompts = [[3 + i % 50 for i in range(SHORT)], [7 + i % 40 for i in range(LONG)]]
    # No stop token: every response runs to its cap.
    sampling = SamplingParams(max_tokens=config.generation.max_response_length, n=2, seed=1)
    groups = engine.generate(prompts, capped(config, sampling, prompts))
    engine.shutdown()
    destroy_parallel()
    return [[(s.response_length, s.finish_reason) for s in group] for group in groups]


def test_a_long_prompts_responses_stop_at_the_context_a_short_ones_at_the_cap():
    (short, long_), *_ = run_distributed(_generate, 1, timeout=120)
    assert short == [(CAP, "length")] * 2
    assert long_ == [(TOTAL - LONG, "length")] * 2
