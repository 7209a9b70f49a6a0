"""DAPO dynamic sampling: keep only prompt groups whose samples disagree, until a batch is full.

A group whose N samples all get the same verifier score has zero advantage everywhere and
contributes no gradient (DAPO, arXiv 2503.14476, section 3.2). Dynamic sampling over-generates
prompts, drops such groups, and repeats generation rounds until ``num_prompts_per_step`` useful
groups are collected.

``DynamicSampler`` is the bookkeeping half of that loop, driven by the controller once per
training step::

    sampler.start_step()
    while not sampler.is_complete():
        n = sampler.prompts_for_next_round()
        groups, metric_GN, reward_GN = generate_and_score(n)   # caller's code
        sampler.add_round(groups, metric_GN, reward_GN)        # may raise DynamicSamplingExhausted
    batch, stats = sampler.finish_step()

Groups are opaque (picklable) Python objects, one per prompt; the caller passes per-sample
tensors alongside them. Valid groups beyond the batch can be carried into later steps.

Staleness is counted in policy versions (the version of a step is the number of optimizer
updates before it; the synchronous loop's step index): every kept group records the version
that generated it, and a group more than ``max_carry_age`` versions behind the step is never
returned. The synchronous loop generates at the step's own version, so only carried groups
age; overlapped rollouts (``streaming=True``) feed groups of older versions as they complete,
and the same bound (``rollout.max_staleness``) applies to them: one mechanism.

The two decisions it applies are pure functions of algorithms/group_filter.py: which groups
carry a signal (``groups_with_variance``) and how many prompts a round asks for under
``batch_multiplier: auto`` (``auto_batch_multiplier``).

Shape suffixes: ``_GN`` is G groups x N samples per group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Generic, Literal, TypeVar

import torch

from dapo_megatron.algorithms.group_filter import auto_batch_multiplier, groups_with_variance

__all__ = [
    "DynamicSampler",
    "DynamicSamplingExhausted",
    "DynamicSamplingStats",
]

G = TypeVar("G")

_STATE_FORMAT_VERSION = 2
_SURPLUS_POLICIES = ("carry", "discard")
_CARRY_ITEM_KEYS = frozenset({"group", "version", "reward_sum", "num_samples"})
_TOTAL_KEYS = (
    "num_steps",
    "num_gen_batches",
    "num_prompts_generated",
    "num_samples_generated",
    "num_kept_groups_generated",
    "num_discarded_valid_samples",
)


class DynamicSamplingExhausted(RuntimeError):
    """Raised when ``max_gen_batches`` generation rounds did not yield enough valid groups."""


@dataclass(frozen=True)
class DynamicSamplingStats:
    """Per-step statistics of dynamic sampling, returned by ``DynamicSampler.finish_step``."""

    num_gen_batches: int
    """Generation rounds run in this step (0 when carried groups filled the whole batch)."""

    num_prompts_generated: int
    """New prompts (groups) generated in this step, over all rounds."""

    num_samples_generated: int
    """New samples generated in this step: ``num_prompts_generated * group_size``."""

    num_kept_groups_generated: int
    """New groups kept (metric varies) in this step, before surplus handling."""

    keep_rate: float
    """``num_kept_groups_generated / num_prompts_generated``; 1.0 when nothing was generated."""

    num_carried_in: int
    """Groups taken from the carry cache into this step's batch."""

    num_carried_groups: int
    """Groups left in the carry cache after this step."""

    num_discarded_valid_samples: int
    """Samples of valid groups thrown away this step: surplus discards plus aged-out carries."""

    filtered_reward: float
    """Mean reward over all samples of the groups returned in the batch."""

    def to_metrics(self) -> dict[str, float]:
        """All fields as floats, keyed ``dynamic_sampling/<field name>``."""
        return {f"dynamic_sampling/{f.name}": float(getattr(self, f.name)) for f in fields(self)}


@dataclass
class _Entry(Generic[G]):
    """A kept group with what the sampler must remember about it."""

    group: G
    reward_sum: float
    num_samples: int
    version: int  # the policy version that generated the group


def _check_int(name: str, value: Any, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


class DynamicSampler(Generic[G]):
    """State machine of DAPO dynamic sampling with an optional cross-step carry cache.

    Within a step, kept groups accumulate until ``num_prompts_per_step`` are available:
    first groups carried over from earlier steps (oldest first), then new groups in generation
    order. ``finish_step`` returns exactly ``num_prompts_per_step`` groups; the valid surplus
    is either carried (usable while at most ``max_carry_age`` versions behind) or discarded.

    ``batch_multiplier`` is public and may be changed between steps; it is validated on
    assignment. With ``auto_max_multiplier`` the sampler sets it itself (``batch_multiplier:
    auto``): from the second step on, ``auto_batch_multiplier`` of a running average of the
    observed keep rates (each step halves the weight of the older ones). That average is part
    of ``state_dict``, so a resumed run continues with the same multipliers.
    """

    def __init__(
        self,
        *,
        num_prompts_per_step: int,
        batch_multiplier: float,
        max_gen_batches: int,
        surplus: Literal["carry", "discard"],
        max_carry_age: int,
        enabled: bool = True,
        group_size: int,
        auto_max_multiplier: float | None = None,
        streaming: bool = False,
    ) -> None:
        """Configure the sampler.

        Args:
            num_prompts_per_step: groups per training batch (>= 1).
            batch_multiplier: over-generation factor of each round (>= 1.0).
            max_gen_batches: a step generates at most this many full rounds' worth of
                prompts, ``max_gen_batches * round_prompts()``, in both loops (a
                synchronous round that needs fewer groups draws fewer prompts, and an
                overlapped request is smaller than a round); <= 0 is unlimited.
            surplus: what to do with valid groups beyond the batch: "carry" them into later
                steps or "discard" them.
            max_carry_age: a group is dropped once the step's policy version is more than this
                many versions past the one that generated it (>= 1).
            enabled: when False every group is kept and a step is a single round of exactly
                ``num_prompts_per_step`` prompts (plain GRPO batching).
            group_size: samples per group N (>= 1); every round's tensors must be ``[G, N]``.
            auto_max_multiplier: when given (>= 1), adapt ``batch_multiplier`` to the observed
                keep rate (class docstring), up to this value; ``batch_multiplier`` is the
                first step's. None keeps ``batch_multiplier`` fixed.
            streaming: groups arrive per request as they complete (overlapped rollouts), not
                per round: ``num_gen_batches`` then counts full rounds' worth of prompts.

        Raises:
            ValueError: naming the first bad argument.
        """
        _check_int("num_prompts_per_step", num_prompts_per_step, minimum=1)
        _check_int("max_gen_batches", max_gen_batches)
        _check_int("max_carry_age", max_carry_age, minimum=1)
        _check_int("group_size", group_size, minimum=1)
        if surplus not in _SURPLUS_POLICIES:
            raise ValueError(f"surplus must be one of {_SURPLUS_POLICIES}, got {surplus!r}")
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be a bool, got {enabled!r}")
        self.num_prompts_per_step = num_prompts_per_step
        self.batch_multiplier = batch_multiplier  # validated by the property setter
        self.max_gen_batches = max_gen_batches
        self.surplus = surplus
        self.max_carry_age = max_carry_age
        self.enabled = enabled
        self.group_size = group_size
        if auto_max_multiplier is not None and not auto_max_multiplier >= 1.0:
            raise ValueError(f"auto_max_multiplier must be >= 1, got {auto_max_multiplier!r}")
        self.auto_max_multiplier = auto_max_multiplier
        self.streaming = bool(streaming)
        self._keep_rate_ema: float | None = None
        self._version = 0  # the current (or last) step's policy version

        self._carry: list[_Entry[G]] = []
        self._totals: dict[str, int] = dict.fromkeys(_TOTAL_KEYS, 0)
        self._in_step = False
        self._reset_step_state()

    # ----------------------------------------------------------------------------- attributes

    @property
    def batch_multiplier(self) -> float:
        """Over-generation factor: a round asks for ``ceil(batch_multiplier * remaining)``."""
        return self._batch_multiplier

    @batch_multiplier.setter
    def batch_multiplier(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"batch_multiplier must be a real number, got {value!r}")
        if not (math.isfinite(value) and value >= 1.0):
            raise ValueError(f"batch_multiplier must be finite and >= 1.0, got {value!r}")
        self._batch_multiplier = float(value)

    @property
    def keep_rate_ema(self) -> float | None:
        """Running average of the steps' keep rates (None before the first step that
        generated anything; a step filled from the carry cache alone leaves it as it was)."""
        return self._keep_rate_ema

    @property
    def num_carried_groups(self) -> int:
        """Groups currently waiting in the carry cache."""
        return len(self._carry)

    @property
    def carried_versions(self) -> list[int]:
        """The policy version of each group in the carry cache (its age decides which
        steps it can still fill)."""
        return [entry.version for entry in self._carry]

    @property
    def num_kept_groups(self) -> int:
        """Groups available to the current step so far (carried in plus newly kept)."""
        return len(self._kept)

    @property
    def num_gen_batches(self) -> int:
        """Generation rounds run so far in the current (or last) step."""
        return self._rounds

    @property
    def totals(self) -> dict[str, int]:
        """Counters accumulated over all finished steps (saved by ``state_dict``)."""
        return dict(self._totals)

    # ------------------------------------------------------------------------------ the step

    def _reset_step_state(self) -> None:
        self._kept: list[_Entry[G]] = []
        self._num_carried_in = 0
        self._rounds = 0
        self._prompts_generated = 0
        self._samples_generated = 0
        self._kept_generated = 0
        self._discarded_samples = 0

    def _require_in_step(self, method: str) -> None:
        if not self._in_step:
            raise RuntimeError(
                f"DynamicSampler.{method}() called outside a step; call start_step()"
            )

    @property
    def version(self) -> int:
        """The policy version of the current (or last) step."""
        return self._version

    def is_stale(self, version: int) -> bool:
        """Whether a group generated by policy ``version`` is too old for the current step."""
        return self._version - version > self.max_carry_age

    def start_step(self, version: int | None = None) -> None:
        """Begin the step trained at policy ``version``: drop stale carried groups, pre-fill
        from the rest.

        Carried groups more than ``max_carry_age`` versions behind ``version`` are dropped and
        their samples counted in ``num_discarded_valid_samples``. When enabled, up to
        ``num_prompts_per_step`` of the remaining groups, oldest first, move into the step's
        batch; the others stay cached. When disabled nothing is pre-filled.

        Args:
            version: the step's policy version; None = the number of finished steps (the
                synchronous loop's step index).

        Raises:
            RuntimeError: if a step is already in progress.
            ValueError: if ``version`` is older than the previous step's.
        """
        if self._in_step:
            raise RuntimeError("DynamicSampler.start_step() called twice; call finish_step() first")
        if (
            self.enabled
            and self.auto_max_multiplier is not None
            and self._keep_rate_ema is not None
        ):
            self.batch_multiplier = auto_batch_multiplier(
                self._keep_rate_ema, max_multiplier=self.auto_max_multiplier
            )
        version = self._totals["num_steps"] if version is None else version
        _check_int("version", version, minimum=self._version)
        self._version = version
        self._reset_step_state()
        survivors: list[_Entry[G]] = []
        for entry in self._carry:
            if self.is_stale(entry.version):
                self._discarded_samples += entry.num_samples
            else:
                survivors.append(entry)
        # Stable sort: groups of one version keep their generation order.
        survivors.sort(key=lambda entry: entry.version)
        if self.enabled:
            self._kept = survivors[: self.num_prompts_per_step]
            self._carry = survivors[self.num_prompts_per_step :]
        else:
            self._carry = survivors
        self._num_carried_in = len(self._kept)
        self._in_step = True

    def is_complete(self) -> bool:
        """True when the current step holds at least ``num_prompts_per_step`` groups."""
        return self._in_step and len(self._kept) >= self.num_prompts_per_step

    def _exhausted_error(self) -> DynamicSamplingExhausted:
        kept_new = self._kept_generated
        keep_rate = kept_new / self._prompts_generated if self._prompts_generated else 0.0
        if keep_rate > 0:
            hint = (
                f"at this keep rate a single round needs "
                f"dapo.dynamic_sampling.batch_multiplier >= ~{1.0 / keep_rate:.2f}"
            )
        else:
            hint = (
                "no generated group had any variance in its metric; check the verifier and "
                "the difficulty of the data"
            )
        return DynamicSamplingExhausted(
            f"Dynamic sampling exhausted: {self._prompts_generated} prompts generated "
            f"(dapo.dynamic_sampling.max_gen_batches={self.max_gen_batches} full rounds of "
            f"{self.round_prompts()}, in {self._rounds} rounds), {len(self._kept)} groups kept "
            f"({self._num_carried_in} carried in + {kept_new} new) but "
            f"{self.num_prompts_per_step} needed; observed keep rate {keep_rate:.3f} "
            f"(dapo.dynamic_sampling.batch_multiplier={self.batch_multiplier:g}). Raise "
            f"dapo.dynamic_sampling.max_gen_batches (<= 0 means unlimited) or "
            f"dapo.dynamic_sampling.batch_multiplier; {hint}."
        )

    def _check_can_generate(self, method: str) -> None:
        self._require_in_step(method)
        if self.is_complete():
            raise RuntimeError(
                f"DynamicSampler.{method}() called on a complete step; call finish_step()"
            )
        if self._rounds_exhausted():
            raise self._exhausted_error()

    def _rounds_exhausted(self) -> bool:
        # One meaning in both loops: prompts, counted in full rounds (rounds and requests
        # differ in size; verl's fixed-size generation batches are full rounds).
        if self.max_gen_batches <= 0:
            return False
        return self._prompts_generated >= self.max_gen_batches * self.round_prompts()

    def round_prompts(self) -> int:
        """Prompts in one full round at the current multiplier (the unit of
        ``max_gen_batches``)."""
        return max(1, math.ceil(round(self.batch_multiplier * self.num_prompts_per_step, 9)))

    def prompts_for_next_round(self) -> int:
        """Number of NEW prompts to generate in the next round.

        ``ceil(batch_multiplier * remaining)`` with ``remaining = num_prompts_per_step - kept``;
        when disabled, exactly ``remaining`` (``num_prompts_per_step`` on the single round).

        Raises:
            RuntimeError: outside a step or when the step is already complete.
            DynamicSamplingExhausted: when ``max_gen_batches`` rounds have already run.
        """
        self._check_can_generate("prompts_for_next_round")
        remaining = self.num_prompts_per_step - len(self._kept)
        if not self.enabled:
            return remaining
        # Round away float noise first: 1.1 * 10 is 11.000000000000002, whose ceil would be 12.
        wanted = math.ceil(round(self.batch_multiplier * remaining, 9))
        return max(remaining, wanted)

    def _validate_round(
        self, groups: Sequence[G], metric_GN: torch.Tensor, reward_GN: torch.Tensor
    ) -> None:
        if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
            raise ValueError(f"groups must be a sequence of groups, got {type(groups).__name__}")
        expected = (len(groups), self.group_size)
        for name, tensor in (("metric_GN", metric_GN), ("reward_GN", reward_GN)):
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tuple(tensor.shape) != expected:
                raise ValueError(
                    f"{name} must have shape [len(groups), group_size]={expected}, got "
                    f"{tuple(tensor.shape)}"
                )
        if reward_GN.is_floating_point() and not torch.isfinite(reward_GN).all():
            raise ValueError("reward_GN must be finite (found NaN or inf)")

    def add_round(
        self,
        groups: Sequence[G],
        metric_GN: torch.Tensor,
        reward_GN: torch.Tensor,
        version: int | None = None,
    ) -> None:
        """Record one generation round (streaming: one completed request) and keep its
        groups with a varying metric.

        Args:
            groups: the round's G groups, in generation order.
            metric_GN: raw verifier metric per sample, ``[G, group_size]``; decides keeping.
            reward_GN: shaped reward per sample, ``[G, group_size]``; only feeds
                ``filtered_reward``.
            version: the policy version that generated the groups (None = the step's); the
                caller checks ``is_stale`` first (a stale round raises ValueError).

        Raises:
            ValueError: on shapes other than ``[len(groups), group_size]`` or non-finite values
                (the round is then not counted).
            RuntimeError: outside a step or when the step is already complete.
            DynamicSamplingExhausted: if the step is still incomplete after this round and
                ``max_gen_batches`` (> 0) rounds have run, or if they had already run.
        """
        self._check_can_generate("add_round")
        self._validate_round(groups, metric_GN, reward_GN)
        version = self._version if version is None else version
        _check_int("version", version)
        if version > self._version or self.is_stale(version):
            raise ValueError(
                f"a round of policy version {version} cannot train at version {self._version} "
                f"(at most {self.max_carry_age} behind)"
            )
        if self.enabled:
            keep_G = groups_with_variance(metric_GN)
        else:
            keep_G = torch.ones(len(groups), dtype=torch.bool)
        # One host transfer per round instead of one .item() per group.
        keep_flags = keep_G.tolist()
        reward_sums = reward_GN.detach().to(torch.float64).sum(dim=1).tolist()

        self._prompts_generated += len(groups)
        if self.streaming:
            self._rounds = math.ceil(self._prompts_generated / self.round_prompts())
        else:
            self._rounds += 1
        self._samples_generated += len(groups) * self.group_size
        for group, keep, reward_sum in zip(groups, keep_flags, reward_sums, strict=True):
            if keep:
                self._kept.append(_Entry(group, float(reward_sum), self.group_size, version))
                self._kept_generated += 1

        if not self.is_complete() and self._rounds_exhausted():
            raise self._exhausted_error()

    def finish_step(self) -> tuple[list[G], DynamicSamplingStats]:
        """End the step: return the batch and handle the surplus.

        Returns:
            Exactly ``num_prompts_per_step`` groups (carried ones first, then new ones in
            generation order) and the step's ``DynamicSamplingStats``. Surplus valid groups
            enter the carry cache (``surplus="carry"``) or are discarded and their
            samples counted (``surplus="discard"``).

        Raises:
            RuntimeError: outside a step or when the step is not complete.
        """
        self._require_in_step("finish_step")
        if not self.is_complete():
            raise RuntimeError(
                f"DynamicSampler.finish_step() called on an incomplete step: "
                f"{len(self._kept)} of {self.num_prompts_per_step} groups kept"
            )
        batch = self._kept[: self.num_prompts_per_step]
        surplus = self._kept[self.num_prompts_per_step :]
        if self.surplus == "carry":
            self._carry.extend(surplus)
        else:
            self._discarded_samples += sum(entry.num_samples for entry in surplus)

        num_samples = sum(entry.num_samples for entry in batch)
        filtered_reward = sum(entry.reward_sum for entry in batch) / num_samples
        generated = self._prompts_generated
        stats = DynamicSamplingStats(
            num_gen_batches=self._rounds,
            num_prompts_generated=generated,
            num_samples_generated=self._samples_generated,
            num_kept_groups_generated=self._kept_generated,
            keep_rate=self._kept_generated / generated if generated else 1.0,
            num_carried_in=self._num_carried_in,
            num_carried_groups=len(self._carry),
            num_discarded_valid_samples=self._discarded_samples,
            filtered_reward=filtered_reward,
        )
        self._totals["num_steps"] += 1
        for key in _TOTAL_KEYS[1:]:
            self._totals[key] += getattr(stats, key)
        # A step filled from the carry cache alone observed no keep rate (its 1.0 is a
        # convention): averaging it in would inflate the estimate, so that the next rounds
        # (and overlapped requests) are sized too small and come up short.
        if generated:
            ema = self._keep_rate_ema
            self._keep_rate_ema = (
                stats.keep_rate if ema is None else 0.5 * ema + 0.5 * stats.keep_rate
            )
        self._in_step = False
        self._kept = []
        return [entry.group for entry in batch], stats

    # ------------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume: the carry cache and the cumulative counters.

        Groups are stored as-is (they must be picklable). Only valid between steps.

        Raises:
            RuntimeError: during a step, whose partial batch cannot be resumed.
        """
        if self._in_step:
            raise RuntimeError(
                "DynamicSampler.state_dict() called during a step; save between steps"
            )
        return {
            "format_version": _STATE_FORMAT_VERSION,
            "carry": [
                {
                    "group": entry.group,
                    "version": entry.version,
                    "reward_sum": entry.reward_sum,
                    "num_samples": entry.num_samples,
                }
                for entry in self._carry
            ],
            "totals": dict(self._totals),
            "keep_rate_ema": self._keep_rate_ema,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the carry cache and counters saved by ``state_dict``.

        Raises:
            RuntimeError: during a step.
            ValueError: if ``state`` is malformed or from another format version.
        """
        if self._in_step:
            raise RuntimeError("DynamicSampler.load_state_dict() called during a step")
        fmt = state.get("format_version") if isinstance(state, dict) else None
        if fmt not in (1, _STATE_FORMAT_VERSION):
            raise ValueError(
                f"state['format_version'] must be {_STATE_FORMAT_VERSION} (or 1), got {fmt!r}"
            )
        if not isinstance(state.get("carry"), list) or not isinstance(state.get("totals"), dict):
            raise ValueError("state must hold a 'carry' list and a 'totals' dict")
        totals = state["totals"]
        if set(totals) != set(_TOTAL_KEYS):
            raise ValueError(
                f"state['totals'] must have keys {sorted(_TOTAL_KEYS)}, got {sorted(totals)}"
            )
        for key in _TOTAL_KEYS:
            _check_int(f"state['totals'][{key!r}]", totals[key], minimum=0)
        steps = int(totals["num_steps"])
        item_keys = _CARRY_ITEM_KEYS if fmt == 2 else (_CARRY_ITEM_KEYS - {"version"}) | {"age"}
        carry: list[_Entry[G]] = []
        for index, item in enumerate(state["carry"]):
            where = f"state['carry'][{index}]"
            if not isinstance(item, dict) or set(item) != item_keys:
                raise ValueError(f"{where} must be a dict with keys {sorted(item_keys)}")
            if fmt == 1:
                # Saved between steps of the synchronous loop: a group carried for ``age``
                # steps was generated by the step before those, version steps - 1 - age.
                _check_int(f"{where}['age']", item["age"], minimum=0)
                item = {**item, "version": steps - 1 - item["age"]}
            _check_int(f"{where}['version']", item["version"])
            _check_int(f"{where}['num_samples']", item["num_samples"], minimum=1)
            reward_sum = item["reward_sum"]
            if isinstance(reward_sum, bool) or not isinstance(reward_sum, (int, float)):
                raise ValueError(f"{where}['reward_sum'] must be a number, got {reward_sum!r}")
            carry.append(
                _Entry(item["group"], float(reward_sum), item["num_samples"], item["version"])
            )
        ema = state.get("keep_rate_ema")  # absent in states saved before it was kept here
        if ema is not None and (
            isinstance(ema, bool) or not isinstance(ema, (int, float)) or not 0.0 <= ema <= 1.0
        ):
            raise ValueError(f"state['keep_rate_ema'] must be None or in [0, 1], got {ema!r}")
        self._carry = carry
        self._totals = {key: int(totals[key]) for key in _TOTAL_KEYS}
        self._version = max(steps - 1, 0)  # the last finished step's
        self._keep_rate_ema = None if ema is None else float(ema)
