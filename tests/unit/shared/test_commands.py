"""shared/commands.py: the spelling of the dapo tools in what the package prints."""

from __future__ import annotations

from pathlib import Path

from dapo_megatron.shared.commands import DOCUMENTED_BIN, tool_command


def venv(root: Path, *tools: str) -> Path:
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", *tools):
        (bin_dir / name).write_text("#!/bin/sh\n")
    return bin_dir


def test_the_documented_spelling_from_the_checkout(tmp_path: Path) -> None:
    # The README's two commands leave the tools in .venv/bin, not on PATH: a bare
    # `dapo-prepare` in a message was a command not found.
    bin_dir = venv(tmp_path, "dapo-train", "dapo-prepare")
    got = tool_command("dapo-prepare", argv0="-c", executable=str(bin_dir / "python"), cwd=tmp_path)
    assert got == ".venv/bin/dapo-prepare" == DOCUMENTED_BIN + "dapo-prepare"


def test_the_tool_beside_the_one_the_user_ran(tmp_path: Path) -> None:
    # A console script's interpreter is the venv's python however it was reached; the user
    # typed the script's path, whose directory holds its sibling tools.
    bin_dir = venv(tmp_path / "ckpt", "dapo-train", "dapo-prepare")
    other = venv(tmp_path / "elsewhere")
    argv0 = str(bin_dir / "dapo-train")
    got = tool_command("dapo-prepare", argv0=argv0, executable=str(other / "python"), cwd=tmp_path)
    assert got == "ckpt/.venv/bin/dapo-prepare"
    # Outside the working directory: the absolute path, which works from anywhere.
    away = tmp_path / "away"
    away.mkdir()
    assert tool_command("dapo-prepare", argv0=argv0, executable="", cwd=away) == str(
        bin_dir / "dapo-prepare"
    )


def test_another_environment_names_its_own_tool(tmp_path: Path) -> None:
    bin_dir = tmp_path / ".venv-vllm" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "dapo-train").write_text("")
    got = tool_command(
        "dapo-train", argv0="/usr/bin/pytest", executable=str(bin_dir / "python"), cwd=tmp_path
    )
    assert got == ".venv-vllm/bin/dapo-train"


def test_no_tool_anywhere_falls_back_to_the_documented_spelling(tmp_path: Path) -> None:
    got = tool_command("dapo-plan", argv0="", executable="/usr/bin/python3", cwd=tmp_path)
    assert got == ".venv/bin/dapo-plan"
