"""dapo-export (megatron/export_hf.py) refuses a checkpoint that does not verify, naming the
damaged file and a checkpoint that does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dapo_megatron.storage.checkpoint_dirs import write_marker

SHARD = "model/__0_0.distcp"


def test_export_refuses_a_damaged_checkpoint_naming_the_file_and_a_good_one(
    tmp_path: Path,
) -> None:
    # dapo-export's first check (issue 30, case 1): before it, a flipped byte in a shard
    # was exported as garbage (rc 0) and a truncated one failed deep in torch.load.
    import subprocess
    import sys

    from dapo_megatron.megatron.export_hf import ExportError, check_checkpoint_dir

    def checkpoint(step: int) -> Path:
        path = tmp_path / "checkpoints" / f"step_{step:06d}"
        (path / "model").mkdir(parents=True)
        (path / SHARD).write_bytes(os.urandom(3000))
        write_marker(path, {"format_version": 1, "step": step, "layout": {"tp": 1, "pp": 1}})
        return path

    good, newest = checkpoint(2), checkpoint(4)
    assert check_checkpoint_dir(newest)["step"] == 4
    data = bytearray((newest / SHARD).read_bytes())
    data[1234] ^= 0x01
    (newest / SHARD).write_bytes(bytes(data))
    with pytest.raises(ExportError, match=f"{SHARD}: sha256 .* recorded.* export {good}"):
        check_checkpoint_dir(newest)
    assert check_checkpoint_dir(newest, verify=False)["step"] == 4  # what the ranks call
    os.truncate(good / SHARD, 100)
    with pytest.raises(ExportError, match=r"size 100 != 3000 recorded; restore its files \("):
        check_checkpoint_dir(good)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from dapo_megatron.cli import export_main; sys.exit(export_main())",
            "--checkpoint",
            str(newest),
            "--out",
            str(tmp_path / "hf"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "does not verify" in lines[0], out.stderr
    assert not (tmp_path / "hf").exists()
