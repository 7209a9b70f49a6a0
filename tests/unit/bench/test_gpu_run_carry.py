"""bench/gpu_run_carry.py and scripts/build_gpu_carry.sh: the carry's size budget."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))
import gpu_run_carry as carry  # noqa: E402

MIB = 2**20


def test_budget_is_what_the_tracked_tree_leaves_of_64_mib():
    assert carry.carry_budget(3 * MIB) == 61 * MIB
    assert carry.carry_budget(70 * MIB) == 0
    assert carry.fits(61 * MIB, 3 * MIB)
    assert not carry.fits(61 * MIB + 1, 3 * MIB)
    assert carry.fits(10, 0, limit=10) and not carry.fits(11, 0, limit=10)


def test_budget_cli_fails_a_carry_that_does_not_fit(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    (small / "a").write_bytes(b"x" * 1000)
    ok = subprocess.run(
        [sys.executable, str(REPO / "bench/gpu_run_carry.py"), "budget", str(small)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert ok.returncode == 0 and "fits" in ok.stdout, ok.stdout + ok.stderr
    big = tmp_path / "big"
    big.mkdir()
    with (big / "sparse").open("wb") as fh:  # 64 MiB that take no disk
        fh.truncate(carry.TRAVEL_LIMIT_BYTES)
    bad = subprocess.run(
        [sys.executable, str(REPO / "bench/gpu_run_carry.py"), "budget", str(big)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 1 and "DOES NOT FIT" in bad.stdout, bad.stdout + bad.stderr


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
def test_tracked_tree_is_counted_from_git():
    assert 0 < carry.tracked_bytes(REPO) < carry.TRAVEL_LIMIT_BYTES


def test_wheels_are_pinned_once_each():
    names = [w.split("==")[0].lower().replace("_", "-") for w in carry.WHEELS]
    assert all("==" in w for w in carry.WHEELS)
    assert len(names) == len(set(names))
    assert {"ray", "megatron-core", "math-verify", "tensorboardx"} <= set(names)


@pytest.mark.skipif(
    os.environ.get("DAPO_NETWORK_TESTS") != "1",
    reason="downloads ~40 MB of wheels from PyPI; CI has no network (DAPO_NETWORK_TESTS=1 runs it)",
)
def test_build_gpu_carry_fits_the_budget():
    out = subprocess.run(
        ["bash", str(REPO / "scripts/build_gpu_carry.sh")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1800,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (REPO / ".gpu_carry/pack/site.tar.xz").is_file()
    assert "fits" in out.stdout
