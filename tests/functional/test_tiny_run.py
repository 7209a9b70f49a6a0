"""End to end: the tiny CPU recipe through real Ray workers (2 Megatron ranks on gloo)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_job import job_env, run_job, train_command

pytestmark = pytest.mark.functional

EXPORT_MAIN = "import sys; from dapo_megatron.cli import export_main; sys.exit(export_main())"


def _run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = train_command(tmp_path, tmp_path / "model", "logger.progress_bar=false", *overrides)
    # Ray's authentication default, as a user's launch has it (job_env opts out): the console
    # must stay ours either way.
    env = {k: v for k, v in job_env().items() if k != "RAY_AUTH_MODE"}
    return run_job(cmd, env=env)


def test_three_steps_of_the_tiny_recipe(tmp_path):
    out = _run(
        tmp_path,
        "dapo.max_num_steps=3",
        "sft_warmup.num_steps=40",
        "validation.val_period=3",
        "checkpointing.save_period=2",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    _check_console(tmp_path, out.stdout, out.stderr)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row in steps:
        for key in (
            "loss",
            "grad_norm",
            "reward/acc",
            "dynamic_sampling/keep_rate",
            "response_length/mean",
            "timing/step_s",
            "policy/entropy",
        ):
            assert math.isfinite(row[key]), (key, row)
        assert 0 < row["dynamic_sampling/keep_rate"] <= 1
        # Lmax = 16 and a 4-token buffer: the penalty can never pass -penalty_factor.
        assert -1.0 <= row["reward/overlong_penalty_mean"] <= 0.0
        # Fresh rollouts from the model that trains: engine and trainer agree exactly (fp32).
        if row["dynamic_sampling/num_carried_in"] == 0:
            assert row["mismatch/token_mult_prob_error"] < 1e-5, row
    assert "val/acc" in steps[-1] and "val/acc" in rows[0]
    checkpoints = sorted(  # .lock: the run's lock covers its checkpoint directory too
        p.name for p in (tmp_path / "checkpoints").iterdir() if not p.name.startswith(".")
    )
    assert checkpoints == ["step_000002", "step_000003"]
    assert list((tmp_path / "plots").glob("*.png"))
    # The recipe exports its final model (checkpointing.export_hf): an HF checkpoint whose
    # weights are those of the final distributed checkpoint.
    import safetensors.torch
    import transformers

    export = tmp_path / "hf" / "step_000003"
    model = transformers.AutoModelForCausalLM.from_pretrained(export)
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    assert tokenizer("3+5+1=")["input_ids"]
    exported = safetensors.torch.load_file(export / "model.safetensors")
    initial = safetensors.torch.load_file(tmp_path / "model" / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    assert not exported[name].equal(initial[name])  # trained, not the starting weights
    assert model.state_dict()[name].equal(exported[name])
    assert (tmp_path / "config.yaml").is_file()  # the resolved config, for dapo-export
    _check_cli_export(tmp_path / "checkpoints" / "step_000003", tmp_path / "hf-cli")


def _check_cli_export(checkpoint: Path, out: Path) -> None:
    """dapo-export as the README shows it, in a process of its own: its two lines and
    nothing else. Each export rank printed nine warnings of Megatron and torch (no TE/Apex,
    deprecated load_state_dict and ShardedTensor) before export_launch filtered them."""
    command = [
        sys.executable,
        "-c",
        EXPORT_MAIN,
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(out),
    ]
    done = run_job(command, progress_paths=(out,))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    third_party = [
        line
        for line in lines
        if re.search(r"Warning\b|warnings\.warn|site-packages/", line) or line.startswith("  ")
    ]
    assert third_party == [], "\n".join(lines)
    assert [line.split(":")[0] for line in lines] == ["dapo-export", "dapo-export"], lines
    assert (out / "model.safetensors").is_file()


def _check_console(run_dir: Path, stdout: str, stderr: str) -> None:
    """The console of a run in a log file (no terminal): our lines only, one per DAPO step
    and one per 10 SFT steps, a closing summary, no third-party progress bar, the workers'
    output in files under the run directory."""
    console = stdout + stderr
    lines = console.splitlines()
    assert len(lines) <= 30, console
    assert "Writing model shards" not in console and "\r" not in console  # no tqdm bars
    assert sum(bool(re.match(r"step \d+/3 ", line)) for line in lines) == 3, console
    sft = [line for line in lines if line.startswith("sft warm-up ")]
    assert [line.split()[2] for line in sft] == ["10/40", "20/40", "30/40", "40/40"], console
    assert "step 3/3 " in console and "val_acc=" in console
    assert "{" not in console  # no Python dict in the summary
    # No log line of Ray's own ("... INFO worker.py:2038 -- Started a local Ray instance.",
    # the token-authentication WARNING).
    assert not re.search(r"^\d{4}-\d\d-\d\d .*\b(INFO|WARNING)\b", console, re.M), console
    summary = stdout[stdout.index("dapo-train: finished") :].splitlines()
    assert summary[0].startswith("dapo-train: finished 3/3 steps in ")
    assert summary[1].startswith("  validation accuracy  ") and "before training" in summary[1]
    assert summary[2] == f"  last checkpoint      {run_dir / 'checkpoints' / 'step_000003'}"
    assert summary[3] == f"  Hugging Face export  {run_dir / 'hf' / 'step_000003'}"
    logs = run_dir / "logs" / "workers"
    assert console.count(str(logs)) == 2  # named once at the start, once in the summary
    assert sorted(p.name for p in logs.iterdir()) == ["policy_rank0.log", "policy_rank1.log"]
    assert "(PolicyWorker pid=" not in console  # Ray's forwarding of worker output
    assert (run_dir / "sft_metrics.jsonl").is_file() and (
        run_dir / "plots" / "sft_warmup.png"
    ).is_file()


def test_exhausted_dynamic_sampling_is_a_one_line_error(tmp_path):
    # An untrained model almost never answers correctly: every group has equal rewards.
    out = _run(
        tmp_path,
        "dapo.max_num_steps=1",
        "sft_warmup.num_steps=0",
        "dapo.dynamic_sampling.max_gen_batches=2",
        "validation.val_at_start=false",
        "dapo.dynamic_sampling.batch_multiplier=1.0",
    )
    assert out.returncode == 1
    assert "dapo.dynamic_sampling.max_gen_batches=2" in out.stderr
    assert "max_gen_batches=2 full rounds of 32" in out.stderr
    assert "Traceback" not in out.stderr
