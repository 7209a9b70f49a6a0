"""DAPO_NO_TRITON=1: ``impl="auto"`` keeps to the torch paths on CUDA too."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import torch

from dapo_megatron.kernels import dispatch

# The module, not the function the package re-exports under the same name.
pg_loss = importlib.import_module("dapo_megatron.kernels.pg_loss")


def test_auto_skips_triton_when_told(monkeypatch):
    # A stand-in for a bf16 CUDA tensor on an sm_90 card: the branch auto takes there.
    cuda_bf16 = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, device="cuda:0")
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    monkeypatch.setattr(pg_loss, "triton_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv(dispatch.NO_TRITON_ENV, raising=False)
    assert dispatch._resolve_impl("auto", cuda_bf16) == "triton"
    assert pg_loss.resolve_pg_loss_impl("auto", cuda_bf16) == "triton"
    monkeypatch.setenv(dispatch.NO_TRITON_ENV, "1")
    assert dispatch._resolve_impl("auto", cuda_bf16) == "chunked"
    assert pg_loss.resolve_pg_loss_impl("auto", cuda_bf16) == "torch"
    assert dispatch._resolve_impl("triton", cuda_bf16) == "triton"  # explicit stays
    monkeypatch.setenv(dispatch.NO_TRITON_ENV, "0")
    assert dispatch._resolve_impl("auto", cuda_bf16) == "triton"
