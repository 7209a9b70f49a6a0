"""Pre-rollout skipping: do not generate prompts predicted to give a zero-variance group.

Dynamic sampling drops a group whose samples were all right or all wrong only after
generating it; late in a math run most prompts are such groups (the GRESO paper,
arXiv 2506.02177, reports over 80%). A prompt's recent groups predict its next one well:
one solved by every sample twice in a row is likely solved again. This module keeps, per
prompt, the outcomes of its last groups and decides before generation whether to draw it.

The rule (ours; GRESO's idea, not its formula):

* a prompt's *streak* r is the number of its most recent groups, in a row, with zero
  variance (all correct or all wrong); a mixed group resets it to 0;
* a prompt with streak r is skipped with probability ``(1 - floor) * (1 - (1 - s)^r)``:
  0 for a prompt never seen or last mixed, growing with the streak towards ``1 - floor``,
  so every prompt is still generated with probability at least ``floor`` (``min_generate_prob``)
  and none is skipped forever (a prompt the policy forgets is found again);
* the strength s in [0, 1] tunes itself once per step towards a target share of
  zero-variance groups among those generated (``target_zero_var_share``): if the share
  was above the target, skipping was too timid and s grows by ``adapt_rate`` times the
  gap; below it, s shrinks. A policy still learning (few zero-variance groups) skips
  little; a saturated one skips much;
* of the prompts the rule would skip, a random ``audit_fraction`` is generated anyway and
  trained like any other: their outcomes measure the prediction's precision (the share
  of predicted zero-variance prompts that were zero-variance), the
  ``dynamic_sampling/predicted_zero_var_precision`` metric.

What is skipped is never trained on this visit, which is the point: dynamic sampling
would have dropped a zero-variance group anyway, so a correct prediction only saves
generation. A wrong one (the audit measures how often) loses a prompt that had signal,
for one visit. Training is otherwise unchanged: kept groups are exactly what dynamic
sampling keeps.

Every random decision comes from ``random.Random(f"{seed}/{n}")`` for the n-th decision,
and the history and n are in ``state_dict``: a resumed run decides exactly as an
uninterrupted one (bit-exact at K = 0). Prompts are dataset indices, so the history spans
epochs; each outcome records the policy version that generated it (overlapped rollouts
record outcomes in completion order, which is the order the trainer sees them).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal

Outcome = Literal["correct", "wrong", "mixed"]
"""A group's outcome: every sample right, every sample wrong, or both kinds."""
Decision = Literal["generate", "skip", "audit"]
"""What to do with a drawn prompt: generate it, skip it, or generate it as an audit of a
prediction to skip it."""

_OUTCOMES: tuple[Outcome, ...] = ("correct", "wrong", "mixed")
_STATE_FORMAT = 1
# Per step: prompts skipped, audits drawn, audits scored, of those confirmed zero-variance,
# groups recorded, of those zero-variance.
_STEP_KEYS = ("skipped", "audited", "audits_scored", "confirmed", "recorded", "zero_var")
_TOTAL_KEYS = ("skipped", "audited", "audits_scored", "confirmed")


@dataclass(frozen=True)
class SkipRule:
    """The knobs of the rule (module docstring); ``dapo.dynamic_sampling.skip_predicted``."""

    target_zero_var_share: float
    """Share of zero-variance groups among those generated that the strength aims for."""
    min_generate_prob: float
    """The exploration floor: every prompt is generated with at least this probability."""
    audit_fraction: float
    """Share of would-be-skipped prompts generated anyway to measure the precision."""
    history_len: int
    """Outcomes remembered per prompt (the longest streak that counts)."""
    initial_strength: float
    """The strength s before any step has tuned it."""
    adapt_rate: float
    """How far one step moves s per unit of (observed - target) zero-variance share."""

    def __post_init__(self) -> None:
        problems = skip_rule_problems(**vars(self))
        if problems:
            name, problem = problems[0]
            raise ValueError(f"{name} = {getattr(self, name)!r}: {problem}")


def skip_rule_problems(
    *,
    target_zero_var_share: float,
    min_generate_prob: float,
    audit_fraction: float,
    history_len: int,
    initial_strength: float,
    adapt_rate: float,
) -> list[tuple[str, str]]:
    """(field, constraint) of every limit the values break; the config validation reports
    them under their keys (the limits are written once, here)."""
    checks = [
        ("target_zero_var_share", 0.0 <= target_zero_var_share < 1.0, "must be in [0, 1)"),
        (
            "min_generate_prob",
            0.0 < min_generate_prob <= 1.0,
            "must be in (0, 1]: every prompt keeps a chance to be generated",
        ),
        ("audit_fraction", 0.0 <= audit_fraction <= 1.0, "must be in [0, 1]"),
        ("history_len", history_len >= 1, "must be >= 1"),
        ("initial_strength", 0.0 <= initial_strength <= 1.0, "must be in [0, 1]"),
        ("adapt_rate", adapt_rate >= 0.0, "must be >= 0"),
    ]
    return [(name, problem) for name, ok, problem in checks if not ok]


def outcome_of(scores: list[float]) -> Outcome:
    """The outcome of one group from its raw verifier scores (the dynamic-sampling metric:
    equal scores are zero variance)."""
    if all(s == scores[0] for s in scores):
        return "correct" if scores[0] > 0 else "wrong"
    return "mixed"


def streak(outcomes: list[tuple[Outcome, int]]) -> int:
    """Zero-variance outcomes in a row at the end of a prompt's history."""
    count = 0
    for outcome, _version in reversed(outcomes):
        if outcome == "mixed":
            break
        count += 1
    return count


def skip_probability(rule: SkipRule, strength: float, run: int) -> float:
    """Probability of skipping a prompt whose history ends with ``run`` zero-variance groups
    in a row: 0 at ``run = 0``, rising towards ``1 - min_generate_prob``."""
    if run <= 0:
        return 0.0
    return (1.0 - rule.min_generate_prob) * (1.0 - (1.0 - strength) ** run)


class PromptSkipper:
    """Per-prompt outcome history, the skip decisions, and their counters (module
    docstring). ``enabled=False`` generates every prompt and records nothing."""

    def __init__(self, rule: SkipRule | None, *, seed: int) -> None:
        self.rule = rule
        self.seed = seed
        self.strength = rule.initial_strength if rule else 0.0
        self._history: dict[int, list[tuple[Outcome, int]]] = {}
        self._decisions = 0  # random draws so far: the n of the n-th decision's stream
        self._audits_pending: dict[int, int] = {}  # prompt -> audits drawn, not yet scored
        self._step = dict.fromkeys(_STEP_KEYS, 0)
        self._totals = dict.fromkeys(_TOTAL_KEYS, 0)

    @property
    def enabled(self) -> bool:
        return self.rule is not None

    def history(self, prompt: int) -> list[tuple[Outcome, int]]:
        """The (outcome, policy version) pairs remembered for ``prompt``, oldest first."""
        return list(self._history.get(prompt, ()))

    def decide(self, prompt: int) -> Decision:
        """Whether to generate a drawn prompt (one random draw per prompt with a streak)."""
        if self.rule is None:
            return "generate"
        p = skip_probability(self.rule, self.strength, streak(self._history.get(prompt, [])))
        if p <= 0.0:
            return "generate"
        draw = random.Random(f"{self.seed}/{self._decisions}")
        self._decisions += 1
        if draw.random() >= p:
            return "generate"
        if draw.random() < self.rule.audit_fraction:
            self._audits_pending[prompt] = self._audits_pending.get(prompt, 0) + 1
            self._step["audited"] += 1
            return "audit"
        self._step["skipped"] += 1
        return "skip"

    def record(self, prompt: int, scores: list[float], version: int) -> None:
        """A generated group of ``prompt`` (policy ``version``) was scored."""
        if self.rule is None:
            return
        outcome = outcome_of(scores)
        history = self._history.setdefault(prompt, [])
        history.append((outcome, int(version)))
        del history[: -self.rule.history_len]
        self._step["recorded"] += 1
        self._step["zero_var"] += outcome != "mixed"
        pending = self._audits_pending.get(prompt, 0)
        if pending:
            # An audit of a prediction "zero variance": confirmed or not.
            self._step["audits_scored"] += 1
            self._step["confirmed"] += outcome != "mixed"
            if pending == 1:
                del self._audits_pending[prompt]
            else:
                self._audits_pending[prompt] = pending - 1

    def forget_pending(self, prompt: int) -> None:
        """A drawn prompt will not be scored after all (dropped unscored): it is no
        longer an open audit."""
        self._audits_pending.pop(prompt, None)

    def end_step(self) -> dict[str, float]:
        """Tune the strength from this step's groups and return the step's metrics:
        ``num_skipped``, ``num_audited`` (audits drawn), ``num_audits_scored``,
        ``skip_strength`` (the value this step's decisions used) and, when audits were
        scored, ``predicted_zero_var_precision`` (the share of them with zero variance)."""
        if self.rule is None:
            return {}
        step = self._step
        metrics = {
            "dynamic_sampling/num_skipped": float(step["skipped"]),
            "dynamic_sampling/num_audited": float(step["audited"]),
            "dynamic_sampling/num_audits_scored": float(step["audits_scored"]),
            "dynamic_sampling/skip_strength": self.strength,
        }
        if step["audits_scored"]:
            metrics["dynamic_sampling/predicted_zero_var_precision"] = (
                step["confirmed"] / step["audits_scored"]
            )
        if step["recorded"]:
            share = step["zero_var"] / step["recorded"]
            gap = share - self.rule.target_zero_var_share
            self.strength = min(1.0, max(0.0, self.strength + self.rule.adapt_rate * gap))
        for key in _TOTAL_KEYS:
            self._totals[key] += step[key]
        self._step = dict.fromkeys(_STEP_KEYS, 0)
        return metrics

    def totals(self) -> dict[str, int]:
        """Cumulative counts over the run's finished steps: skipped, audited (drawn),
        audits_scored, confirmed."""
        return dict(self._totals)

    # ------------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """The history, the decision counter, the strength and the counters (between
        steps; an overlapped run's open audits are kept too)."""
        return {
            "format_version": _STATE_FORMAT,
            "history": {str(k): [list(o) for o in v] for k, v in self._history.items()},
            "decisions": self._decisions,
            "strength": self.strength,
            "audits_pending": {str(k): v for k, v in self._audits_pending.items()},
            "step": dict(self._step),
            "totals": dict(self._totals),
        }

    def load_state_dict(self, state: dict[str, Any], *, num_prompts: int) -> None:
        """Restore ``state_dict``; prompts outside ``range(num_prompts)`` are dropped (a
        resume on changed data, ``checkpointing.allow_data_change``).

        Raises:
            ValueError: a malformed state, naming the entry.
        """
        if state.get("format_version") != _STATE_FORMAT:
            raise ValueError(f"skip state format {state.get('format_version')!r} is unknown")
        history: dict[int, list[tuple[Outcome, int]]] = {}
        for key, items in state["history"].items():
            prompt = int(key)
            if not 0 <= prompt < num_prompts:
                continue
            pairs: list[tuple[Outcome, int]] = []
            for outcome, version in items:
                if outcome not in _OUTCOMES:
                    raise ValueError(f"skip history of prompt {prompt}: outcome {outcome!r}")
                pairs.append((outcome, int(version)))
            history[prompt] = pairs
        strength = float(state["strength"])
        if not (0.0 <= strength <= 1.0 and math.isfinite(strength)):
            raise ValueError(f"skip strength {strength!r} is not in [0, 1]")
        self._history = history
        self._decisions = int(state["decisions"])
        self.strength = strength
        self._audits_pending = {
            int(k): int(v) for k, v in state["audits_pending"].items() if 0 <= int(k) < num_prompts
        }
        self._step = {k: int(state["step"][k]) for k in _STEP_KEYS}
        self._totals = {k: int(state["totals"][k]) for k in _TOTAL_KEYS}
