"""Partial rollouts (``rollout.partial_rollouts``): the groups a cut round aborted are kept
and continued by the next round instead of being thrown away.

With ``rollout.abort_tail`` a round stops once it has the finished groups it needs; the
samples still running come back "abort" with the tokens they have. Kept here, each such
sample is continued in the next round (of this step, or of the next step after the
refit): its prompt is the original prompt followed by its tokens so far, its response cap
what the response has left, one sample per request. The continued sample is the partial
tokens followed by the new ones, with the engine logprob of every token under the weights
that generated it, and ``Sample.token_versions`` naming those weights per token. The
trainer's importance correction (``dapo.loss.rollout_correction: tis``) uses exactly these
per-token logprobs, as for overlapped samples; the group's version, for the staleness
bound (``dapo.dynamic_sampling.max_carry_age``), is its oldest token's.

Continuations run to their end (they are never cut again), so a group is completed by
one continuation round at most. The pending groups are part of the checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dapo_megatron.shared.sampling import Sample, SamplingParams


@dataclass
class PartialGroup:
    """A prompt whose group a cut round aborted: its n samples, finished or not."""

    prompt_index: int
    """Index of the prompt in the training set."""
    samples: list[Sample]
    """The group's samples; those with finish reason "abort" are continued. Every token
    is tagged (``token_versions``)."""

    @property
    def version(self) -> int:
        """The oldest policy version among the group's tokens (its staleness)."""
        tagged = [v for s in self.samples for v in (s.token_versions or [])]
        return min(tagged) if tagged else self.generated_at

    generated_at: int = 0
    """The version of the round that cut it (the version of a group without tokens yet)."""


def tagged(sample: Sample, version: int) -> Sample:
    """``sample`` with every token not yet tagged attributed to ``version``."""
    known = list(sample.token_versions or [])
    return replace(sample, token_versions=known + [version] * (sample.response_length - len(known)))


class PartialRollouts:
    """The pending partial groups of a run (module docstring)."""

    def __init__(self) -> None:
        self.pending: list[PartialGroup] = []

    def keep(self, prompt_index: int, samples: Sequence[Sample], version: int) -> None:
        """Keep an aborted group (generated at policy ``version``) for the next round."""
        self.pending.append(
            PartialGroup(prompt_index, [tagged(s, version) for s in samples], version)
        )

    def drop_stale(self, version: int, max_age: int) -> int:
        """Drop the groups whose oldest token is more than ``max_age`` versions behind
        ``version`` (they could not be trained); returns how many."""
        fresh = [g for g in self.pending if version - g.version <= max_age]
        dropped = len(self.pending) - len(fresh)
        self.pending = fresh
        return dropped

    def requests(
        self, prompts: Sequence[Sequence[int]], response_cap: int
    ) -> tuple[list[list[int]], list[int], list[tuple[int, int]]]:
        """The continuation requests of every pending aborted sample: prompt + its tokens,
        the cap left, and (group, sample) of each."""
        inputs: list[list[int]] = []
        caps: list[int] = []
        where: list[tuple[int, int]] = []
        for g, group in enumerate(self.pending):
            for j, sample in enumerate(group.samples):
                if sample.finish_reason != "abort":
                    continue
                inputs.append([*prompts[group.prompt_index], *sample.response_token_ids])
                # An aborted sample is shorter than the cap (at the cap it would have
                # finished with "length").
                caps.append(response_cap - sample.response_length)
                where.append((g, j))
        return inputs, caps, where

    def continue_all(
        self,
        engines: Any,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        version: int,
        context_length: int | None = None,
    ) -> tuple[list[PartialGroup], dict[str, float]]:
        """Continue every pending group with the engines' current weights (``version``):
        one call, one sample per aborted sample, run to the end. Returns the completed
        groups (all of them: continuations are never cut) and metrics.

        ``context_length`` (``generation.response_cap: context``): each continuation is
        also cut to the context its input leaves; the input being the prompt and the
        tokens so far, that is what the prompt's own cap, min(max_tokens, context -
        prompt), has left."""
        inputs, caps, where = self.requests(prompts, sampling.max_tokens)
        groups, self.pending = self.pending, []
        if not inputs:
            return groups, {}
        params = replace(
            sampling, n=1, max_tokens_per_prompt=tuple(caps), finish_after_fraction=None
        )
        if context_length is not None:
            params = params.within_context([len(x) for x in inputs], context_length)
        start = time.perf_counter()
        outputs = engines.generate(inputs, params)
        seconds = time.perf_counter() - start
        reused = 0
        for (g, j), (continuation,) in zip(where, outputs, strict=True):
            head = groups[g].samples[j]
            reused += head.response_length
            groups[g].samples[j] = Sample(
                response_token_ids=[*head.response_token_ids, *continuation.response_token_ids],
                logprobs=[*head.logprobs, *continuation.logprobs],
                finish_reason=continuation.finish_reason,
                token_versions=[*(head.token_versions or [])]
                + [version] * continuation.response_length,
            )
        return groups, {
            "timing/generate_s": seconds,
            "num_generated_tokens": float(sum(o[0].response_length for o in outputs)),
            "rollout/num_partial_groups_continued": float(len(groups)),
            "rollout/num_partial_tokens_reused": float(reused),
        }

    def state_dict(self) -> dict[str, Any]:
        """The pending groups (picklable samples) for a checkpoint."""
        return {
            "pending": [(g.prompt_index, list(g.samples), g.generated_at) for g in self.pending]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = [PartialGroup(i, list(s), v) for i, s, v in state["pending"]]
