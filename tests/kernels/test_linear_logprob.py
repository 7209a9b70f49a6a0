"""linear_logprob (chunked path, single process) against the float64 materialised reference.

Every check compares with ``linear_logprob_reference`` run in float64 on the same input
values, with gradients from autograd, so the hand-written backward is checked against an
independent derivation. Shapes have ragged tails (N=67 with chunks of 16, V=1000, H=96).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from dapo_megatron.kernels import linear_logprob
from dapo_megatron.kernels.reference import linear_logprob_reference

N, H, V = 67, 96, 1000


def _inputs(
    n: int = N,
    h: int = H,
    v: int = V,
    *,
    dtype: torch.dtype = torch.float64,
    logit_scale: float = 3.0,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden, weight, targets with logits of standard deviation about ``logit_scale``."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64) * (logit_scale / h**0.5)
    targets = torch.randint(0, v, (n,), generator=gen)
    return hidden.to(dtype), weight.to(dtype), targets


def _run(
    fn,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    coef_lp: torch.Tensor,
    coef_ent: torch.Tensor | None,
    **kwargs,
) -> dict[str, torch.Tensor]:
    """Forward + backward of ``sum(a * lp + b * ent)``; returns outputs and input grads."""
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    lp, ent = fn(hidden, weight, targets, compute_entropy=coef_ent is not None, **kwargs)
    loss = (coef_lp.to(lp.dtype) * lp).sum()
    if coef_ent is not None:
        loss = loss + (coef_ent.to(ent.dtype) * ent).sum()
    loss.backward()
    out = {"lp": lp.detach(), "dH": hidden.grad, "dW": weight.grad}
    if coef_ent is not None:
        out["ent"] = ent.detach()
    return out


def _reference(hidden, weight, targets, coef_lp, coef_ent, **kwargs) -> dict[str, torch.Tensor]:
    """The float64 reference on the same input VALUES (low-precision inputs are upcast)."""
    return _run(
        linear_logprob_reference,
        hidden.double(),
        weight.double(),
        targets,
        coef_lp,
        coef_ent,
        **kwargs,
    )


def _coefs(n: int, entropy: bool, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    coef_lp = torch.randn(n, generator=gen, dtype=torch.float64)
    coef_ent = torch.randn(n, generator=gen, dtype=torch.float64) if entropy else None
    return coef_lp, coef_ent


def _assert_close(got: dict, want: dict, *, rtol: float, atol: float) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(
            got[key].double(), want[key], rtol=rtol, atol=atol, msg=lambda m, k=key: f"{k}: {m}"
        )


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("chunk_size", [16, 67, None])
@pytest.mark.parametrize("entropy", [False, True])
def test_float64_matches_reference(temperature: float, chunk_size: int | None, entropy: bool):
    hidden, weight, targets = _inputs()
    coef_lp, coef_ent = _coefs(N, entropy)
    kwargs = dict(temperature=temperature)
    got = _run(
        linear_logprob, hidden, weight, targets, coef_lp, coef_ent, chunk_size=chunk_size, **kwargs
    )
    want = _reference(hidden, weight, targets, coef_lp, coef_ent, **kwargs)
    assert got["lp"].dtype == torch.float64
    _assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_float32_matches_reference(temperature: float):
    hidden, weight, targets = _inputs(dtype=torch.float32)
    coef_lp, coef_ent = _coefs(N, True)
    got = _run(
        linear_logprob,
        hidden,
        weight,
        targets,
        coef_lp,
        coef_ent,
        chunk_size=16,
        temperature=temperature,
    )
    want = _reference(hidden, weight, targets, coef_lp, coef_ent, temperature=temperature)
    assert got["lp"].dtype == got["ent"].dtype == torch.float32
    assert got["dH"].dtype == got["dW"].dtype == torch.float32
    _assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype: torch.dtype):
    hidden, weight, targets = _inputs(dtype=dtype)
    coef_lp, coef_ent = _coefs(N, True)
    got = _run(
        linear_logprob, hidden, weight, targets, coef_lp, coef_ent, chunk_size=16, temperature=0.9
    )
    want = _reference(hidden, weight, targets, coef_lp, coef_ent, temperature=0.9)
    # Logits are computed in fp32 from the low-precision values, so logprob and entropy
    # are fp32-accurate; gradients are returned in the input dtype (~3 significant digits).
    assert got["lp"].dtype == got["ent"].dtype == torch.float32
    assert got["dH"].dtype == got["dW"].dtype == dtype
    torch.testing.assert_close(got["lp"].double(), want["lp"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["ent"].double(), want["ent"], rtol=1e-5, atol=1e-5)
    for key in ("dH", "dW"):
        scale = want[key].abs().max().item()
        torch.testing.assert_close(got[key].double(), want[key], rtol=1e-2, atol=1e-2 * scale)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_large_logits_are_finite_and_bounded(dtype: torch.dtype):
    # Logits of magnitude ~1e4: exp overflows without the max shift; lse - E[z] would
    # cancel to noise if the entropy were not computed relative to the max.
    hidden, weight, targets = _inputs(dtype=dtype, logit_scale=1e4)
    # Half the targets are the row's argmax, where logprob is ~0 and rounding could make
    # it positive.
    logits = hidden.double() @ weight.double().T
    targets[::2] = logits.argmax(dim=1)[::2]
    assert logits.abs().max() > 1e4
    coef_lp, coef_ent = _coefs(N, True)
    got = _run(linear_logprob, hidden, weight, targets, coef_lp, coef_ent, chunk_size=16)
    want = _reference(hidden, weight, targets, coef_lp, coef_ent)
    for value in got.values():
        assert torch.isfinite(value).all()
    assert (got["lp"] <= 0).all()
    assert (got["ent"] >= 0).all()
    # fp32 logits of size 1e4 carry relative errors ~1e-6 (1e-2 absolute), which the
    # logprob (itself of size 1e4 off the argmax) inherits.
    tol = {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 1e-5}[dtype]
    torch.testing.assert_close(got["lp"].double(), want["lp"], rtol=tol, atol=tol)
    torch.testing.assert_close(got["ent"].double(), want["ent"], rtol=tol, atol=tol)
    if dtype == torch.float64:
        _assert_close(got, want, rtol=1e-8, atol=1e-8)


def test_target_is_argmax_logprob_never_positive():
    # A dominant target logit: logprob is 0 up to rounding and must come out <= 0, with
    # tokens of the same row spread over several chunks of vocabulary rows.
    hidden, weight, targets = _inputs(n=32, h=16, v=500, dtype=torch.float32, logit_scale=200.0)
    targets = (hidden.double() @ weight.double().T).argmax(dim=1)
    lp, ent = linear_logprob(hidden, weight, targets, compute_entropy=True, chunk_size=5)
    want_lp, _ = linear_logprob_reference(hidden.double(), weight.double(), targets)
    assert want_lp.max() > -1e-6  # the delicate case: probability ~1
    assert (lp <= 0).all() and (ent >= 0).all()
    torch.testing.assert_close(lp.double(), want_lp, rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_150k_logprob_never_positive(dtype: torch.dtype):
    vocab = 152_064  # Qwen2.5's padded vocabulary
    hidden, weight, targets = _inputs(n=6, h=32, v=vocab, dtype=dtype, logit_scale=20.0)
    targets[:3] = (hidden.double() @ weight.double().T).argmax(dim=1)[:3]
    lp, ent = linear_logprob(hidden, weight, targets, compute_entropy=True, chunk_size=4)
    want_lp, want_ent = linear_logprob_reference(
        hidden.double(), weight.double(), targets, compute_entropy=True
    )
    assert (lp <= 0).all() and torch.isfinite(lp).all()
    assert (ent >= 0).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-4)


def test_chunk_size_invariance():
    hidden, weight, targets = _inputs(dtype=torch.float32)
    coef_lp, coef_ent = _coefs(N, True)
    results = [
        _run(linear_logprob, hidden, weight, targets, coef_lp, coef_ent, chunk_size=c)
        for c in (1, 7, 16, N, 10 * N)
    ]
    for other in results[1:]:
        for key in results[0]:
            torch.testing.assert_close(other[key], results[0][key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["logprob-only", "entropy-only", "weight-only", "hidden-only"])
def test_partial_gradients(which: str):
    """Unused outputs (None grads) and frozen inputs take their own backward branches."""
    hidden, weight, targets = _inputs()
    results = []
    for fn in (linear_logprob, linear_logprob_reference):
        h = hidden.clone().requires_grad_(which != "weight-only")
        w = weight.clone().requires_grad_(which != "hidden-only")
        lp, ent = fn(h, w, targets, compute_entropy=True, temperature=0.8)
        loss = ent.sum() if which == "entropy-only" else lp.sum()
        loss.backward()
        results.append((h.grad, w.grad))
    for got, want in zip(results[0], results[1], strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_gradcheck_float64():
    hidden, weight, targets = _inputs(n=5, h=4, v=11)
    hidden.requires_grad_()
    weight.requires_grad_()

    def fn(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp, ent = linear_logprob(h, w, targets, temperature=0.8, compute_entropy=True, chunk_size=2)
        return lp, ent

    assert torch.autograd.gradcheck(fn, (hidden, weight))


class _LargestOutput(TorchDispatchMode):
    """Records the largest tensor any aten op produces (to catch [N, V] allocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


def test_never_allocates_full_logits():
    n, h, v, chunk = 64, 8, 1000, 16  # weight (8k elements) < one chunk (16k) < [N, V] (64k)
    hidden, weight, targets = _inputs(n=n, h=h, v=v, dtype=torch.float32)
    hidden.requires_grad_()
    weight.requires_grad_()
    with _LargestOutput() as mode:
        lp, ent = linear_logprob(hidden, weight, targets, compute_entropy=True, chunk_size=chunk)
        (lp.sum() + ent.sum()).backward()
    assert mode.max_numel <= chunk * v
    with _LargestOutput() as naive:
        lp, _ = linear_logprob(hidden, weight, targets, impl="reference")
    assert naive.max_numel >= n * v  # the probe does see full logits when they exist


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 40),
    h=st.integers(1, 24),
    v=st.integers(1, 300),
    chunk=st.integers(1, 50),
    temperature=st.floats(0.25, 4.0),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_match_reference(n, h, v, chunk, temperature, seed):
    hidden, weight, targets = _inputs(n, h, v, seed=seed)
    coef_lp, coef_ent = _coefs(n, True, seed=seed + 1)
    got = _run(
        linear_logprob,
        hidden,
        weight,
        targets,
        coef_lp,
        coef_ent,
        chunk_size=chunk,
        temperature=temperature,
    )
    want = _reference(hidden, weight, targets, coef_lp, coef_ent, temperature=temperature)
    _assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_reference_impl_through_dispatch_matches_chunked():
    hidden, weight, targets = _inputs(dtype=torch.bfloat16)
    chunked = linear_logprob(hidden, weight, targets, compute_entropy=True, impl="chunked")
    reference = linear_logprob(hidden, weight, targets, compute_entropy=True, impl="reference")
    for got, want in zip(chunked, reference, strict=True):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_empty_batch():
    hidden, weight, _ = _inputs(n=0)
    lp, ent = linear_logprob(hidden, weight, torch.zeros(0, dtype=torch.long), compute_entropy=True)
    assert lp.shape == ent.shape == (0,)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(impl="triton"), "impl"),
        (dict(vocab_start=1), "vocab_start=1"),
        (dict(targets=torch.full((N,), V)), f"token id {V}"),
        (dict(targets=torch.full((N,), -100)), "token id -100"),
        (dict(targets=torch.zeros(N - 1, dtype=torch.long)), "targets_N"),
        (dict(targets=torch.zeros(N)), "targets_N"),
        (dict(hidden=torch.zeros(N, H + 1, dtype=torch.float64)), "weight_VH"),
        (dict(hidden=torch.zeros(1, N, H, dtype=torch.float64)), "hidden_NH"),
        (dict(weight=torch.zeros(V, H, dtype=torch.float32)), "dtype"),
    ],
)
def test_invalid_arguments_raise(change: dict, match: str):
    hidden, weight, targets = _inputs()
    args = dict(hidden=hidden, weight=weight, targets=targets)
    args.update({k: change.pop(k) for k in list(change) if k in args})
    with pytest.raises(ValueError, match=match):
        linear_logprob(args["hidden"], args["weight"], args["targets"], **change)
