"""A character-level Hugging Face tokenizer for the arithmetic task, built in code.

The tiny CPU recipe cannot download a tokenizer, and a real one (150K tokens) would dwarf an
~80K-parameter model. This one has one token per character of the task (digits, ``+ - * =``,
space, newline) plus ``<pad> <bos> <eos> <unk>``: 20 tokens, within the tiny-qwen2 preset's
vocabulary of 64. It is a `tokenizers` WordLevel model behind a per-character Split, wrapped
in PreTrainedTokenizerFast, so it saves with save_pretrained and reloads with
AutoTokenizer.from_pretrained fully offline.

Encoding plain text prepends ``<bos>`` (add_special_tokens=True), as Llama-style tokenizers
do: every sequence starts at the same token, a fixed position for attention to rest on.

`load_tokenizer` is how a run loads its tokenizer (any local directory, not only this one):
it fails with a ConfigError naming the key and the path when the directory is missing,
holds no vocabulary, does not load, or does not round-trip a test string. Without it a
missing path reads as a bad hub repo id, and a directory without vocabulary files loads as
an EMPTY tokenizer that only fails much later ("prompt 0 is empty").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.schema_policy import PolicyConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

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


VOCABULARY_FILES = (
    "tokenizer.json",  # tokenizers (fast) serialisation: Qwen, Llama 3, this char tokenizer
    "tokenizer.model",  # sentencepiece: Llama 2, Mistral
    "spiece.model",  # sentencepiece under the T5 name
    "vocab.json",  # byte-level BPE with merges.txt: GPT-2 style
    "vocab.txt",  # WordPiece
    "tokenizer.tiktoken",  # tiktoken
)
"""Files of which a tokenizer directory holds at least one: the vocabulary itself (a
tokenizer_config.json alone describes a tokenizer but has no tokens)."""

ROUND_TRIP_TEXT = "12+3=15"
"""Test string of the round trip: the arithmetic task's alphabet, so the char tokenizer (the
smallest vocabulary the package meets) has every character of it."""


def load_tokenizer(path: str | Path, *, key: str) -> PreTrainedTokenizerBase:
    """AutoTokenizer of a local directory, checked to work, or a one-line ConfigError.

    Args:
        path: the tokenizer directory (policy.tokenizer_name_or_path, or the model directory).
        key: the config key that named `path`, for the messages.

    Raises:
        ConfigError: `path` does not exist, is not a directory, holds none of
            VOCABULARY_FILES, fails to load, or does not round-trip ROUND_TRIP_TEXT.
    """
    path = Path(path)
    _check_tokenizer_dir(path, key)
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # transformers 5's AutoTokenizer picks the class from the MODEL's config.json when the
    # directory holds one: Qwen2Tokenizer for the tiny model, whose byte-level
    # pre-tokenizer replaces ours and silently drops the char tokenizer's space and newline
    # ("38 29\n2" -> "38292"). A directory that names PreTrainedTokenizerFast (what
    # save_char_tokenizer writes) is loaded as exactly that, with its own tokenizer.json.
    loader = (
        PreTrainedTokenizerFast
        if _configured_class(path) == "PreTrainedTokenizerFast"
        else AutoTokenizer
    )
    try:
        # local_files_only: a directory is never a hub id, so never ask the network.
        tokenizer = loader.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # loaders raise OSError, ValueError, KeyError, json...
        raise ConfigError(
            f"{key}: cannot load a tokenizer from {path}: {_first_line(e)}; check its files "
            "(tokenizer_config.json, tokenizer.json...) or point the key at another directory"
        ) from None
    _check_round_trip(tokenizer, path, key)
    return tokenizer


def _configured_class(path: Path) -> str | None:
    """tokenizer_config.json's tokenizer_class, or None (no file, unreadable, not named)."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # AutoTokenizer then reports what is wrong with the directory
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    return name if isinstance(name, str) else None


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0].rstrip(".") if text else type(error).__name__


def _check_tokenizer_dir(path: Path, key: str) -> None:
    """The cheap checks, before transformers is imported."""
    if not path.exists():
        raise ConfigError(
            f"{key}: {path} does not exist; point it at a local tokenizer directory (the hub "
            "is not used)"
        )
    if not path.is_dir():
        raise ConfigError(f"{key}: {path} is not a directory; point it at a tokenizer directory")
    if not any((path / name).is_file() for name in VOCABULARY_FILES):
        raise ConfigError(
            f"{key}: {path} holds no tokenizer files (none of {', '.join(VOCABULARY_FILES)}); "
            "copy the model's tokenizer files there or set policy.tokenizer_name_or_path to "
            "a directory that has them"
        )


def _check_round_trip(tokenizer: PreTrainedTokenizerBase, path: Path, key: str) -> None:
    """Encode then decode ROUND_TRIP_TEXT: an empty or mismatched vocabulary fails here
    rather than as empty prompts in the middle of a run."""
    try:
        ids = tokenizer.encode(ROUND_TRIP_TEXT, add_special_tokens=False)
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
    except Exception as e:  # a broken tokenizer can raise anything here
        raise ConfigError(
            f"{key}: the tokenizer at {path} fails on the test string {ROUND_TRIP_TEXT!r}: "
            f"{_first_line(e)}; its files are damaged or inconsistent"
        ) from None
    # Sentencepiece tokenizers may add or drop a leading space: compare the text only.
    text = decoded if isinstance(decoded, str) else "".join(decoded)
    if not ids or text.strip() != ROUND_TRIP_TEXT:
        raise ConfigError(
            f"{key}: the tokenizer at {path} does not round-trip the test string "
            f"{ROUND_TRIP_TEXT!r} (encoded to {len(ids)} tokens, decoded as {text!r}); its "
            "vocabulary is empty or its files are inconsistent: copy them again"
        )


def policy_tokenizer_source(policy: PolicyConfig) -> tuple[str, str]:
    """(path, key) of a run's tokenizer: policy.tokenizer_name_or_path, or the model
    directory when it is null; the key is the one that named the path, for messages."""
    if policy.tokenizer_name_or_path:
        return policy.tokenizer_name_or_path, "policy.tokenizer_name_or_path"
    return policy.model_name_or_path, "policy.model_name_or_path"


def load_policy_tokenizer(policy: PolicyConfig) -> PreTrainedTokenizerBase:
    """The run's tokenizer (see policy_tokenizer_source), checked by load_tokenizer."""
    path, key = policy_tokenizer_source(policy)
    return load_tokenizer(path, key=key)
