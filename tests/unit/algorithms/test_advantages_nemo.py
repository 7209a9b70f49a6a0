"""The leave-one-out estimator normalised by the others' std (dapo.advantage.std_over:
others), checked against NeMo RL's estimator written out by hand in float64.

NeMo RL (7ea279ab) nemo_rl/algorithms/utils.py calculate_baseline_and_std_per_prompt with
leave_one_out_baseline=True: for sample i of a group of N, num_valid = N - 1,
baseline_i = sum_{j != i} r_j / (N - 1), and
std_i = sqrt((mean_{j != i} r_j^2 - baseline_i^2) * (N - 1) / (N - 2)), nan -> 0 (the
unbiased std of the N - 1 others). advantage_estimator.py GRPOAdvantageEstimator:
a_i = r_i - baseline_i, divided by (std_i + 1e-6) only where std_i > 0.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from dapo_megatron.algorithms.advantages import STD_OVER, group_advantages

NEMO_EPS = 1e-6  # advantage_estimator.py: `epsilon = 1e-6`


def nemo_rl_grpo(rewards: list[float]) -> list[float]:
    """NeMo RL's leave-one-out GRPO advantage of one group, in float64 (by hand)."""
    n = len(rewards)
    if n <= 1:
        return [0.0] * n  # `valid_mask.sum() <= 1`: baseline = reward
    out = []
    for i, r in enumerate(rewards):
        others = [x for j, x in enumerate(rewards) if j != i]
        m = n - 1
        baseline = sum(others) / m
        mean_sq = sum(x * x for x in others) / m
        if m == 1:
            std = 0.0  # (0 * inf) is nan -> nan_to_num(0)
        else:
            var = (mean_sq - baseline * baseline) * (m / (m - 1))
            std = math.sqrt(var) if var > 0 else 0.0
        adv = r - baseline
        out.append(adv / (std + NEMO_EPS) if std > 1e-12 else adv)
    return out


def _ours(rewards: list[list[float]]) -> torch.Tensor:
    return group_advantages(
        torch.tensor(rewards, dtype=torch.float64),
        norm_by_std=True,
        leave_one_out=True,
        eps=NEMO_EPS,
        std_over="others",
    )


def test_one_of_four_by_hand() -> None:
    # [1, 0, 0, 0]: sample 0's others agree (std 0): left unscaled, 1 - 0 = 1. Sample 1's
    # others are [1, 0, 0]: baseline 1/3, unbiased std sqrt(1/3); (0 - 1/3) / sqrt(1/3).
    out = _ours([[1.0, 0.0, 0.0, 0.0]])
    b = -(1 / 3) / (math.sqrt(1 / 3) + NEMO_EPS)
    torch.testing.assert_close(out, torch.tensor([[1.0, b, b, b]], dtype=torch.float64))
    # the whole group's std (0.5) would have given 4/3 * 0.75 / 0.5 = 2.0 for sample 0
    whole = group_advantages(
        torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64), leave_one_out=True, eps=NEMO_EPS
    )
    assert whole[0, 0] == pytest.approx(2.0, rel=1e-5)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
def test_matches_nemo_rl_on_random_groups(n: int) -> None:
    rng = random.Random(n)
    groups = []
    for _ in range(40):
        kind = rng.random()
        if kind < 0.4:  # binary rewards, as a math verifier gives
            groups.append([float(rng.random() < 0.3) for _ in range(n)])
        elif kind < 0.8:  # shaped rewards in [-1, 1]
            groups.append([rng.choice([-1.0, 1.0]) - rng.random() * 0.5 for _ in range(n)])
        else:  # continuous
            groups.append([rng.gauss(0.0, 2.0) for _ in range(n)])
    out = _ours(groups)
    expected = torch.tensor([nemo_rl_grpo(g) for g in groups], dtype=torch.float64)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


def test_constant_group_is_zero_and_pair_is_unscaled() -> None:
    out = _ours([[0.5, 0.5, 0.5], [1.0, 0.0, 0.0]])
    assert out[0].tolist() == [0.0, 0.0, 0.0]
    # N = 2: one other sample has no spread, NeMo RL leaves r_i - r_j unscaled
    torch.testing.assert_close(
        _ours([[1.0, 0.0]]), torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    )


def test_others_without_norm_is_the_plain_baseline() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 0.5]], dtype=torch.float64)
    a = group_advantages(r, norm_by_std=False, leave_one_out=True, std_over="others")
    b = group_advantages(r, norm_by_std=False, leave_one_out=True, std_over="group")
    torch.testing.assert_close(a, b)


def test_std_over_is_checked() -> None:
    assert STD_OVER == ("group", "others")
    with pytest.raises(ValueError, match="std_over"):
        group_advantages(torch.zeros(1, 4), std_over="batch")


def test_the_trainer_batch_uses_the_configured_std_over() -> None:
    """controller/rollout_groups.py build_policy_batch passes dapo.advantage.std_over: the
    advantages a policy step trains on are NeMo RL's for an imported NeMo RL recipe."""
    from pathlib import Path

    from dapo_megatron.config.loader import load_config
    from dapo_megatron.controller.rollout_groups import RolloutGroup, build_policy_batch
    from dapo_megatron.shared.sampling import Sample

    tiny = Path(__file__).resolve().parents[3] / "recipes" / "dapo-tiny-cpu.yaml"
    rewards = [1.0, 0.0, 0.0, 0.5]
    samples = [Sample([5, 6], [-0.1, -0.2], "stop") for _ in rewards]
    group = RolloutGroup([1, 2], "x", samples, rewards, rewards, [0.0] * 4)
    got = {}
    for over in STD_OVER:
        overrides = ["dapo.advantage.leave_one_out=true", f"dapo.advantage.std_over={over}"]
        config = load_config(tiny, overrides).config
        got[over] = build_policy_batch([group], config, pad_id=0).advantages.double()
        want = group_advantages(
            torch.tensor([rewards], dtype=torch.float64), leave_one_out=True, std_over=over
        )
        torch.testing.assert_close(got[over], want.reshape(-1), rtol=1e-6, atol=1e-6)
    # NeMo RL's (others) is not the whole group's on this group
    expected = torch.tensor(nemo_rl_grpo(rewards), dtype=torch.float64)
    torch.testing.assert_close(got["others"], expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got["group"], got["others"])
