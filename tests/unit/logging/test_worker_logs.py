"""Workers' output files (logging/worker_logs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_worker_output_stays_put_outside_a_ray_actor(tmp_path):
    from dapo_megatron.logging import redirect_worker_output

    assert redirect_worker_output(tmp_path, "policy_rank0") is None  # pytest's own output
    assert not (tmp_path / "logs").exists()


def test_worker_output_goes_to_its_file_in_an_actor(tmp_path):
    """In an actor, Python's and C-level (fd) output of the process lands in the file."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from dapo_megatron.logging import worker_logs
        worker_logs.in_ray_actor = lambda: True  # what a Ray actor's process sees
        print("before")
        path = worker_logs.redirect_worker_output(Path({str(tmp_path)!r}), "policy_rank1")
        print("megatron says hello")
        print("a warning", file=sys.stderr)
        os.write(2, b"from C\\n")
        sys.stdout.flush()
        assert path is not None and path.name == "policy_rank1.log"
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "before\n" and proc.stderr == ""
    log = (tmp_path / "logs" / "workers" / "policy_rank1.log").read_text()
    assert log.splitlines() == ["megatron says hello", "a warning", "from C"]
