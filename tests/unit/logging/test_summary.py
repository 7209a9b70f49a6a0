"""The closing summary of a run (logging/summary.py)."""

from __future__ import annotations

import json

from dapo_megatron.logging import keys


def test_summary_names_steps_time_validation_and_paths(tmp_path):
    from dapo_megatron.logging import format_summary

    rows = [
        {"step": 0, keys.VAL_ACC: 0.0725, keys.VAL_ACC_STDERR: 0.0131},
        {"step": 1, keys.REWARD_ACC: 0.2},
        {"step": 2, keys.REWARD_ACC: 0.5, keys.VAL_ACC: 0.96, keys.VAL_ACC_STDERR: 0.00981},
        {"step": 3, keys.REWARD_ACC: 0.6},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = format_summary(
        tmp_path,
        total_steps=3,
        wall_s=754.4,
        checkpoint=tmp_path / "checkpoints" / "step_000003",
        export=tmp_path / "hf" / "step_000003",
        plots=tmp_path / "plots",
        worker_logs=tmp_path / "logs" / "workers",
    )
    assert text.splitlines() == [
        "dapo-train: finished 3/3 steps in 0:12:34",
        "  validation accuracy  0.96 ± 0.0098 at step 2 (0.0725 ± 0.013 before training)",
        f"  last checkpoint      {tmp_path}/checkpoints/step_000003",
        f"  Hugging Face export  {tmp_path}/hf/step_000003",
        f"  metrics and plots    {tmp_path}/metrics.jsonl, {tmp_path}/plots",
        f"  worker logs          {tmp_path}/logs/workers",
    ]
    assert "{" not in text  # no Python dict


def test_summary_without_validation_checkpoint_or_export(tmp_path):
    from dapo_megatron.logging import format_summary

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, keys.LOSS: 0.1}) + "\n")
    text = format_summary(tmp_path, total_steps=1, wall_s=5, checkpoint=None, export=None)
    assert text.splitlines() == [
        "dapo-train: finished 1/1 steps in 0:00:05",
        "  last checkpoint      none saved",
        f"  metrics              {tmp_path}/metrics.jsonl",
    ]
