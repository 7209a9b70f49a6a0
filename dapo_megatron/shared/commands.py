"""How the package spells its own commands in what it prints: ``.venv/bin/dapo-train``.

The two commands of the README install into a project-local ``.venv`` and never activate it,
so a bare ``dapo-train`` is not on a new user's PATH. The README and docs therefore show
``.venv/bin/dapo-<tool>``, and every message that tells the user to run one of the tools
spells it the same way, or as the path that works from where the user is:

1. the tool beside the script the user ran, when this process is one of the tools
   (``sys.argv[0]``, which Python sets to the script's path: ``/ckpt/.venv/bin/dapo-train``
   names ``/ckpt/.venv/bin/dapo-prepare``, whatever interpreter its first line names);
2. else the tool beside this interpreter (``<env>/bin/dapo-train``: another environment,
   such as ``.venv-vllm``, names its own);
3. else the documented ``.venv/bin/<tool>``.

A path inside the working directory is shown relative to it (``.venv/bin/dapo-plan``, which
the shell runs as a path since it holds a slash), any other absolute. Pure standard library,
no import of the package: every layer may use it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["DOCUMENTED_BIN", "tool_command"]

DOCUMENTED_BIN = ".venv/bin/"
"""The prefix the README and docs give every dapo-<tool> command."""


def _shown(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def tool_command(
    name: str,
    *,
    argv0: str | None = None,
    executable: str | None = None,
    cwd: Path | None = None,
) -> str:
    """The spelling of the tool ``name`` (``dapo-prepare``) for a command in a message.

    ``argv0``, ``executable`` and ``cwd`` default to this process's (tests pass their own).
    The paths are absolutised, not resolved: a venv's ``bin/python`` is a symlink to the
    base interpreter, whose directory holds no dapo tool.
    """
    cwd = Path.cwd() if cwd is None else cwd
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    if argv0 and Path(argv0).name.startswith("dapo-"):
        ran = Path(os.path.abspath(cwd / argv0))
        if (ran.parent / name).is_file():
            return _shown(ran.parent / name, cwd)
    if executable:
        beside = Path(os.path.abspath(cwd / executable)).parent / name
        if beside.is_file():
            return _shown(beside, cwd)
    return DOCUMENTED_BIN + name
