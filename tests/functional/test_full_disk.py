"""A disk that fills up during a run's checkpoint save is one line (rc 1): the failing rank's
error, and no "Unhandled error" block from Ray with the other rank's copy of it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tiny_job import run_job, train_command

pytestmark = pytest.mark.functional


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (a checkpoint of the tiny model needs ~2 MB): root only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_during_a_save_is_one_line(tmp_path, small_disk):
    run_dir = tmp_path / "run"
    checkpoints = small_disk / "checkpoints"
    cmd = train_command(
        run_dir,
        tmp_path / "model",
        "dapo.max_num_steps=1",
        "sft_warmup.num_steps=30",
        "dapo.dynamic_sampling.max_gen_batches=0",
        "validation.val_at_start=false",
        "validation.val_period=0",
        "logger.progress_bar=false",
        "logger.plots=false",
        f"checkpointing.checkpoint_dir={checkpoints}",
    )
    out = run_job(cmd)
    output = out.stdout + out.stderr
    assert out.returncode == 1, output[-3000:]
    assert "Unhandled error" not in output and "Traceback" not in output, output[-3000:]
    errors = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert errors == [
        f"error: saving checkpoint to {checkpoints / 'step_000001'} failed: "
        "[Errno 28] No space left on device"
    ], output[-3000:]


def test_a_full_disk_during_dapo_export_is_one_line(tmp_path, small_disk):
    run_dir = tmp_path / "run"
    train = run_job(
        train_command(
            run_dir,
            tmp_path / "model",
            "dapo.max_num_steps=1",
            "sft_warmup.num_steps=0",
            "dapo.dynamic_sampling.max_gen_batches=0",
            "validation.val_at_start=false",
            "validation.val_period=0",
            "logger.progress_bar=false",
            "logger.plots=false",
            "checkpointing.export_hf=false",
        )
    )
    assert train.returncode == 0, train.stderr[-3000:]
    out_dir = small_disk / "hf"
    (small_disk / "filler").write_bytes(bytes(200 * 1024))  # leaves less than the weights
    export = run_job(
        [
            sys.executable, "-c",
            "import sys; from dapo_megatron.cli import export_main; sys.exit(export_main())",
            "--checkpoint", str(run_dir / "checkpoints" / "step_000001"), "--out", str(out_dir),
        ],
        progress_paths=(out_dir,),
    )  # fmt: skip
    assert export.returncode == 1, export.stdout[-2000:] + export.stderr[-3000:]
    # (the export ranks' library warnings are not ours to silence here)
    lines = [x for x in export.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in export.stderr, export.stderr[-3000:]
    assert lines[0].startswith(f"error: the export failed, {out_dir} was not written: rank 0: "), (
        lines[0]
    )
    assert "No space left on device" in lines[0], lines[0]
