"""Pure tensor functions of the DAPO algorithm: reward shaping, advantages, dynamic sampling,
the clipped policy-gradient loss, rollout-mismatch correction and KL penalties.

Nothing here imports Megatron, Ray or vLLM: every function is testable on CPU with
hand-derived numbers.
"""
