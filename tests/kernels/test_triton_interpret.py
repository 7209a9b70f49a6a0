"""dapo_megatron/kernels/triton_interpret.py: loop bounds from one-element interpreter tensors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dapo_megatron.kernels import triton_interpret


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_index_of_one_element_arrays(shape):
    # Triton 3.6 keeps scalars as shape-(1,) arrays; NumPy 2.4's int() refuses those.
    tensor = SimpleNamespace(handle=SimpleNamespace(data=np.full(shape, 7, dtype=np.int32)))
    assert triton_interpret._index(tensor) == 7
    assert list(range(0, 21, triton_interpret._index(tensor))) == [0, 7, 14]


def test_patch_is_applied_once_under_the_interpreter():
    from triton.runtime import interpreter

    triton_interpret.patch_interpreter()  # the kernel modules did it already (conftest sets 1)
    hook = interpreter._patch_lang_tensor
    triton_interpret.patch_interpreter()
    assert interpreter._patch_lang_tensor is hook
    assert triton_interpret._patched
