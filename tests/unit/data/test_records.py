"""Prompt records (data/records.py)."""

from __future__ import annotations

from dapo_megatron.data.datasets import gsm8k_final_answer


def test_gsm8k_final_answer() -> None:
    assert gsm8k_final_answer("a #### b #### -3") == "-3"
    assert gsm8k_final_answer("#### 12,345,678") == "12345678"
    assert gsm8k_final_answer("no marker 5") is None
    assert gsm8k_final_answer("####   ") is None
