"""The MetricsLogger (logging/metrics_logger.py): SFT steps and plots on close."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from dapo_megatron.logging import keys, read_metrics
from unit.logging.loggers import make_logger

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_sft_steps_have_their_own_file_and_plot(tmp_path):
    with make_logger(tmp_path, plots=True) as logger:
        for step in range(1, 4):
            logger.log_sft(step, {keys.SFT_NLL: 3.0 / step})
        logger.log(0, {keys.VAL_ACC: 0.1})
    sft = read_metrics(tmp_path / "sft_metrics.jsonl")
    assert [r["step"] for r in sft] == [1, 2, 3] and sft[0][keys.SFT_NLL] == 3.0
    assert keys.SFT_NLL not in read_metrics(tmp_path / "metrics.jsonl")[0]
    assert "sft_warmup.png" in os.listdir(tmp_path / "plots")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_logger_close_writes_plots_when_enabled(tmp_path):
    with make_logger(tmp_path, plots=True) as logger:
        for step in (1, 2):
            logger.log(step, {keys.DS_KEEP_RATE: 0.5 * step})
    assert png_size(tmp_path / "plots" / "dynamic_sampling.png")[0] > 0
    assert sorted(os.listdir(tmp_path / "plots")) == ["dynamic_sampling.png"]
