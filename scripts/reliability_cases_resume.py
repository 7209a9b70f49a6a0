"""Issue 30 cases 2, 3, 6, 7, 8 and 10 for scripts/reliability_cases.py: run and checkpoint
directories, weights against config.json, changed data, a torn metrics line.

Each case builds its input for real: a second live process holding its locks with a save
in progress, a finished run's outputs, checkpoints with real markers (sizes and SHA-256) and
a torch.save'd controller state, a flipped byte, an edited config.json, a changed file.
A case is ``(title, args)``: dapo-train arguments, or a whole command starting with the
Python interpreter.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

_HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from dapo_megatron.storage.run_dir import acquire_run_dir

    run_dir, checkpoints = Path(sys.argv[1]), Path(sys.argv[2])
    lock = acquire_run_dir(run_dir, resume="auto", checkpoint_dir=checkpoints)
    (checkpoints / "step_000015.tmp-0123abcd").mkdir()
    print("saving", flush=True)
    sys.stdin.read()
    """
)

_TORN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from dapo_megatron.logging.jsonl import JsonlWriter

    path = Path(sys.argv[1])
    path.write_text('{"step":3,"time":1.0,"loss":0.5}\\n{"step":4,"time":2.0,"loss":0.4,"val/ac')
    writer = JsonlWriter(path, resume=True)  # the run resumes from step 4's checkpoint
    writer.write(5, {"loss": 0.3}, wall_time=3.0)
    writer.close()
    """
)


def _checkpoint(run_dir: Path, step: int, train: Path | None) -> Path:
    """A checkpoint laid out as megatron/checkpoint.py writes it (shard, controller state,
    marker with sizes and SHA-256), and the metrics of the run that wrote it."""
    import torch

    from dapo_megatron.data.fingerprint import DATA_STATE_KEY, file_fingerprint
    from dapo_megatron.storage.checkpoint_dirs import write_marker

    path = run_dir / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(os.urandom(4096))
    data = file_fingerprint(train) if train else None
    torch.save({"step": step, DATA_STATE_KEY: data}, path / "extra_state.pt")
    write_marker(path, {"format_version": 1, "step": step})
    (run_dir / "metrics.jsonl").write_text(f'{{"step":{step}}}\n')
    return path


def resume_cases(tmp: Path, model: Path, file_data: list[str]) -> list[tuple[str, list[str]]]:
    """The cases, their inputs built under ``tmp`` (``model``: the tiny model)."""
    tmp = tmp / "issue30"
    tmp.mkdir()
    # 2: a live run saving into a checkpoint directory a second run names.
    shared = tmp / "shared-checkpoints"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp / "run-a"), str(shared)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    atexit.register(holder.kill)
    assert holder.stdout is not None and holder.stdout.readline() == "saving\n"
    # 3: a finished run with checkpointing.enabled=false (metrics rows and its export).
    used = tmp / "no-checkpoints"
    (used / "hf" / "step_000003").mkdir(parents=True)
    (used / "metrics.jsonl").write_text('{"step":1}\n{"step":2}\n{"step":3}\n')
    # 6: config.json's hidden_size disagrees with the weights.
    wide = shutil.copytree(model, tmp / "wide")
    hf = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**hf, "hidden_size": 96}))
    # 7: every checkpoint damaged; a finished run.
    damaged = tmp / "damaged"
    shard = _checkpoint(damaged, 10, None) / "__0_0.distcp"
    shard.write_bytes(bytes([shard.read_bytes()[0] ^ 0xFF]) + shard.read_bytes()[1:])
    finished = tmp / "finished"
    _checkpoint(finished, 150, None)
    (finished / "hf" / "step_000150").mkdir(parents=True)
    # 8: the data file changed since the checkpoint (same row count).
    train = tmp / "train.jsonl"
    train.write_text(
        "".join(f'{{"question": "{i}+1", "answer": "#### {i + 1}"}}\n' for i in range(8))
    )
    changed_run = tmp / "changed-data"
    _checkpoint(changed_run, 2, train)
    train.write_text(train.read_text().replace("#### 8", "#### 9"))
    # 1: dapo-export of a checkpoint with one flipped byte in a shard (its marker intact).
    from dapo_megatron.storage.checkpoint_dirs import write_marker

    flipped = _checkpoint(tmp / "flipped", 4, None)
    write_marker(flipped, {"format_version": 1, "step": 4, "layout": {"tp": 1, "pp": 1}})
    data = bytearray((flipped / "__0_0.distcp").read_bytes())
    data[100] ^= 1
    (flipped / "__0_0.distcp").write_bytes(bytes(data))
    export = "import sys; from dapo_megatron.cli import export_main; sys.exit(export_main())"
    return [
        (
            "1: dapo-export of a checkpoint with a flipped byte in a shard",
            [sys.executable, "-c", export, "--checkpoint", str(flipped), "--out", str(tmp / "hf")],
        ),
        (
            "2: a second run sharing checkpointing.checkpoint_dir with a live run",
            [f"run.output_dir={tmp / 'run-b'}", f"checkpointing.checkpoint_dir={shared}"],
        ),
        (
            "3: the same run dir again with checkpointing.enabled=false",
            [
                f"run.output_dir={used}",
                "checkpointing.enabled=false",
            ],
        ),  # fmt: skip
        ("6: config.json hidden_size 96, weights 64", [f"policy.model_name_or_path={wide}"]),
        ("7: no checkpoint verifies (--dry-run)", [f"run.output_dir={damaged}", "--dry-run"]),
        ("7: a finished run re-run", [f"run.output_dir={finished}"]),
        (
            "8: resume with a changed data file, same rows",
            [
                *file_data,
                f"data.train_path={train}",
                f"run.output_dir={changed_run}",
                "--dry-run",
            ],
        ),  # fmt: skip
        ("10: --config names a directory", ["--config", "recipes", "--dry-run"]),
        (
            "10: torn last line of metrics.jsonl on resume",
            [
                sys.executable,
                "-c",
                _TORN,
                str(tmp / "metrics.jsonl"),
            ],
        ),  # fmt: skip
    ]
