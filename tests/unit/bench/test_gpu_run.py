"""bench/gpu_run.py's hard stop, without a training run: a child that would outlive it is
ended, the JSON keeps the timed figures and says the run stopped, the exit status is 0.
(The whole script on a CPU, and a SIGTERM in a phase: tests/functional/test_gpu_run.py.)"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))
import gpu_run  # noqa: E402
import gpu_run_figures as figures  # noqa: E402
import gpu_run_guard as guard  # noqa: E402


def test_hard_stop_ends_the_child_and_writes_the_json_exit_0_with_a_timed_model(
    tmp_path, monkeypatch
):
    """gpu_run.main with its phases replaced: a model has timed figures, then a later phase's
    child runs into the hard stop; the child is ended, the JSON keeps the figures, the run
    says it stopped and exits 0."""
    out = tmp_path / "gpu_run.json"
    ctx = {"device": "cpu (test)", "device_kind": "cpu", "gpu_mem_gib": 80.0, "peak": None}
    monkeypatch.setattr(gpu_run.steps, "device_context", lambda: ctx)
    monkeypatch.delenv("GPU_RUN_STARTED", raising=False)
    seen: dict[str, object] = {}

    def run_all(self: gpu_run.GpuRun) -> None:
        def timed() -> None:
            values = {k: 1.0 for k in figures.MODEL_KEYS}
            values.update(model="m", phases_done=[], partial=True, resume_bit_exact=None)
            self.result["models"]["m"] = figures.model_entry(values)

        self.phase("m", "timed", timed)
        seen["json_after_timed"] = json.loads(out.read_text())

        def resume() -> None:  # a child that would outlive the hard stop
            gpu_run.run_cli(
                "import time; print('step 1/3', flush=True); time.sleep(300)",
                [],
                self.work / "m" / "resume1.log",
                "m resume 1/2",
                self.stop,
            )

        (self.work / "m").mkdir(parents=True, exist_ok=True)
        self.phase("m", "resume", resume)
        seen["not reached"] = True

    monkeypatch.setattr(gpu_run.GpuRun, "run_all", run_all)
    monkeypatch.setattr(guard, "MIN_PHASE_S", 1.0)
    monkeypatch.setattr(guard, "KILL_GRACE_S", 1.0)
    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    hard_stop = 6.0
    code = gpu_run.main(
        ["--out", str(out), "--work-dir", str(tmp_path / "work"), "--hard-stop-s", str(hard_stop)]
    )
    assert code == 0
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back
    assert time.monotonic() - started < hard_stop + 10
    assert "not reached" not in seen
    assert seen["json_after_timed"]["models"]["m"]["phases_done"] == ["timed"]
    result = json.loads(out.read_text())
    assert result["status"].startswith("stopped: hard stop: m resume 1/2 ended after")
    entry = result["models"]["m"]
    assert entry["step_s"] == 1.0 and entry["phases_done"] == ["timed"] and entry["partial"]
    assert "resume" in result["details"]["m"]["errors"]
    logs = (tmp_path / "gpu_run_logs.txt").read_text()
    assert "===== error: m resume" in logs and "step 1/3" in logs


def _run(tmp_path: Path, monkeypatch) -> gpu_run.GpuRun:
    ctx = {"device": "cuda (test)", "device_kind": "cuda", "gpu_mem_gib": 80.0, "peak": None}
    monkeypatch.delenv("GPU_RUN_STARTED", raising=False)
    args = gpu_run.parse_args(["--work-dir", str(tmp_path / "work")], cuda=True)
    return gpu_run.GpuRun(args, ctx, tmp_path / "gpu_run.json")


def test_decode_check_falls_back_to_eager_decoding_when_the_graph_fails(tmp_path, monkeypatch):
    """The decode check's child writes bench/decode_step.py's JSON; a failed graph check (or
    a child that fails) makes every later run decode eagerly, and the JSON says why."""
    outcomes = {"ok": True}

    def fake_cli(code, cli_args, logfile, label, stop):
        assert code == gpu_run.steps.DECODE_CHECK and "--device" in cli_args
        out = Path(cli_args[cli_args.index("--out") + 1])
        if outcomes.get("crash"):
            raise RuntimeError("decode check exited 1")
        graph = {
            "graph_ok": outcomes["ok"],
            "greedy_rows_equal": "4/4" if outcomes["ok"] else "3/4",
        }
        record = {"graph_check": graph, "model": {"layers": 4}}
        record.update({k: {"ms_per_token": 1.0} for k in ("before", "after_eager", "after")})
        out.write_text(json.dumps(record))
        return 1.0

    monkeypatch.setattr(gpu_run, "run_cli", fake_cli)
    for case, expect_eager in (
        ({"ok": True}, False),
        ({"ok": False}, True),
        ({"crash": True}, True),
    ):
        outcomes.clear()
        outcomes.update(case)
        run = _run(tmp_path, monkeypatch)
        ok = run.phase("qwen3-0.6b", "decode_check", lambda r=run: r.decode_check("qwen3-0.6b"))
        assert ok == (not case.get("crash"))
        # The flag reaches every later dapo-train through overrides() (*args.train_overrides).
        eager = "generation.engine.enforce_eager=true" in run.args.train_overrides
        assert eager == expect_eager, case
        assert run.result["decode_check"]["graph_check"]["graph_ok"] == (not expect_eager)
