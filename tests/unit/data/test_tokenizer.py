"""The character tokenizer (data/tokenizer.py): round trip, saved and reloaded offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_megatron.config.model_arch import PRESETS
from dapo_megatron.data.tokenizer import (
    CHARACTERS,
    build_char_tokenizer,
    load_tokenizer,
    save_char_tokenizer,
)

# ----------------------------------------------------------------------------- tokenizer


def test_char_tokenizer_round_trip() -> None:
    tokenizer = build_char_tokenizer()
    assert len(tokenizer) <= PRESETS["tiny-qwen2"].vocab_size
    assert tokenizer.eos_token == "<eos>" and tokenizer.pad_token == "<pad>"
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3
    text = "12+3*4-5=7\n 0 9"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == len(text) + 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(tokenizer.encode(CHARACTERS, add_special_tokens=False)) == CHARACTERS
    # Special tokens in text are single tokens; unknown characters map to <unk>.
    assert tokenizer.encode("1<eos>", add_special_tokens=False) == [
        tokenizer.convert_tokens_to_ids("1"),
        tokenizer.eos_token_id,
    ]
    assert tokenizer.encode("x", add_special_tokens=False) == [tokenizer.unk_token_id]


def test_char_tokenizer_saves_and_reloads_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = build_char_tokenizer()
    save_char_tokenizer(tokenizer, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "9*9=81\n"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"], skip_special_tokens=True) == text
    assert (reloaded.eos_token_id, reloaded.pad_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )


# ---------------------------------------------------------------------------------------
# The remainder task's tokenizer needs (issue 31).


def test_reloaded_char_tokenizer_keeps_spaces_and_newlines(tmp_path) -> None:
    # A model directory's config.json (model_type qwen2) used to make AutoTokenizer load
    # Qwen2Tokenizer, whose byte-level pre-tokenizer dropped " " and "\n".
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    built = build_char_tokenizer()
    save_char_tokenizer(built, tmp_path)
    loaded = load_tokenizer(tmp_path, key="policy.model_name_or_path")
    text = "38 29 20\n2"
    ids = loaded.encode(text, add_special_tokens=False)
    assert ids == built.encode(text, add_special_tokens=False)
    assert loaded.decode(ids, skip_special_tokens=True) == text
    assert loaded.encode("3+5=") == built.encode("3+5=")  # the arithmetic task's ids unchanged
