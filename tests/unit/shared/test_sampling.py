"""``SamplingParams.finish_after_fraction``: its validation and the call's finish target."""

from __future__ import annotations

import pytest

from dapo_megatron.shared.sampling import FINISH_REASON_ABORT, Sample, SamplingParams


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.01, 2.0])
def test_finish_after_fraction_outside_0_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="finish_after_fraction"):
        SamplingParams(finish_after_fraction=fraction)


@pytest.mark.parametrize(
    ("fraction", "prompts", "target"),
    [
        (None, 10, None),  # no cut: every sample runs to its end
        (1.0, 10, 10),
        (0.5, 10, 5),
        (0.8, 10, 8),  # 0.8 x 10 is 8.000000000000002 in floats: still 8
        (0.3, 10, 3),
        (0.25, 3, 1),  # rounds up
        (0.01, 3, 1),  # at least one prompt
        (0.5, 1, 1),
    ],
)
def test_finish_target(fraction: float | None, prompts: int, target: int | None) -> None:
    assert SamplingParams(finish_after_fraction=fraction).finish_target(prompts) == target


def test_an_aborted_sample_keeps_its_tokens_and_logprobs() -> None:
    sample = Sample([5, 6], [-0.1, -0.2], FINISH_REASON_ABORT)
    assert sample.finish_reason == "abort" and sample.response_length == 2
