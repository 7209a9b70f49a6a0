"""Overlapped rollouts (controller/rollouts/rollout_stream.py) and their overlap schedule
(controller/rollouts/overlap.py) with scripted engines: no Ray, no Megatron. The fake
engine knows which weights it holds and stamps them into every sample, so a test can
check the version the stream recorded against the one that generated."""

from __future__ import annotations

import itertools
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dapo_megatron.config.loader import load_config
from dapo_megatron.controller.context import RunContext
from dapo_megatron.controller.rollouts.rollout_planner import prompts_for
from dapo_megatron.controller.rollouts.rollout_stream import RolloutStream, _Request
from dapo_megatron.shared.sampling import Sample
from unit.fake_context import fake_context

REPO = Path(__file__).resolve().parents[4]
N = 4  # samples per prompt
PROMPTS = 400
WEIGHTS_TOKEN = 10  # a sample's first token is WEIGHTS_TOKEN + the engine's weight version


class ScriptedEngines:
    """Split-mode engines as Ray actors run them: calls execute in the order submitted, so
    a request is generated with the weights of the transfers submitted before it, whatever
    the stream believes. ``submit`` records the prompts and that version (the transfers
    queued so far); ``timed_results`` answers with it; ``start_refit`` queues a transfer.
    ``in_flight_at_refit`` counts transfers queued behind an unfinished request."""

    def __init__(self, fail_on_request: int | None = None) -> None:
        self.weights = 0  # transfers submitted: the version of the next request
        self.submitted: list[list[int]] = []
        self.versions: list[int] = []  # the weights each request is generated with
        self.active = 0
        self.in_flight_at_refit = 0
        self.fail_on_request = fail_on_request
        self.lock = threading.Lock()

    def submit(self, prompts, sampling):
        with self.lock:
            self.submitted.append([p[0] for p in prompts])
            self.versions.append(self.weights)
            self.active += 1
            return (len(self.submitted) - 1, [p[0] for p in prompts], sampling.n, self.weights)

    def timed_results(self, refs):
        index, prompts, n, weights = refs
        if index == self.fail_on_request:
            raise RuntimeError("engine 0 raised: scripted failure")
        with self.lock:
            self.active -= 1
        # Prompt p's samples alternate right/wrong: every group varies (keep rate 1).
        token = WEIGHTS_TOKEN + weights
        groups = [[Sample([token, 2], [-0.5, -0.1], "stop") for _ in range(n)] for _ in prompts]
        return groups, 0.001 * len(prompts)

    queues_refits = True

    def start_refit(self, policy):
        with self.lock:
            self.in_flight_at_refit += self.active > 0
            self.weights += 1
        return SimpleNamespace(finish=lambda: 0.0)

    def refit_metrics(self):
        return {}


class AlternatingVerifier:
    def score_batch(self, texts, truths):
        return SimpleNamespace(
            scores=[float(j % 2) for j in range(len(texts))], metrics={"reward/timeouts": 0.0}
        )


class HalfVerifier:
    """Prompts whose ground truth is "vary" get alternating scores (a kept group), the
    others all zeros (filtered out): with prompts drawn in order, a keep rate of 0.5."""

    def score_batch(self, texts, truths):
        scores = [float(j % 2) if t == "vary" else 0.0 for j, t in enumerate(truths)]
        return SimpleNamespace(scores=scores, metrics={"reward/timeouts": 0.0})


def _ctx(*overrides: str, verifier=None) -> RunContext:
    plan = load_config(
        REPO / "recipes" / "dapo-tiny-cpu.yaml",
        [
            f"dapo.num_generations_per_prompt={N}",
            "dapo.num_prompts_per_step=4",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8",
            "data.shuffle=false",
            "cluster.colocated=false",
            "cluster.generation_num_devices=1",
            "rollout.max_staleness=1",
            "rollout.prompts_per_request=2",
            *overrides,
        ],
    ).require_plan()
    if verifier is None:
        return fake_context(plan, PROMPTS, AlternatingVerifier(), ground_truth=lambda i: "1")
    return fake_context(
        plan, PROMPTS, verifier, ground_truth=lambda i: "vary" if i % 2 == 0 else "flat"
    )


def _settle(stream: RolloutStream) -> None:
    """Wait until the engines have generated all the budget allows: training that takes
    longer than generation, without timing anything."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with stream._cond:
            if (
                not stream._in_flight
                and stream._scoring is None
                and stream._next_request_size() <= 0
            ):
                return
        time.sleep(0.001)
    raise AssertionError("the stream kept generating")


def _run(stream: RolloutStream, steps: range) -> list[dict]:
    """Take each step's batch, "train" (let generation settle), refit, as the loop does;
    per step, what was trained."""
    out = []
    for step in steps:
        _settle(stream)
        groups, stats, metrics = stream.take(step)
        generated_by = [g.samples[0].response_token_ids[0] - WEIGHTS_TOKEN for g in groups]
        out.append({"groups": groups, "generated_by": generated_by, "metrics": metrics})
        _settle(stream)
        started = stream.schedule.start(step + 1)  # as the loop does
        assert started is not None
        stream.schedule.finish(started)
    _settle(stream)
    return out


def test_versions_are_the_generating_weights_and_lag_one_step_at_k1():
    # Fixed multiplier 1: a step's worth is 4 prompts (2 requests). At version w the stream
    # keeps (w + K + 1 - next_step) steps' worth outstanding, so after the first step every
    # batch was generated exactly one version earlier and nothing goes stale.
    ctx = _ctx("dapo.dynamic_sampling.batch_multiplier=1.0")
    engines = ScriptedEngines()
    stream = RolloutStream(ctx, engines, None, version=0)
    try:
        steps = _run(stream, range(6))
    finally:
        stream.close()
    for s in steps:
        assert [g.version for g in s["groups"]] == s["generated_by"]
        assert s["metrics"]["rollout/stale_groups_dropped"] == 0
    assert [max(step - v for v in s["generated_by"]) for step, s in enumerate(steps)] == [
        0,
        1,
        1,
        1,
        1,
        1,
    ]
    assert engines.in_flight_at_refit == 0  # generation settled before each refit
    # Every prompt drawn once, in order: 8 prompts at version 0, then 4 per refit.
    drawn = [p for request in engines.submitted for p in request]
    assert drawn == list(range(len(drawn)))
    assert len(drawn) == 8 + 4 * 6


def _run_pipelined(stream: RolloutStream, engines: ScriptedEngines, steps: range) -> dict:
    """The training loop's overlapped order, with generation free to run at any time:
    step s's train step is submitted (the refit to s + 1 armed: the stream may queue it
    once the engines are done with version s), the batch of s + 1 is taken, the refit
    started early (None while the budget is still open) or once "training" is done, then
    finished."""
    trained, early, behind = [], [], []
    taken = stream.take(steps.start)
    for step in steps:
        groups, _, metrics = taken
        generated_by = [g.samples[0].response_token_ids[0] - WEIGHTS_TOKEN for g in groups]
        trained.append({"groups": groups, "generated_by": generated_by, "metrics": metrics})
        stream.schedule.arm(step + 1)  # its train step was just submitted
        taken = stream.take(step + 1)
        refit = stream.schedule.start_early(step + 1)
        early.append(refit is not None)
        if refit is None:
            refit = stream.schedule.start(step + 1)
        # The next request is queued right behind the transfer, before it is finished.
        with engines.lock:
            behind.append(engines.versions[-1] == step + 1)
        stream.schedule.finish(refit)
    return {"steps": trained, "early": early, "queued_behind_refit": behind}


@pytest.mark.parametrize("k", [1, 2])
def test_pipelined_refits_keep_versions_exact_and_queue_the_next_request_behind(k):
    # Keep rate 1/2 and a request cap: requests are often still in flight when a refit is
    # queued behind them. Every trained group must carry the weights that generated it.
    ctx = _ctx(
        f"rollout.max_staleness={k}",
        "dapo.dynamic_sampling.batch_multiplier=2.0",
        verifier=HalfVerifier(),
    )
    engines = ScriptedEngines()
    stream = RolloutStream(ctx, engines, None, version=0)
    try:
        run = _run_pipelined(stream, engines, range(10))
    finally:
        stream.close()
    for step, s in enumerate(run["steps"]):
        assert [g.version for g in s["groups"]] == s["generated_by"]
        assert all(0 <= step - v <= k for v in s["generated_by"])
        assert len(s["groups"]) == 4
    if k == 1:
        # Once step s + 1's batch is taken, version s has nothing left to generate at
        # K = 1: the refit is always queued while the trainer trains, and the next
        # request behind it.
        assert all(run["early"])
        assert all(run["queued_behind_refit"])
    assert all(v1 <= v2 for v1, v2 in itertools.pairwise(engines.versions))


def test_budget_counts_each_version_only_for_the_steps_it_can_still_train():
    # K = 1, 4 groups a step, keep rate 1, next step 5, engines at version 5 (budget: steps
    # 5 and 6 = 8 groups). Version 3 is too old for step 5: nothing. Version 4 can only fill
    # step 5: 10 prompts count 4 (its surplus would expire). Version 5 fills the rest: 3
    # prompts -> 7 in all, so the deficit is 1 group, not 8 - 13 - 2 < 0.
    ctx = _ctx("dapo.dynamic_sampling.batch_multiplier=1.0")
    stream = RolloutStream(ctx, ScriptedEngines(), None, version=5)
    stream.close()
    stream._thread.join(timeout=10)
    with stream._cond:
        stream._in_flight.clear()  # whatever the thread generated before it stopped
        stream._completed.clear()
        stream._scoring = stream._in_hand = None
        stream.schedule.next_step = 5
        for version, prompts in [(3, 2), (4, 10), (5, 3)]:
            stream._in_flight.append(_Request(list(range(prompts)), version, []))
        assert stream.schedule._expected_groups(1.0) == 7
        assert stream.schedule._deficit(1.0) == 1
        # Step 5 taken: version 4 is too old now; version 5 may fill steps 6 only.
        stream.schedule.next_step = 6
        assert stream.schedule._expected_groups(1.0) == 3
        assert stream.schedule._deficit(1.0) == 1  # budget at version 5, K = 1: step 6 alone


def test_budget_counts_carried_groups_only_for_the_steps_they_can_still_train():
    # K = 1, 4 groups a step, keep rate 1. Step 5 (version 5) kept 8 groups of version 4:
    # 4 trained, 4 carried. Engines at version 5, next step 6 (budget: step 6 = 4 groups).
    # The carried groups are two versions behind step 6: they fill nothing there, so a
    # request of version 5 with 2 prompts leaves a deficit of 2 groups. Counted as if they
    # could fill step 6, the budget was met and step 6 waited for a request generated
    # with the weights of version 6.
    ctx = _ctx("dapo.dynamic_sampling.batch_multiplier=1.0")
    stream = RolloutStream(ctx, ScriptedEngines(), None, version=5)
    stream.close()
    stream._thread.join(timeout=10)
    dynamic = ctx.dynamic
    dynamic.start_step(version=5)
    scores = torch.tensor([[1.0, 0.0, 1.0, 0.0]] * 8)
    dynamic.add_round([f"g{i}" for i in range(8)], scores, scores, version=4)
    dynamic.finish_step()
    assert dynamic.carried_versions == [4] * 4
    with stream._cond:
        stream._in_flight.clear()  # whatever the thread generated before it stopped
        stream._completed.clear()
        stream._scoring = stream._in_hand = None
        stream.schedule.next_step = 5
        # Step 5 may still train them (one version behind): they fill it.
        assert stream.schedule._expected_groups(1.0) == 4
        stream.schedule.next_step = 6
        stream._in_flight.append(_Request([0, 1], 5, []))
        assert stream.schedule._expected_groups(1.0) == 2
        assert stream.schedule._deficit(1.0) == 2


@pytest.mark.parametrize("policy", ["drop", "regenerate"])
@pytest.mark.parametrize("k", [1, 2])
def test_no_trained_group_exceeds_k_and_every_generated_group_is_accounted_for(k, policy):
    # The auto multiplier starts at 2 with a keep rate of 1: the first steps over-generate,
    # so old groups go stale and are dropped (or their prompts generated again).
    ctx = _ctx(f"rollout.max_staleness={k}", f"rollout.stale_groups={policy}")
    engines = ScriptedEngines()
    stream = RolloutStream(ctx, engines, None, version=0)
    try:
        steps = _run(stream, range(8))
        with stream.paused():
            queued = stream.state()["pending_prompts"]
            submitted = [p for request in engines.submitted for p in request]
    finally:
        stream.close()
    trained = [g.prompt_ids[0] for s in steps for g in s["groups"]]
    dropped = sum(s["metrics"]["rollout/stale_groups_dropped"] for s in steps)
    for step, s in enumerate(steps):
        assert [g.version for g in s["groups"]] == s["generated_by"]
        assert all(0 <= step - v <= k for v in s["generated_by"])
        assert s["metrics"]["rollout/stale_groups_dropped"] >= 0
    carried = ctx.dynamic.num_carried_groups
    assert len(submitted) == len(trained) + dropped + carried + len(queued)
    assert len(set(trained)) == len(trained)  # no prompt trained twice
    if policy == "regenerate" and dropped:
        # Dropped prompts come back (until resubmitted they wait in the retry queue).
        assert len(submitted) > len(set(submitted)) or queued
    if policy == "drop":
        assert len(submitted) == len(set(submitted))


def test_state_lists_the_prompts_drawn_but_not_trained_and_a_new_stream_generates_them_first():
    ctx = _ctx("dapo.dynamic_sampling.batch_multiplier=1.0")
    engines = ScriptedEngines()
    stream = RolloutStream(ctx, engines, None, version=0)
    try:
        steps = _run(stream, range(2))
        with stream.paused():
            pending = stream.state()["pending_prompts"]
    finally:
        stream.close()
    trained = {g.prompt_ids[0] for s in steps for g in s["groups"]}
    submitted = [p for request in engines.submitted for p in request]
    assert pending and set(pending) == set(submitted) - trained
    # A resumed run: the pending prompts are the first ones generated.
    resumed = ScriptedEngines()
    again = RolloutStream(_ctx(), resumed, None, version=2, pending_prompts=pending)
    try:
        groups, _, _ = again.take(2)
    finally:
        again.close()
    first = [p for request in resumed.submitted for p in request][: len(pending)]
    assert first == pending
    assert {g.version for g in groups} == {2}


def test_an_engine_failure_reaches_the_training_thread():
    ctx = _ctx()
    stream = RolloutStream(ctx, ScriptedEngines(fail_on_request=0), None, version=0)
    try:
        with pytest.raises(RuntimeError, match="scripted failure"):
            stream.take(0)
    finally:
        stream.close()


def test_without_a_request_cap_each_request_is_the_budget_shortfall():
    # Keep rate 1 (no headroom at p = 1): at version 0 the budget is two steps (steps 0
    # and 1 may train version-0 data at K = 1), then each refit opens exactly one step.
    ctx = _ctx("dapo.dynamic_sampling.batch_multiplier=1.0", "rollout.prompts_per_request=null")
    engines = ScriptedEngines()
    stream = RolloutStream(ctx, engines, None, version=0)
    try:
        _run(stream, range(6))
    finally:
        stream.close()
    assert [len(r) for r in engines.submitted] == [8, 4, 4, 4, 4, 4, 4]
    assert ctx.dynamic.totals["num_discarded_valid_samples"] == 0


@pytest.mark.parametrize("k", [1, 2])
def test_at_keep_rate_half_requests_track_the_need_without_a_stale_surplus(k):
    # Half the prompts give a kept group. The budget asks for a step's groups over the keep
    # rate plus a little headroom, so what is generated is what is trained, give or take
    # that headroom: nothing expires, and no step runs dry.
    ctx = _ctx(
        f"rollout.max_staleness={k}",
        "dapo.dynamic_sampling.batch_multiplier=2.0",  # the first steps' guess: keep 0.5
        "rollout.prompts_per_request=null",
        verifier=HalfVerifier(),
    )
    engines = ScriptedEngines()
    stream = RolloutStream(ctx, engines, None, version=0)
    num_steps = 12
    try:
        steps = _run(stream, range(num_steps))
    finally:
        stream.close()
    drawn = sum(len(r) for r in engines.submitted)
    trained = sum(len(s["groups"]) for s in steps)
    assert trained == num_steps * 4
    assert sum(s["metrics"]["rollout/stale_groups_dropped"] for s in steps) == 0
    # Two prompts per trained group at keep 0.5. At most: the first request, for the K + 1
    # steps version 0 may train (prompts_for(4 (K + 1), 0.5): 24 prompts at K = 1, 34 at
    # K = 2), then one request per refit for the one step it opens, ceil(prompts_for(4,
    # 0.5)) = ceil(8 + 2 * sqrt(8 * 0.25) / 0.5) = 14 prompts. The headroom's surplus
    # (3 groups a step here, where the keep rate never varies) is not counted as filling
    # a step it is too old for.
    first = math.ceil(prompts_for(4 * (k + 1), 0.5))
    assert first == [24, 34][k - 1]
    assert 2 * trained <= drawn <= first + num_steps * 14
    assert all(0 <= step - g.version <= k for step, s in enumerate(steps) for g in s["groups"])


@pytest.mark.parametrize(
    ("groups", "keep"), [(32, 0.9), (32, 0.5), (32, 0.3), (4, 0.5), (1, 0.9), (256, 0.1)]
)
def test_request_headroom_rarely_leaves_a_step_short_and_stays_small(groups, keep):
    # Independent check with the exact binomial: drawing ceil(prompts_for(G, p)) prompts,
    # the chance of fewer than G kept groups is small, and the headroom over G / p is at
    # most three binomial standard deviations (in prompts).
    n = math.ceil(prompts_for(groups, keep))
    short = sum(
        math.exp(
            math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * math.log(keep) + (n - i) * math.log1p(-keep)
        )
        for i in range(groups)
    )  # fmt: skip
    assert short <= 0.06
    expected = groups / keep
    assert expected <= n <= expected + 3 * math.sqrt(expected * keep * (1 - keep)) / keep + 1
