"""The fused Triton PG loss (under the CPU interpreter) against ``torch_policy_loss`` in float64.

``tests/kernels/conftest.py`` sets ``TRITON_INTERPRET=1``. Every case runs the kernel on
fp32 inputs and ``algorithms.loss.torch_policy_loss`` on the same values in float64, and compares
the loss, ``d loss / d logprobs`` and every metric sum. Shapes have ragged tails (3 x 67
tokens against blocks of 64 and 4096 tokens), masks have holes and an all-padding row.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from dapo_megatron.algorithms.loss import loss_denominator, torch_policy_loss  # noqa: E402
from dapo_megatron.algorithms.loss_inputs import LossInputs  # noqa: E402
from dapo_megatron.algorithms.loss_spec import LOSS_AGG_MODES, LossSpec  # noqa: E402
from dapo_megatron.config.run_plan import shipped_loss_spec  # noqa: E402
from dapo_megatron.kernels.pg_loss import pg_loss, resolve_pg_loss_impl  # noqa: E402

B, T = 3, 67
# The settings every case starts from; each test states what it changes.
BASE_SPEC = shipped_loss_spec(
    T, clip_ratio_c=None, loss_agg_mode="token-mean", rollout_correction="none", kl_coef=0.0
)


def spec(**changes: Any) -> LossSpec:
    """BASE_SPEC with ``changes`` (validated again by LossSpec)."""
    return dataclasses.replace(BASE_SPEC, **changes)


def _case(seed: int = 0, *, log_ratio_scale: float = 0.3, per_sample_adv: bool = False) -> dict:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 4.0
    lp = old + log_ratio_scale * torch.randn(B, T, generator=gen, dtype=torch.float64)
    rollout = old + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=gen) > 0.2).float()
    mask[1, 50:] = 0.0  # a shorter response
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    if not per_sample_adv:
        adv = adv[:, None] + 0.1 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    # Padding garbage: must never reach the loss, the gradient or the metrics.
    lp = torch.where(mask != 0, lp, -math.inf)
    rollout = torch.where(mask != 0, rollout, math.nan)
    return dict(lp=lp, old=old, adv=adv, mask=mask, rollout=rollout)


def _run(
    fn, case: dict, dtype: torch.dtype, loss_spec: LossSpec, **kw
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    lp = case["lp"].detach().to(dtype).clone().requires_grad_()
    normalizer = loss_denominator(
        case["mask"], loss_spec.loss_agg_mode, loss_scale_length=loss_spec.loss_scale_length
    )
    rollout = case["rollout"].to(dtype) if loss_spec.rollout_correction != "none" else None
    inputs = LossInputs(
        lp, case["old"].to(dtype), case["adv"].to(dtype), case["mask"], normalizer,
        rollout_logprobs_BT=rollout,
    )  # fmt: skip
    out = fn(inputs, loss_spec, **kw)
    out.loss.backward()
    return out.loss.detach(), lp.grad, out.metrics


def _check(case: dict, *, block: int | None = 64, atol: float = 2e-6, **changes: Any) -> dict:
    """Triton (fp32) vs torch_policy_loss (float64) with ``spec(**changes)``; returns the Triton
    metrics."""
    loss_spec = spec(**changes)
    want_loss, want_grad, want_m = _run(torch_policy_loss, case, torch.float64, loss_spec)
    got_loss, got_grad, got_m = _run(
        pg_loss, case, torch.float32, loss_spec, impl="triton", block=block
    )
    assert torch.isfinite(got_loss) and torch.isfinite(got_grad).all()
    torch.testing.assert_close(got_loss.double(), want_loss, rtol=1e-5, atol=atol)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-5, atol=atol)
    assert got_m.keys() == want_m.keys()
    for key, want in want_m.items():
        got = got_m[key]
        assert got.dtype == torch.float64, key
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4, msg=key)
    return got_m


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("clip_ratio_c", [None, 3.0])
def test_matches_policy_loss_per_mode(mode: str, clip_ratio_c: float | None) -> None:
    # A wide log-ratio spread so that every clip branch (upper, lower, dual) is exercised.
    case = _case(1, log_ratio_scale=1.5)
    metrics = _check(case, loss_agg_mode=mode, clip_ratio_c=clip_ratio_c)
    assert metrics["clipfrac_upper_sum"] > 0 and metrics["clipfrac_lower_sum"] > 0
    if clip_ratio_c is not None:
        assert metrics["clipfrac_dual_sum"] > 0


@pytest.mark.parametrize("block", [64, None])
def test_per_sample_advantages_and_block_sizes(block: int | None) -> None:
    _check(_case(2, per_sample_adv=True), block=block)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_tis(level: str, mode: str) -> None:
    metrics = _check(
        _case(3),
        rollout_correction="tis",
        rollout_correction_level=level,
        tis_cap=1.5,
        loss_agg_mode=mode,
    )
    assert metrics["rollout_weight_sum"] != metrics["num_valid_tokens"]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_mis(level: str, mode: str) -> None:
    case = _case(4)
    if level == "sequence":
        # Sequence weights are products over ~60 tokens: give each row a small per-token
        # mismatch of its own, so that rows 0 and 1 pass and row 2 (w ~ e^2.5) is dropped.
        shift_B1 = torch.tensor([[0.002], [-0.003], [-0.05]], dtype=torch.float64)
        case["rollout"] = torch.where(case["mask"] != 0, case["old"] + shift_B1, math.nan)
    metrics = _check(
        case,
        rollout_correction="mis",
        rollout_correction_level=level,
        loss_agg_mode=mode,
        clip_ratio_c=3.0,
        mis_low=0.7,
        mis_high=1.4,
    )
    assert metrics["num_masked_by_mis"] > 0 and metrics["num_valid_tokens"] > 0


def test_kl_and_entropy_terms_are_added() -> None:
    case = _case(5)
    gen = torch.Generator().manual_seed(7)
    ref = case["old"] + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    entropy = torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    for mode in ("token-mean", "seq-mean-token-mean"):
        loss_spec = spec(loss_agg_mode=mode, kl_coef=0.1, entropy_coef=0.01)
        want = torch_policy_loss(
            LossInputs(
                case["lp"],
                case["old"],
                case["adv"],
                case["mask"],
                normalizer=loss_denominator(case["mask"], mode),
                ref_logprobs_BT=ref,
                entropy_BT=entropy,
            ),
            loss_spec,
        )
        got = pg_loss(
            LossInputs(
                case["lp"].float(),
                case["old"].float(),
                case["adv"].float(),
                case["mask"],
                normalizer=loss_denominator(case["mask"], mode),
                ref_logprobs_BT=ref.float(),
                entropy_BT=entropy.float(),
            ),
            loss_spec,
            impl="triton",
            block=64,
        )
        torch.testing.assert_close(got.loss.double(), want.loss, rtol=1e-5, atol=1e-6)
        for key in ("kl_sum", "entropy_sum"):
            torch.testing.assert_close(got.metrics[key], want.metrics[key], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_no_valid_token_gives_zero_loss_and_grad(mode: str) -> None:
    case = _case(6)
    case["mask"] = torch.zeros(B, T)
    case["lp"] = torch.full((B, T), -math.inf, dtype=torch.float64)  # all padding garbage
    metrics = _check(case, loss_agg_mode=mode, rollout_correction="tis")
    lp = case["lp"].float().requires_grad_()
    out = pg_loss(
        LossInputs(lp, case["old"].float(), case["adv"].float(), case["mask"], normalizer=0.0),
        spec(loss_agg_mode=mode),
        impl="triton",
    )
    out.loss.backward()
    assert out.loss.item() == 0.0 and (lp.grad == 0).all()
    assert metrics["num_valid_tokens"] == 0
    assert metrics["ratio_max"] == -math.inf and metrics["ratio_min"] == math.inf


def test_empty_batch() -> None:
    lp = torch.zeros(0, 5, requires_grad=True)
    out = pg_loss(
        LossInputs(lp, lp.detach(), torch.zeros(0), torch.zeros(0, 5), normalizer=0),
        spec(),
        impl="triton",
    )  # fmt: skip
    out.loss.backward()
    assert out.loss.item() == 0.0 and lp.grad.shape == (0, 5)


@pytest.mark.parametrize("clip_ratio_c", [None, 3.0])
def test_extreme_log_ratios_stay_finite(clip_ratio_c: float | None) -> None:
    case = _case(8)
    signs = torch.where(torch.arange(T) % 2 == 0, 1.0, -1.0).double()
    case["lp"] = torch.where(case["mask"] != 0, case["old"] + 60.0 * signs, -math.inf)
    case["lp"][0, :5] = case["old"][0, :5] + 19.0  # just inside the clamp: huge, finite ratios
    metrics = _check(
        case,
        clip_ratio_c=clip_ratio_c,
        rollout_correction="tis",
        atol=1e-3,
    )
    assert math.isfinite(metrics["ratio_max"]) and math.isfinite(metrics["approx_kl_sum"])


def test_bf16_logprobs_and_bool_mask() -> None:
    case = _case(9)
    lp = case["lp"].bfloat16().requires_grad_()
    old = case["old"].bfloat16()
    mask = case["mask"] != 0
    norm = loss_denominator(mask, "token-mean")
    got = pg_loss(
        LossInputs(lp, old, case["adv"].float(), mask, normalizer=norm), spec(), impl="triton"
    )
    got.loss.backward()
    lp64 = lp.detach().double().requires_grad_()
    want = torch_policy_loss(
        LossInputs(lp64, old.double(), case["adv"], mask, normalizer=norm), spec()
    )
    want.loss.backward()
    assert lp.grad.dtype == torch.bfloat16
    torch.testing.assert_close(got.loss.double(), want.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lp.grad.double(), lp64.grad, rtol=1e-2, atol=1e-4)


def test_upstream_gradient_scales_saved_gradient() -> None:
    case = _case(10)
    norm = loss_denominator(case["mask"], "token-mean")
    grads = []
    for factor in (1.0, -2.5):
        lp = case["lp"].float().requires_grad_()
        out = pg_loss(
            LossInputs(lp, case["old"].float(), case["adv"].float(), case["mask"], normalizer=norm),
            spec(),
            impl="triton",
        )  # fmt: skip
        (factor * out.loss).backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[1], -2.5 * grads[0])


def test_auto_is_torch_on_cpu_and_bad_impl_rejected() -> None:
    lp = torch.zeros(2, 3)
    assert resolve_pg_loss_impl("auto", lp) == "torch"
    with pytest.raises(ValueError, match="impl must be one of"):
        resolve_pg_loss_impl("cuda", lp)
    with pytest.raises(ValueError, match="float64"):
        pg_loss(
            LossInputs(lp.double(), lp.double(), lp.double(), lp, normalizer=1.0),
            spec(),
            impl="triton",
        )
    # Both implementations share the tensor checks of torch_policy_loss.
    for impl in ("torch", "triton"):
        with pytest.raises(ValueError, match=r"rollout_correction='mis' requires rollout_logprobs"):
            pg_loss(
                LossInputs(lp, lp, lp, lp, normalizer=1.0),
                spec(rollout_correction="mis"),
                impl=impl,
            )
        with pytest.raises(ValueError, match=r"mask_BT has shape \(2, 2\)"):
            pg_loss(LossInputs(lp, lp, lp, lp[:, :2], normalizer=1.0), spec(), impl=impl)
