"""Feed dapo-train the bad inputs and faults that can be found before any worker starts, and
print, per case, the exit status, the seconds it took and the error line the user sees.

    .venv/bin/python scripts/reliability_cases.py [--no-jobs]

Then (unless --no-jobs) the faults of a running job, from scripts/reliability_jobs.py:
SIGTERM mid-run, a rank killed in a collective, a rank stopped (SIGSTOP), a full disk
during a save, a vLLM engine killed (/dev/shm after) and a node lost (about a minute each).

Each case builds its broken input for real in a temporary directory (a truncated
safetensors file, invalid UTF-8, a 50 MB line, ...). The faults that need a running job
(a second process on a live run directory, Ctrl-C, exhausted restarts, a damaged newest
checkpoint, a full disk) are exercised by tests/functional/test_clean_exits.py,
tests/unit/storage/test_run_dir.py,
tests/unit/storage/test_checkpoint_dirs.py and
tests/distributed/test_checkpoint.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reliability_cases_resume import resume_cases

REPO = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "dapo_megatron.cli"]


def _gsm8k_file(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _row(question: str) -> bytes:
    return json.dumps({"question": question, "answer": "2 #### 2"}).encode()


def _cases(tmp: Path, model: Path) -> list[tuple[str, list[str]]]:
    from dapo_megatron.data.tiny_model import create_tiny_model

    create_tiny_model(model, seed=0)
    file_data = ["data.format=gsm8k", "reward.verifier=gsm8k", f"policy.model_name_or_path={model}"]
    good = [_row("1+1=?") for _ in range(4)]
    utf8 = _gsm8k_file(
        tmp / "latin1.jsonl", [*good, b'{"question": "caf\xe9", "answer": "1 #### 1"}']
    )
    huge = _gsm8k_file(tmp / "huge.jsonl", [*good, _row("7" * 50_000_000)])
    dup = tmp / "dup.yaml"
    dup.write_text(
        f"defaults: {REPO / 'recipes' / 'dapo-tiny-cpu.yaml'}\n"
        "dapo:\n  max_num_steps: 3\nrun:\n  name: dup\ndapo:\n  num_prompts_per_step: 4\n"
    )
    no_tok = tmp / "no-tokenizer"
    shutil.copytree(model, no_tok)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (no_tok / name).unlink(missing_ok=True)
    truncated = tmp / "truncated"
    shutil.copytree(model, truncated)
    weights = truncated / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 100)
    random = tmp / "random"
    shutil.copytree(model, random)
    (random / "model.safetensors").write_bytes(os.urandom(4096))
    used = tmp / "used-run"
    used.mkdir()
    (used / "metrics.jsonl").write_text('{"step": 1}\n')
    return [
        ("cluster.gpus_per_node=0", ["cluster.gpus_per_node=0"]),
        ("same top-level key twice", ["--config", str(dup)]),
        ("50 MB single-line prompt", [*file_data, f"data.train_path={huge}"]),
        ("non-UTF-8 bytes in a jsonl", [*file_data, f"data.train_path={utf8}"]),
        ("tokenizer files missing", [f"policy.model_name_or_path={no_tok}"]),
        ("truncated model.safetensors", [f"policy.model_name_or_path={truncated}"]),
        ("random model.safetensors", [f"policy.model_name_or_path={random}"]),
        ("tokenizer path does not exist", [f"policy.tokenizer_name_or_path={tmp / 'nope'}"]),
        ("cluster.device=cuda on a CPU host", ["cluster.device=cuda"]),
        (
            "resume=never over a used run directory",
            [f"run.output_dir={used}", "checkpointing.resume=never"],
        ),
        ("override after a flag", ["run.name=a", "--dry-run", "dapo.max_num_steps=2"]),
        *resume_cases(tmp, model, file_data),  # issue 30: run dirs, checkpoints, data
    ]


def main() -> int:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for title, args in _cases(tmp, tmp / "model"):
            start = time.perf_counter()
            command = args if args[:1] == [sys.executable] else [*TRAIN, *args]
            out = subprocess.run(
                command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
            )
            seconds = time.perf_counter() - start
            lines = [x for x in out.stderr.splitlines() if x.strip()]
            shown = " | ".join(lines[:3]) if lines else out.stdout.splitlines()[-1]
            traceback = " TRACEBACK" if "Traceback" in out.stderr else ""
            print(f"{title}: rc {out.returncode}, {seconds:.1f} s{traceback}: {shown}", flush=True)
        if "--no-jobs" not in sys.argv:  # the faults of a running job (scripts/reliability_jobs.py)
            _run_job_cases(tmp)
    return 0


def _run_job_cases(tmp: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    import reliability_jobs as jobs

    for title, case in jobs.JOB_CASES:
        outcome = case(tmp, tmp / "model")
        traceback = " TRACEBACK" if "Traceback" in outcome.output else ""
        print(
            f"{title}: rc {outcome.rc}, {outcome.seconds:.1f} s after the fault{traceback}: "
            f"{jobs.shown(outcome)}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
