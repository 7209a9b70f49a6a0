"""Tests of dapo_megatron.rewards: the math, gsm8k and arithmetic verifiers and the pool.

The verifier tests use real answer pairs (equivalent LaTeX/fraction/decimal forms, GSM8K
solutions). The pool tests feed adversarial outputs (megabyte strings, deep nesting, towers of
exponents) and a fault-injecting verifier (hang, raise, exit, SIGKILL, segfault) and check
that every such sample scores 0, is counted, costs a bounded time, and leaves the pool usable.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_megatron.rewards import (
    STATUS_ERROR,
    STATUS_NO_ANSWER,
    STATUS_OK,
    STATUS_TIMEOUT,
    VERIFIERS,
    Judgement,
    Verifier,
    VerifierPool,
    arithmetic,
    get_verifier,
    gsm8k,
    score,
)
from dapo_megatron.rewards import math as math_verifier

# ------------------------------------------------------------------------------ math

MATH_PAIRS = [
    # (response, ground truth, expected score)
    ("Answer: 0.5", "\\frac{1}{2}", 1.0),
    ("Answer: 1/2", "\\frac{1}{2}", 1.0),
    ("Answer: \\dfrac{1}{2}", "0.5", 1.0),
    ("Answer: \\tfrac{3}{4}", "0.75", 1.0),
    ("Answer: -\\frac{1}{2}", "-0.5", 1.0),
    ("Answer: \\frac{1}{2}", "-0.5", 0.0),
    ("Answer: 0.333", "\\frac{1}{3}", 0.0),
    ("Answer: 3\\sqrt{2}", "\\sqrt{18}", 1.0),
    ("Answer: \\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("Answer: 2\\pi", "2\\pi", 1.0),
    ("Answer: 6.28", "2\\pi", 0.0),
    ("Answer: 2^{10}", "1024", 1.0),
    ("Answer: 1,000", "1000", 1.0),
    ("Answer: x = 5", "5", 1.0),
    ("The interval is \\boxed{(1,2]}", "(1,2]", 1.0),
    ("The interval is \\boxed{(1,2]}", "[1,2]", 0.0),
    ("so \\boxed{[0, \\infty)}", "[0,\\infty)", 1.0),
    ("the set \\boxed{\\{1,2,3\\}}", "\\{3,2,1\\}", 1.0),
    ("the set \\boxed{\\{1,2,3\\}}", "\\{1,2\\}", 0.0),
    # AIME / DAPO-Math-17k style integers, with the decorations models add.
    ("... so there are 34 ways.\nAnswer: 34", "34", 1.0),
    ("Answer: 35", "34", 0.0),
    ("Answer: 034", "34", 1.0),
    ("Answer: $34$.", "34", 1.0),
    ("**Answer:** 34", "34", 1.0),
    ("**Answer**: $\\boxed{34}$", "34", 1.0),
    ("Final Answer: \\(34\\)", "34", 1.0),
    ("Answer:\n$$\n\\frac{3}{4}\n$$\n", "0.75", 1.0),
    # Ground truths written in LaTeX delimiters.
    ("Answer: 12", "$12$", 1.0),
    ("Answer: 12", "\\boxed{12}", 1.0),
]


@pytest.mark.parametrize(("response", "truth", "expected"), MATH_PAIRS)
def test_math_answer_pairs(response: str, truth: str, expected: float) -> None:
    assert math_verifier.score(response, truth) == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        # The Answer: line wins over any box, even one written after it.
        ("\\boxed{5}\nAnswer: 6", "6", 1.0),
        ("\\boxed{5}\nAnswer: 6", "5", 0.0),
        ("Answer: 6\nHmm, or maybe \\boxed{5}", "6", 1.0),
        # The last Answer: line and the last box win.
        ("Answer: 5\nWait, that is wrong.\nAnswer: 6", "6", 1.0),
        ("first \\boxed{5}, then \\boxed{6}", "6", 1.0),
        ("first \\boxed{5}, then \\boxed{6}", "5", 0.0),
        # "answer:" inside a sentence is not the answer line.
        ("So my answer: first we factor.\n\\boxed{5}", "5", 1.0),
        # An empty Answer: falls back to the box.
        ("\\boxed{7}\nAnswer:", "7", 1.0),
        ("\\fbox{7}", "7", 1.0),
        ("\\boxed 7", "7", 1.0),
    ],
)
def test_math_answer_precedence(response: str, truth: str, expected: float) -> None:
    assert math_verifier.score(response, truth) == expected


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{\\{1,2\\}} end", "\\{1,2\\}"),  # escaped braces are not groups
        ("\\boxed{a}\\boxed{b{c}}", "b{c}"),
        ("\\boxed{5} and cut off \\boxed{\\frac{1}{2", "5"),  # unterminated: previous box
        ("\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "{" * 10_000 + "1" + "}" * 10_000),
        ("no box", None),
        ("\\boxed{", None),
    ],
)
def test_last_boxed_matches_braces(text: str, content: str | None) -> None:
    assert math_verifier.last_boxed(text) == content


@pytest.mark.parametrize(
    "response",
    [
        "I think it is 34.",
        "",
        "Answer:",
        "Answer: " + "1" * (math_verifier.MAX_ANSWER_CHARS + 1),  # too long to be an answer
        "\\boxed{34}" + " and more" * math_verifier.MAX_RESPONSE_CHARS,  # outside the window
    ],
)
def test_math_no_answer(response: str) -> None:
    assert math_verifier.judge(response, "34") == Judgement(0.0, None)


def test_math_extraction_is_linear_on_pathological_boxes() -> None:
    # Thousands of unterminated boxes (quadratic for a scan per box), deep nesting. CPU
    # time of this process, not wall time: other processes' load must not fail the test.
    for response in ("\\boxed{" * 1200, "\\boxed{" + "{" * 8000, "\\boxed{\\{" * 1000):
        start = time.process_time()
        assert math_verifier.extract_answer(response) is None
        assert time.process_time() - start < 0.2


def test_math_reads_only_the_tail_of_huge_responses() -> None:
    response = "blah " * 200_000 + "\nAnswer: 34"
    start = time.process_time()  # CPU time: immune to other processes' load
    assert math_verifier.score(response, "34") == 1.0
    assert time.process_time() - start < 0.5


@settings(max_examples=20, deadline=None)
@given(
    p=st.integers(-50, 50),
    q=st.integers(1, 50),
    k=st.integers(2, 9),
)
def test_math_equivalent_fraction_forms(p: int, q: int, k: int) -> None:
    value = Fraction(p, q)
    truth = f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    assert math_verifier.score(f"Answer: {p * k}/{q * k}", truth) == 1.0
    wrong = value + Fraction(1, 7)
    assert math_verifier.score(f"Answer: {wrong.numerator}/{wrong.denominator}", truth) == 0.0


# ------------------------------------------------------------------------------ gsm8k

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("She sold 24 in May, so 48 + 24 = 72 in all.\n#### 72", GSM8K_SOLUTION, 1.0),
        ("She sold 24 in May, so 71 in all.", GSM8K_SOLUTION, 0.0),
        ("#### 1,234", "1234", 1.0),
        ("The total is $1,234.50.", "1234.5", 1.0),
        ("The answer is 42.0", "42", 1.0),
        ("The answer is 42.", "42", 1.0),
        ("It is -7 degrees outside.", "-7", 1.0),
        ("It is -7 degrees outside.", "7", 0.0),
        ("She read pages 10-12", "12", 1.0),  # a range, not -12
        ("#### 5\nthough the total is 6", "5", 1.0),  # #### beats the last number
        ("3, 4, and 5", "5", 1.0),
        ("It costs 18 dollars", "$18", 1.0),
        ("2/3 of 9 is 6", "6", 1.0),
        ("#### $18", "#### 18", 1.0),
    ],
)
def test_gsm8k_final_number(response: str, truth: str, expected: float) -> None:
    assert gsm8k.score(response, truth) == expected


def test_gsm8k_no_number_is_no_answer_and_bad_truth_raises() -> None:
    assert gsm8k.judge("no idea", "3") == Judgement(0.0, None)
    with pytest.raises(ValueError, match="holds no number"):
        gsm8k.judge("3", "three")


@settings(max_examples=50, deadline=None)
@given(n=st.integers(-(10**9), 10**9), dollar=st.booleans(), commas=st.booleans())
def test_gsm8k_formatted_integers(n: int, dollar: bool, commas: bool) -> None:
    text = f"{abs(n):,}" if commas else str(abs(n))
    text = ("-" if n < 0 else "") + ("$" if dollar else "") + text
    assert gsm8k.score(f"So the answer is\n#### {text}", str(n)) == 1.0
    assert gsm8k.score(f"So the answer is\n#### {text}", str(n + 1)) == 0.0


# ------------------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("19", 1.0),
        (" 19 ", 1.0),
        ("\n19\n", 1.0),
        ("19\nbecause 12 + 7 = 19", 1.0),
        ("019", 0.0),
        ("+19", 0.0),
        ("19.0", 0.0),
        ("19 apples", 0.0),
        ("1 9", 0.0),
        ("18", 0.0),
        ("1" * 10**6, 0.0),
    ],
)
def test_arithmetic_exact_match(response: str, expected: float) -> None:
    assert arithmetic.score(response, "19") == expected


def test_arithmetic_negative_and_empty() -> None:
    assert arithmetic.score("-3", "-3") == 1.0
    assert arithmetic.score("-0", "0") == 0.0
    assert arithmetic.judge("   \n ", "3") == Judgement(0.0, None)


_NUMERIC_LOOKING = st.integers(-(10**6), 10**6).map(str) | st.from_regex(
    r"[+-]?0*\d{1,6}(\.0*)?", fullmatch=True
)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(-(10**6), 10**6), candidate=_NUMERIC_LOOKING)
def test_arithmetic_accepts_exactly_the_canonical_integer(n: int, candidate: str) -> None:
    assert arithmetic.score(candidate, str(n)) == (1.0 if candidate == str(n) else 0.0)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(),
    lead=st.text(alphabet=" \t\n", max_size=4),
    trail=st.text(alphabet=" \t\r", max_size=3),
    rest=st.text(max_size=20),
)
def test_arithmetic_ignores_whitespace_and_later_lines(
    n: int, lead: str, trail: str, rest: str
) -> None:
    assert arithmetic.score(lead + str(n) + trail + "\n" + rest, str(n)) == 1.0


# ------------------------------------------------------------------------------ registry


def test_registry_names_match_the_config_values() -> None:
    assert set(VERIFIERS) == {"math", "gsm8k", "arithmetic", "remainder"}
    assert score("arithmetic", "4", "4") == 1.0
    assert get_verifier("gsm8k") is gsm8k.VERIFIER
    with pytest.raises(ValueError, match="known"):
        get_verifier("maths")


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
