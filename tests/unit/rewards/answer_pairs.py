"""Real answer pairs for the math verifier (equivalent LaTeX/fraction/decimal forms), shared
by its tests and the pool's (import: ``unit.rewards.answer_pairs``)."""

from __future__ import annotations

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
