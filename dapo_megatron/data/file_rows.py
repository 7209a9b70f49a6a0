"""The rows of a prompt file, read at a bounded cost: jsonl lines and parquet rows.

data/datasets.py turns these rows into records. What this module guards against is a file
that would cost minutes or crash the tokenizer: with a max_prompt_length, a jsonl line longer
than `max_row_bytes(max_prompt_length)` is rejected by its byte length before it is decoded,
parsed or tokenised, and a parquet prompt is measured before it is tokenised. Every error is a
ConfigError naming the key, the file and the line (or row).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.data.records import Message

SUPPORTED_EXTENSIONS = (".jsonl", ".parquet")

# The byte budget of one row. A token stands for a few bytes of text (about 4 for English
# text; a UTF-8 character is at most 4 bytes), and JSON escaping at most sextuples that
# (\uXXXX per non-ASCII character, 12 bytes for a surrogate pair). 64 bytes per token is
# therefore far above any real prompt of max_prompt_length tokens: a longer row is a prompt
# the run would skip as too long anyway, or a corrupt file, and measuring its bytes costs
# nothing while tokenising it can take minutes or crash the tokenizer.
MAX_BYTES_PER_TOKEN = 64
ROW_SLACK_BYTES = 64 * 1024
"""Room for the row's other fields: the answer, a worked solution (gsm8k), metadata."""


def max_row_bytes(max_prompt_length: int) -> int:
    """The longest row (jsonl line, or parquet prompt) accepted for data.max_prompt_length."""
    return max_prompt_length * MAX_BYTES_PER_TOKEN + ROW_SLACK_BYTES


def too_long_error(where: str, size: str, max_prompt_length: int) -> ConfigError:
    """The error of a row over max_row_bytes; `size` ("" or "prompt of N bytes, ") says
    what was measured when it is not the whole line."""
    limit = max_row_bytes(max_prompt_length)
    return ConfigError(
        f"{where}: {size}longer than {limit} bytes, far more than a prompt of "
        f"data.max_prompt_length = {max_prompt_length} tokens can take ({MAX_BYTES_PER_TOKEN} "
        f"bytes per token + {ROW_SLACK_BYTES // 1024} KiB for the other fields), rejected "
        "before tokenising; remove the row (or raise data.max_prompt_length)"
    )


RawRow = bytes | dict[str, Any] | None
"""A row as a reader yields it: the bytes of a jsonl line (still to decode and parse), a
parquet row, or None for a jsonl line over the byte limit (never read into memory)."""


def _open_rb(path: Path, what: str) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as e:
        raise ConfigError(
            f"{what}: {path} cannot be read ({e.strerror}); check its permissions"
        ) from None


def _jsonl_lines(f: IO[bytes], max_bytes: int | None) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) per line, None instead of the bytes of a line over max_bytes.

    readline(max_bytes + 1) never holds more than the limit in memory. The rest of a long
    line is skipped only when the next line is asked for, so a loader that stops at the
    error never reads it.
    """
    limit = -1 if max_bytes is None else max_bytes + 1
    number = 0
    while raw := f.readline(limit):
        number += 1
        if max_bytes is None or raw.endswith(b"\n") or len(raw) <= max_bytes:
            yield number, raw
            continue
        yield number, None
        while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
            pass


def jsonl_rows(
    path: Path, what: str, max_prompt_length: int | None
) -> Iterator[tuple[str, RawRow]]:
    """(location, line bytes) per line; the location names the key, the file and the line."""
    max_bytes = None if max_prompt_length is None else max_row_bytes(max_prompt_length)
    with _open_rb(path, what) as f:
        for number, raw in _jsonl_lines(f, max_bytes):
            yield f"{what}: {path} line {number}", raw


def parse_jsonl_line(raw: bytes, where: str) -> dict[str, Any] | None:
    """The JSON object of one line; None for a blank line (a trailing newline is not a row)."""
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{where}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); a "
            ".jsonl file must be UTF-8: re-encode it (e.g. iconv -t UTF-8) or fix the line"
        ) from None
    try:
        # A byte-order mark (some Windows editors write one) is not part of the JSON.
        row = json.loads(text.removeprefix("\ufeff").rstrip("\r\n"))
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{where}: invalid JSON ({e.msg} at column {e.colno}); a .jsonl file holds one "
            "JSON object per line"
        ) from None
    if not isinstance(row, dict):
        raise ConfigError(
            f"{where}: a {type(row).__name__}, not a JSON object; each line must be one "
            "object with the prompt and answer fields"
        )
    return row


def parquet_rows(path: Path, what: str) -> Iterator[tuple[str, RawRow]]:
    """(location, row) per row; rows are numbered from 1 like jsonl lines."""
    import pyarrow.parquet as pq  # imported here: only parquet users pay for it

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as e:  # ArrowInvalid is a ValueError, ArrowIOError an OSError
        text = str(e).strip()
        first_line = text.splitlines()[0].rstrip(".") if text else type(e).__name__
        raise ConfigError(
            f"{what}: {path} is not a readable parquet file ({first_line}); write it again "
            "(e.g. pandas.DataFrame.to_parquet) or convert it to .jsonl"
        ) from None
    for number, row in enumerate(table.to_pylist(), start=1):
        yield f"{what}: {path} row {number}", row


def check_path(path: Path, what: str) -> None:
    if not path.exists():
        raise ConfigError(
            f"{what}: {path} does not exist; point it at a local .jsonl or .parquet file or "
            "name a hub dataset as hf://Org/Name (docs/guides/data.md)"
        )
    if path.is_dir():
        raise ConfigError(f"{what}: {path} is a directory; point it at a .jsonl or .parquet file")
    if path.suffix.lower() not in SUPPORTED_EXTENSIONS:
        raise ConfigError(
            f"{what}: {path} has the unknown extension {path.suffix!r}; supported: "
            f"{', '.join(SUPPORTED_EXTENSIONS)}. Convert the file (e.g. with pandas) or rename it"
        )


def prompt_bytes(prompt: str | list[Message], limit: int) -> int:
    """UTF-8 size of a prompt's text; 0 when it is certainly within `limit` (the common case:
    a character is at most 4 bytes, so short prompts are never encoded just to measure)."""
    texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
    if sum(len(t) for t in texts) * 4 <= limit:
        return 0
    return sum(len(t.encode("utf-8", errors="surrogatepass")) for t in texts)
