"""Issue 30 cases 7 and 8: what pre-flight finds in the run's checkpoints before Ray starts
(planning/resume_check.py).

Every input is real: a tiny model, checkpoint directories with a real ``complete.json``
(sizes and SHA-256 of their files) and a ``torch.save``d controller state, data files
whose content is changed; ``dapo-train`` runs as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dapo_megatron.config.loader import load_config
from dapo_megatron.config.schema import DapoMegatronConfig
from dapo_megatron.data.fingerprint import DATA_STATE_KEY, file_fingerprint
from dapo_megatron.data.sampler import PromptSampler
from dapo_megatron.data.tiny_model import create_tiny_model
from dapo_megatron.planning.resume_check import finished_run, resume_point
from dapo_megatron.storage.checkpoint_dirs import write_marker

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "recipes" / "dapo-tiny-cpu.yaml"
ROW = '{{"question": "{q}+1", "answer": "#### {a}"}}\n'


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def _train_file(path: Path, offset: int = 0) -> Path:
    path.write_text("".join(ROW.format(q=i, a=i + 1 + offset) for i in range(8)))
    return path


def _args(model: Path, run_dir: Path, train: Path, *extra: str) -> list[str]:
    return [
        f"policy.model_name_or_path={model}",
        "data.format=gsm8k",
        "reward.verifier=gsm8k",
        f"data.train_path={train}",
        f"run.output_dir={run_dir}",
        "dapo.max_num_steps=4",
        *extra,
    ]


def _config(*args: str) -> DapoMegatronConfig:
    return load_config(RECIPE, list(args)).config


def _checkpoint(run_dir: Path, step: int, train: Path | None) -> Path:
    """A checkpoint as megatron/checkpoint.py lays it out: shards, the controller state,
    the marker with every file's size and SHA-256."""
    path = run_dir / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(os.urandom(4096))
    state = {"step": step, DATA_STATE_KEY: file_fingerprint(train) if train else None}
    torch.save(state, path / "extra_state.pt")
    write_marker(path, {"format_version": 1, "step": step})
    (run_dir / "metrics.jsonl").write_text(f'{{"step":{step}}}\n')
    return path


def _dapo_train(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "dapo_megatron.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return out, time.perf_counter() - start


# ------------------------------------------------ case 7: nothing verifies, or finished


def test_checkpoints_of_which_none_verifies_are_refused_by_the_dry_run(
    tiny_model: Path, tmp_path: Path
) -> None:
    run_dir, train = tmp_path / "run", _train_file(tmp_path / "train.jsonl")
    for step in (2, 4):
        shard = _checkpoint(run_dir, step, train) / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[100] ^= 0xFF  # one flipped byte: same size, other checksum
        shard.write_bytes(bytes(data))
    out, seconds = _dapo_train(*_args(tiny_model, run_dir, train), "--dry-run")
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = out.stderr.splitlines()
    assert line.startswith(
        f"error: checkpointing.checkpoint_dir: no checkpoint in {run_dir / 'checkpoints'} "
        f"passes verification (step_000004: __0_0.distcp: sha256 "
    )
    assert line.endswith(
        "restore their files, or move or delete these checkpoints to start the run afresh"
    )
    # The real run says the same before Ray starts.
    real, seconds = _dapo_train(*_args(tiny_model, run_dir, train))
    assert real.returncode == 2 and real.stderr.splitlines() == [line]
    assert seconds < 20 and "ray" not in real.stdout.lower()


def test_a_finished_run_exits_0_without_starting_anything(tiny_model: Path, tmp_path: Path) -> None:
    run_dir, train = tmp_path / "run", _train_file(tmp_path / "train.jsonl")
    last = _checkpoint(run_dir, 4, train)
    (run_dir / "hf" / "step_000004").mkdir(parents=True)  # the recipe's final export
    before = sorted(p.name for p in run_dir.iterdir())
    out, seconds = _dapo_train(*_args(tiny_model, run_dir, train))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == (
        f"dapo-train: the run in {run_dir} is already finished: {last} is step 4 of "
        f"dapo.max_num_steps = 4; nothing to do (raise dapo.max_num_steps to train further, "
        f"or set run.output_dir to a new directory for a new run)"
    )
    assert seconds < 20 and "[ray]" not in out.stdout
    assert sorted(p.name for p in run_dir.iterdir() if p.name != ".lock") == before
    # An export still to write is not "finished": the run starts to write it.
    shutil.rmtree(run_dir / "hf")
    config = _config(*_args(tiny_model, run_dir, train))
    point = resume_point(config, run_dir, run_dir / "checkpoints")
    assert point.path == last and point.problems == []
    assert finished_run(config, run_dir, point) is None


# ---------------------------------------------------------- case 8: the data changed


def test_a_resume_on_changed_data_is_refused_before_anything_starts(
    tiny_model: Path, tmp_path: Path
) -> None:
    run_dir, train = tmp_path / "run", _train_file(tmp_path / "train.jsonl")
    ckpt = _checkpoint(run_dir, 2, train)
    recorded = file_fingerprint(train)
    changed = _train_file(tmp_path / "changed.jsonl", offset=1)  # same 8 rows, other answers
    out, _ = _dapo_train(*_args(tiny_model, run_dir, changed), "--dry-run")
    assert out.returncode == 2, out.stderr[-2000:]
    now = file_fingerprint(changed)
    assert out.stderr.splitlines() == [
        f"error: data.train_path: {changed} is not the data {ckpt} was trained on (sha256 "
        f"{now['sha256'][:12]}, {now['bytes']} bytes now; {recorded['sha256'][:12]}, "
        f"{recorded['bytes']} bytes recorded from {train}): resume with that file, set "
        f"run.output_dir to a new directory for a new run, or set "
        f"checkpointing.allow_data_change=true to continue on the changed data on purpose"
    ]
    # On purpose: accepted; the same content under another path is the same data.
    allowed = _config(*_args(tiny_model, run_dir, changed), "checkpointing.allow_data_change=true")
    assert resume_point(allowed, run_dir, run_dir / "checkpoints").problems == []
    copy = shutil.copy(train, tmp_path / "copy.jsonl")
    same = _config(*_args(tiny_model, run_dir, Path(copy)))
    assert resume_point(same, run_dir, run_dir / "checkpoints").problems == []


def test_a_changed_prompt_count_needs_allow_data_change_and_starts_a_new_epoch() -> None:
    saved = PromptSampler(8, seed=3, shuffle=True)
    saved.next_indices(5)
    state = saved.state_dict()
    with pytest.raises(ValueError, match="set checkpointing.allow_data_change=true"):
        PromptSampler(9, seed=3, shuffle=True).load_state_dict(state)
    resized = PromptSampler(9, seed=3, shuffle=True)
    resized.load_state_dict(state, allow_resize=True)
    assert (resized.epoch, resized.position) == (1, 0)
    assert sorted(resized.next_indices(9)) == list(range(9))
