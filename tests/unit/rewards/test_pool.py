"""The verifier pool (rewards/pool.py).

The pool tests feed adversarial outputs (megabyte strings, deep nesting, towers of
exponents) and a fault-injecting verifier (hang, raise, exit, SIGKILL, segfault) and check
that every such sample scores 0, is counted, costs a bounded time, and leaves the pool usable."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from fractions import Fraction

import pytest

from dapo_megatron.rewards import (
    STATUS_ERROR,
    STATUS_NO_ANSWER,
    STATUS_OK,
    STATUS_TIMEOUT,
    Judgement,
    Verifier,
    VerifierPool,
)
from unit.rewards.answer_pairs import MATH_PAIRS

# ------------------------------------------------------------------------------ pool: in-process


def test_cheap_verifier_scores_in_process() -> None:
    with VerifierPool("arithmetic", num_workers=4, timeout_s=1.0) as pool:
        assert pool.in_process and pool.num_workers == 0
        result = pool.score_batch(["4", "5", "", "x" * 10**6], ["4", "4", "4", "4"])
    assert result.scores == [1.0, 0.0, 0.0, 0.0]
    assert result.statuses == [STATUS_OK, STATUS_OK, STATUS_NO_ANSWER, STATUS_OK]
    assert result.metrics["reward/num_no_answer"] == 1.0


def test_in_process_errors_are_counted() -> None:
    # A ground truth without a number is a data error: counted, never raised into training.
    with VerifierPool("gsm8k", num_workers=0, timeout_s=1.0) as pool:
        result = pool.score_batch(["#### 3", "#### 3"], ["3", "three"])
    assert result.scores == [1.0, 0.0]
    assert result.statuses == [STATUS_OK, STATUS_ERROR]
    assert result.metrics["reward/num_errors"] == 1.0


def test_pool_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        VerifierPool("math", num_workers=-1, timeout_s=1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        VerifierPool("math", num_workers=1, timeout_s=0.0)
    with (
        VerifierPool("arithmetic", num_workers=0, timeout_s=1.0) as pool,
        pytest.raises(ValueError, match="ground truths"),
    ):
        pool.score_batch(["1"], [])
    with pytest.raises(RuntimeError, match="closed"):
        pool.score_batch(["1"], ["1"])


# ------------------------------------------------------------------------------ pool: math

MATH_TIMEOUT_S = 2.0
# Wall-clock allowance on top of the timeouts: replacing a killed worker starts a fresh
# interpreter (about 0.5 s of CPU), which takes several seconds on a loaded 2-core machine.
# A stalled pool would blow far past it (the hanging samples never return).
RESTART_SLACK_S = 15.0


@pytest.fixture(scope="module")
def math_pool():
    """For correctness: a limit no honest sample reaches, even on a starved CI machine."""
    with VerifierPool("math", num_workers=2, timeout_s=60.0) as pool:
        yield pool


@pytest.fixture(scope="module")
def strict_math_pool():
    """For adversarial samples: a short limit, so the tests that hit it stay fast."""
    with VerifierPool("math", num_workers=2, timeout_s=MATH_TIMEOUT_S) as pool:
        pool.score_batch(["Answer: 1"], ["1"])  # wait for the workers to start
        yield pool


def test_math_pool_agrees_with_in_process_scores(math_pool: VerifierPool) -> None:
    responses = [r for r, _, _ in MATH_PAIRS]
    truths = [t for _, t, _ in MATH_PAIRS]
    result = math_pool.score_batch(responses, truths)
    assert result.scores == [e for _, _, e in MATH_PAIRS]
    assert set(result.statuses) == {STATUS_OK}
    assert result.metrics["reward/num_worker_restarts"] == 0.0
    assert math_pool.score_batch([], []).scores == []


def test_math_pool_survives_adversarial_outputs(strict_math_pool: VerifierPool) -> None:
    adversarial = {
        "megabyte": "x" * 10**6,
        "megabyte_box": "\\boxed{" + "9" * 10**6 + "}",
        "deep_braces": "\\boxed{" + "{" * 10**4 + "1" + "}" * 10**4 + "}",
        "deep_braces_short": "Answer: " + "{" * 200 + "1" + "}" * 200,
        "frac_storm": "\\frac" * 10**5,
        "frac_storm_short": "Answer: " + "\\frac" * 90,
        "tower": "Answer: 10^{10^{10^{10}}}",
        "tower_plain": "Answer: 10^10^10^10",
        "long_integer": "Answer: 1" + "0" * 400,
    }
    responses = [*adversarial.values(), "Answer: \\frac{1}{2}"]
    start = time.monotonic()
    result = strict_math_pool.score_batch(responses, ["1"] * len(adversarial) + ["0.5"])
    elapsed = time.monotonic() - start
    statuses = dict(zip(adversarial, result.statuses, strict=False))
    assert result.scores == [0.0] * len(adversarial) + [1.0]
    assert statuses["tower"] == STATUS_TIMEOUT  # evaluates a 10^10^10-digit integer
    for name in ("megabyte", "megabyte_box", "deep_braces", "frac_storm"):
        assert statuses[name] == STATUS_NO_ANSWER, name  # cut off by the clipping guard
    metrics = result.metrics
    assert metrics["reward/num_timeouts"] == result.statuses.count(STATUS_TIMEOUT) >= 1
    assert metrics["reward/num_no_answer"] == 4
    assert metrics["reward/num_worker_restarts"] >= metrics["reward/num_timeouts"]
    # Two workers, at most a few samples that run into the limit: the batch cannot stall.
    assert elapsed < 3 * MATH_TIMEOUT_S + RESTART_SLACK_S, elapsed
    # The replaced workers score the next batch normally.
    after = strict_math_pool.score_batch(["Answer: 0.5", "\\boxed{7}"], ["1/2", "7"])
    assert after.scores == [1.0, 1.0]
    assert strict_math_pool.num_workers == 2


def test_math_pool_from_a_non_main_thread(strict_math_pool: VerifierPool) -> None:
    box: dict[str, object] = {}

    def run() -> None:
        box["result"] = strict_math_pool.score_batch(
            ["Answer: 10^{10^{10^{10}}}", "Answer: 1/3"], ["1", "\\frac{1}{3}"]
        )

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=3 * MATH_TIMEOUT_S + RESTART_SLACK_S)
    assert not thread.is_alive()
    result = box["result"]
    assert result.scores == [0.0, 1.0]
    assert result.statuses == [STATUS_TIMEOUT, STATUS_OK]


def test_math_pool_concurrent_callers_are_serialised(math_pool: VerifierPool) -> None:
    results: list[list[float]] = []

    def run(k: int) -> None:
        responses = [f"Answer: {k}/{i}" for i in range(1, 9)]
        truths = [str(Fraction(k, i)) for i in range(1, 9)]
        results.append(math_pool.score_batch(responses, truths).scores)

    threads = [threading.Thread(target=run, args=(k,)) for k in (2, 3, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == [[1.0] * 8] * 3


# ------------------------------------------------------------------------------ pool: faults


def faulty_judge(response: str, ground_truth: str) -> Judgement:
    """A test verifier that misbehaves on request (module level, so workers can import it)."""
    if response == "hang":
        time.sleep(3600)
    if response == "raise":
        raise RuntimeError("a verifier bug")
    if response == "exit":
        os._exit(3)
    if response == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if response == "segfault":
        ctypes.string_at(0)
    return Judgement(1.0 if response == ground_truth else 0.0, response)


FAULTY = Verifier(
    name="faulty", judge=faulty_judge, cheap=False, keep="tail", max_chars=64, warmup=("1", "1")
)
FAULT_TIMEOUT_S = 0.5


def test_pool_replaces_hung_and_crashed_workers() -> None:
    responses = ["a", "hang", "b", "raise", "c", "exit", "d", "sigkill", "e", "segfault", "f"]
    with VerifierPool(FAULTY, num_workers=2, timeout_s=FAULT_TIMEOUT_S) as pool:
        pool.score_batch(["1"], ["1"])  # wait for the workers to start
        start = time.monotonic()
        result = pool.score_batch(responses, responses)
        elapsed = time.monotonic() - start
        expected_status = {"hang": STATUS_TIMEOUT, "raise": STATUS_ERROR}
        expected_status |= {"exit": STATUS_ERROR, "sigkill": STATUS_ERROR}
        expected_status["segfault"] = STATUS_ERROR
        assert result.statuses == [expected_status.get(r, STATUS_OK) for r in responses]
        assert result.scores == [0.0 if r in expected_status else 1.0 for r in responses]
        assert result.metrics["reward/num_timeouts"] == 1.0
        assert result.metrics["reward/num_errors"] == 4.0
        # hang, exit, sigkill and segfault each cost a worker; an exception does not.
        assert result.metrics["reward/num_worker_restarts"] == 4.0
        assert elapsed < 3 * FAULT_TIMEOUT_S + RESTART_SLACK_S, elapsed
        assert pool.score_batch(["x", "y"], ["x", "z"]).scores == [1.0, 0.0]
        processes = [w.process for w in pool._workers]
        assert len(processes) == 2 and all(p.poll() is None for p in processes)
    assert all(p.poll() is not None for p in processes)  # close() stopped them


def test_pool_hang_from_a_thread_returns_within_the_limit() -> None:
    with VerifierPool(FAULTY, num_workers=1, timeout_s=FAULT_TIMEOUT_S) as pool:
        box: dict[str, object] = {}
        thread = threading.Thread(
            target=lambda: box.update(result=pool.score_batch(["hang", "ok"], ["1", "ok"]))
        )
        thread.start()
        thread.join(timeout=30)
        assert box["result"].statuses == [STATUS_TIMEOUT, STATUS_OK]


def test_pool_raises_when_workers_cannot_start() -> None:
    # A worker that dies during its warm-up would be replaced forever; the pool gives up.
    broken = Verifier(
        name="broken",
        judge=faulty_judge,
        cheap=False,
        keep="tail",
        max_chars=64,
        warmup=("exit", "1"),
    )
    with VerifierPool(broken, num_workers=2, timeout_s=1.0) as pool:
        with pytest.raises(RuntimeError, match="before becoming ready"):
            pool.score_batch(["1"], ["1"])
        # The failure closes the pool rather than leaving half-started workers behind.
        assert pool.num_workers == 0
        with pytest.raises(RuntimeError, match="closed"):
            pool.score_batch(["1"], ["1"])


def test_pool_rejects_a_verifier_workers_cannot_import() -> None:
    local = Verifier(
        name="local", judge=lambda r, g: Judgement(1.0, r), cheap=False, keep="tail", max_chars=8
    )
    with pytest.raises(ValueError, match="module-level function"):
        VerifierPool(local, num_workers=1, timeout_s=1.0)
