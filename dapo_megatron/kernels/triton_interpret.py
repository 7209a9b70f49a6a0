"""One fix to older Triton interpreters (``TRITON_INTERPRET=1``, the CPU tests' mode).

Under the interpreter every scalar of a kernel (an int argument, ``tl.program_id``) is a
NumPy array of shape ``(1,)``, and a loop bound reaches Python's ``range`` through the
tensor's ``__index__``. Triton 3.6 defines it as ``int(self.handle.data)``; NumPy 2.4 no
longer converts an array of shape ``(1,)`` with ``int()`` (its deprecation since 1.25
expired: "only 0-dimensional arrays can be converted to Python scalars"), so every kernel
with a ``for ... in range(..., n_hidden, ...)`` fails there. Triton 3.9 squeezes the array
first; :func:`patch_interpreter` gives older interpreters the same ``__index__``. Compiled
kernels never see it: the patch applies only while the interpreter runs a kernel.
"""

from __future__ import annotations

import os
from typing import Any

_patched = False


def _index(self: Any) -> int:
    """``int`` of a one-element interpreter tensor of any rank (Triton 3.9's definition)."""
    return int(self.handle.data.reshape(-1)[0])


def patch_interpreter() -> None:
    """Under ``TRITON_INTERPRET=1``: every kernel run patches ``tl.tensor.__index__`` with
    :func:`_index` after Triton's own patches (and undoes it with them). Idempotent; a
    no-op for compiled kernels and for an interpreter without the hook it wraps."""
    global _patched
    if _patched or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:  # a Triton that patches tensors some other way: left alone
        return

    def patch_lang_tensor(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        # The scope restores in reverse order: this first, then Triton's own.
        scope.set_attr(tensor, "__index__", _index)

    interpreter._patch_lang_tensor = patch_lang_tensor
    _patched = True
