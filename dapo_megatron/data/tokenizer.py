"""A character-level Hugging Face tokenizer for the arithmetic task, built in code.

The tiny CPU recipe cannot download a tokenizer, and a real one (150K tokens) would dwarf an
~80K-parameter model. This one has one token per character of the task (digits, ``+ - * =``,
space, newline) plus ``<pad> <bos> <eos> <unk>``: 20 tokens, within the tiny-qwen2 preset's
vocabulary of 64. It is a `tokenizers` WordLevel model behind a per-character Split, wrapped
in PreTrainedTokenizerFast, so it saves with save_pretrained and reloads with
AutoTokenizer.from_pretrained fully offline.

Encoding plain text prepends ``<bos>`` (add_special_tokens=True), as Llama-style tokenizers
do: every sequence starts at the same token, a fixed position for attention to rest on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
"""Special tokens, with ids 0..3 in this order."""
CHARACTERS = "0123456789+-*= \n"
"""Ordinary tokens, one per character, with ids 4.. in this order."""
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARACTERS)


def build_char_tokenizer(*, model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """The char-level tokenizer: ids 0..3 are <pad> <bos> <eos> <unk>, then CHARACTERS.

    Characters outside CHARACTERS encode to <unk>. Decoding concatenates characters with no
    separator. It has no chat template (set one on it if you need data.apply_chat_template).

    Args:
        model_max_length: longest sequence, stored in tokenizer_config.json; None leaves
            transformers' "unlimited" sentinel.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character is its own word; [\s\S] rather than "." so newlines are tokens too.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Without a decoder, tokenizers joins tokens with spaces ("3 + 5"); Fuse concatenates.
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    # Registered as special so that "<eos>" in text is one token and decode can skip them.
    core.add_special_tokens(list(SPECIAL_TOKENS))
    kwargs = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK, **kwargs
    )


def save_char_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """save_pretrained, with tokenizer_config.json naming PreTrainedTokenizerFast.

    transformers 5 writes its own class name ("TokenizersBackend"), which transformers 4
    cannot load; "PreTrainedTokenizerFast" loads in both, so a generation engine pinned to an
    older transformers (vLLM) reads the same files.
    """
    tokenizer.save_pretrained(str(out_dir))
    config_path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
