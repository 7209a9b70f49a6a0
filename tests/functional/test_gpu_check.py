"""scripts/gpu_check.sh as a user runs it: on this CPU machine the twins pass and every
CUDA-only section is skipped with a reason; a failing section is reported, not hidden."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import waits

from dapo_megatron.gpu_check.__main__ import SECTIONS, main

REPO = Path(__file__).resolve().parents[2]
CPU_TWINS = {"ipc_transport", "collectives", "megatron_step"}
"""Sections with a CPU twin: they must pass here."""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU report (skips listed)")
def test_gpu_check_on_cpu_runs_the_twins_and_lists_the_skips(tmp_path):
    out = tmp_path / "gpu_check_cpu.json"
    env = dict(os.environ, PYTHON=sys.executable)
    # Its sections compute quietly for a while: their CPU time is progress too.
    proc = waits.run(
        ["bash", "scripts/gpu_check.sh", "--out", str(out)], idle_s=120, cpu=True, cwd=REPO,
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    sections = report["sections"]
    assert set(sections) == set(SECTIONS)
    for name in CPU_TWINS:
        assert sections[name]["status"] == "passed", (name, sections[name])
    skipped = {n for n, r in sections.items() if r["status"] == "skipped"}
    assert skipped == set(SECTIONS) - CPU_TWINS
    for name in skipped:
        assert "CUDA" in sections[name]["reason"], sections[name]
        assert f"skipped {name}: " in proc.stdout  # listed at the end of the output
    assert report["summary"] == {
        "passed": len(CPU_TWINS),
        "failed": 0,
        "skipped": len(skipped),
        "timeout": 0,
    }
    # The twins checked something: HF float64 parity and byte-exact transport.
    step = sections["megatron_step"]["result"]
    assert step["max_abs_lp_packed_vs_hf64"] < 1e-4 and step["max_abs_grad_err"] < 1e-4
    assert sections["ipc_transport"]["result"]["byte_exact"] is True


def test_a_failing_section_is_recorded_and_fails_the_run(tmp_path, monkeypatch):
    """The runner records a section's exception and exits 1, going on with the others."""
    import dapo_megatron.gpu_check.__main__ as runner

    monkeypatch.setitem(runner.SECTIONS, "env", ("dapo_megatron.gpu_check.no_such:f", 30))
    out = tmp_path / "report.json"
    status = main(["--sections", "env,kernels", "--out", str(out), "--budget-s", "120"])
    report = json.loads(out.read_text())
    assert status == 1
    assert report["sections"]["env"]["status"] == "failed"
    assert "ModuleNotFoundError" in report["sections"]["env"]["error"]
    assert report["sections"]["kernels"]["status"] in ("skipped", "passed")
