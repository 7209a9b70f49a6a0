"""Prompt datasets: local jsonl/parquet files in the layouts DAPO recipes use, and tokenisation.

Layouts (`data.format`):

- ``dapo_math``: DAPO-Math-17k as distributed for verl. ``prompt`` is a list of chat messages
  ``[{"role": "user", "content": ...}]`` and ``reward_model`` is
  ``{"style": "rule", "ground_truth": ...}``; the other columns are kept as metadata.
- ``aime``: AIME 2024 in the dapo_math layout, or flat rows ``{"problem" | "question": str,
  "answer": str | int}``.
- ``gsm8k``: ``{"question": str, "answer": "<worked solution> #### 42"}``; the ground truth is
  the text after the last ``####``.
- ``arithmetic``: no file; the synthetic task of data/arithmetic.py (see `build_datasets`).
- ``remainder``: no file; the long-response task of data/remainder.py.

`data.prompt_key` / `data.answer_key` replace the layout's field names; dotted paths such as
``reward_model.ground_truth`` reach into nested mappings.

Policy on bad rows: a row whose prompt is empty or whose answer is missing is skipped and
COUNTED (`PromptDataset.skipped`), because public datasets contain a few of those and a run
should not die on them. Anything that suggests the wrong file or the wrong layout (a missing
file, an unknown extension, a field that no row has, a value of the wrong type, invalid JSON
or UTF-8, a row far longer than any prompt of data.max_prompt_length tokens) is a
ConfigError that names the key, the file, the line (or row) and the fix.

Cost per row is bounded: with a max_prompt_length, a jsonl line longer than
`max_row_bytes(max_prompt_length)` is rejected by its byte length before it is decoded,
parsed or tokenised (a 50 MB single-line prompt used to take minutes in the tokenizer, or
crash it); data/file_rows.py reads the rows. `check_prompt_file` runs the same reading and
reports every bad line (up to a cap) instead of the first: the pre-flight check of
dapo_megatron/planning/preflight.py uses it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.config.schema_data import DataConfig
from dapo_megatron.data.arithmetic import make_train_val_split
from dapo_megatron.data.file_rows import (
    RawRow,
    check_path,
    jsonl_rows,
    max_row_bytes,
    parquet_rows,
    parse_jsonl_line,
    prompt_bytes,
    too_long_error,
)
from dapo_megatron.data.hub_datasets import is_hf_uri, resolve_data_path
from dapo_megatron.data.prompt_template import apply_prompt_template
from dapo_megatron.data.records import Message, PromptRecord, gsm8k_final_answer
from dapo_megatron.data.remainder import RemainderTask
from dapo_megatron.data.remainder import make_train_val_split as remainder_split
from dapo_megatron.data.val_split import split_validation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FILE_FORMATS = ("dapo_math", "aime", "gsm8k")
"""Formats read from a file (arithmetic and remainder are generated)."""
GENERATED_FORMATS = ("arithmetic", "remainder")
"""Formats generated in memory from the config and run.seed (no file, no fingerprint)."""

MAX_CHECK_ERRORS = 10
"""check_prompt_file stops after this many bad rows of one file (the rest are alike)."""

# Reasons under which skipped rows are counted (keys of PromptDataset.skipped).
SKIP_EMPTY_PROMPT = "empty prompt"
SKIP_MISSING_ANSWER = "missing answer"
SKIP_UNPARSEABLE_ANSWER = "answer without a final answer after ####"


@dataclass
class PromptDataset:
    """The records of one file (or of the synthetic task) and what was skipped on the way."""

    records: list[PromptRecord]
    """The usable problems, in file order."""
    source: str
    """Where they came from (a path, or a description of the generated task)."""
    num_rows: int
    """Rows read, usable or not."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Rows skipped, by reason (e.g. ``{"empty prompt": 2}``)."""

    @property
    def num_skipped(self) -> int:
        """Rows skipped for any reason."""
        return sum(self.skipped.values())

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> PromptRecord:
        return self.records[index]

    def describe(self) -> str:
        """One line for logs: counts of kept and skipped rows."""
        line = f"{self.source}: {len(self.records)} of {self.num_rows} rows"
        if self.skipped:
            reasons = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            line += f" (skipped {reasons})"
        return line


@dataclass(frozen=True)
class _Layout:
    """Where a format keeps its prompt and answer; the first candidate a row has wins."""

    prompt_keys: tuple[str, ...]
    answer_keys: tuple[str, ...]
    gsm8k_answer: bool = False
    """The answer is a worked solution ending in ``#### <final answer>``."""


_LAYOUTS = {
    "dapo_math": _Layout(("prompt",), ("reward_model.ground_truth",)),
    "aime": _Layout(("prompt", "problem", "question"), ("reward_model.ground_truth", "answer")),
    "gsm8k": _Layout(("question",), ("answer",), gsm8k_answer=True),
}

_MISSING = object()


def _lookup(row: dict[str, Any], key: str, where: str) -> Any:
    """``row[key]``, following dots into nested mappings; _MISSING when absent.

    A literal key wins over the dotted path, so flattened columns ("reward_model.ground_truth"
    written by pandas.json_normalize) work too. A null on the way reads as null (a missing
    value, skipped), while a non-mapping on the way means the layout is not what we think.
    """
    if key in row:
        return row[key]
    value: Any = row
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if value is None:
            return None
        if not isinstance(value, dict):
            parent = ".".join(parts[:depth])
            raise ConfigError(
                f"{where}: field {parent!r} is a {type(value).__name__}, not a mapping, so "
                f"{key!r} cannot be read; set data.prompt_key/data.answer_key to the right field"
            )
        if part not in value:
            return _MISSING
        value = value[part]
    return value


def _prompt_value(value: Any, where: str, key: str) -> str | list[Message] | None:
    """A validated prompt, or None when it is empty (the row is skipped)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, list):
        messages: list[Message] = []
        for i, message in enumerate(value):
            # A null content (parquet writes missing text as null) is an empty message.
            if isinstance(message, dict) and message.get("content", "") is None:
                message = {**message, "content": ""}
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            ):
                raise ConfigError(
                    f"{where}: field {key!r} message {i} is {message!r}; expected "
                    '{"role": str, "content": str}. Point data.prompt_key at a text field or a '
                    "list of chat messages"
                )
            messages.append({"role": message["role"], "content": message["content"]})
        return messages if any(m["content"].strip() for m in messages) else None
    raise ConfigError(
        f"{where}: field {key!r} is a {type(value).__name__}; expected text or a list of chat "
        "messages. Set data.prompt_key to the field holding the prompt"
    )


def _answer_value(value: Any, where: str, key: str) -> str | None:
    """The ground truth as text, or None when it is missing (the row is skipped)."""
    if value is None:
        return None
    if isinstance(value, bool):  # bool is an int subclass; never a valid math answer
        raise ConfigError(f"{where}: field {key!r} is a bool; expected text or a number")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # Parquet often stores integer answers as doubles; "204.0" would fail exact matching.
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value.strip() or None
    raise ConfigError(
        f"{where}: field {key!r} is a {type(value).__name__}; expected text or a number. "
        "Set data.answer_key to the field holding the ground truth"
    )


class _FileReader:
    """Turns the rows of one file into records, keeping what the whole-file checks need."""

    def __init__(
        self,
        path: Path,
        format: str,
        *,
        prompt_key: str | None,
        answer_key: str | None,
        what: str,
        max_prompt_length: int | None,
    ) -> None:
        layout = _LAYOUTS[format]
        self.path, self.format, self.what, self.layout = path, format, what, layout
        self.max_prompt_length = max_prompt_length
        self.prompt_keys = (prompt_key,) if prompt_key else layout.prompt_keys
        self.answer_keys = (answer_key,) if answer_key else layout.answer_keys
        keys = self.prompt_keys + self.answer_keys
        # Top-level fields that feed the record itself; the rest of the row is metadata.
        self.used_roots = {k.split(".")[0] for k in keys} | set(keys)
        self.records: list[PromptRecord] = []
        self.skipped: Counter[str] = Counter()
        self.seen_prompt_field = self.seen_answer_field = False
        self.first: tuple[str, dict[str, Any]] | None = None
        self.num_rows = 0

    def rows(self) -> Iterator[tuple[str, RawRow]]:
        """The file's rows, as its reader yields them."""
        if self.path.suffix.lower() == ".parquet":
            return parquet_rows(self.path, self.what)
        return jsonl_rows(self.path, self.what, self.max_prompt_length)

    def add(self, raw: RawRow, where: str) -> None:
        """Parse one row and keep its record, or count why it is skipped."""
        if raw is None:
            assert self.max_prompt_length is not None  # only a limit makes lines unread
            raise too_long_error(where, "", self.max_prompt_length)
        row = raw if isinstance(raw, dict) else parse_jsonl_line(raw, where)
        if row is None:
            return
        self.num_rows += 1
        self.first = self.first or (where, row)
        p_key, p_raw = _first_present(row, self.prompt_keys, where)
        a_key, a_raw = _first_present(row, self.answer_keys, where)
        self.seen_prompt_field |= p_raw is not _MISSING
        self.seen_answer_field |= a_raw is not _MISSING
        prompt = None if p_raw is _MISSING else _prompt_value(p_raw, where, p_key)
        answer = None if a_raw is _MISSING else _answer_value(a_raw, where, a_key)
        if prompt is None:
            self.skipped[SKIP_EMPTY_PROMPT] += 1
            return
        if self.max_prompt_length is not None:
            # Parquet rows are not bounded on the way in: bound the prompt before tokenising.
            limit = max_row_bytes(self.max_prompt_length)
            if (size := prompt_bytes(prompt, limit)) > limit:
                raise too_long_error(where, f"prompt of {size} bytes, ", self.max_prompt_length)
        if answer is None:
            self.skipped[SKIP_MISSING_ANSWER] += 1
            return
        metadata = {k: v for k, v in row.items() if k not in self.used_roots}
        if self.layout.gsm8k_answer:
            final = gsm8k_final_answer(answer)
            if final is None:
                self.skipped[SKIP_UNPARSEABLE_ANSWER] += 1
                return
            metadata["solution"] = answer
            answer = final
        metadata["row"] = self.num_rows
        self.records.append(PromptRecord(prompt, answer, metadata))

    def finish(self) -> PromptDataset:
        """The dataset, after the checks only the whole file can answer."""
        if self.first is None:
            raise ConfigError(f"{self.what}: {self.path} has no rows")
        for seen, keys, config_key in (
            (self.seen_prompt_field, self.prompt_keys, "data.prompt_key"),
            (self.seen_answer_field, self.answer_keys, "data.answer_key"),
        ):
            if not seen:
                where, row = self.first
                raise ConfigError(
                    f"{where}: no field {' or '.join(map(repr, keys))} in any of the "
                    f"{self.num_rows} rows (this row has {sorted(row)}); set {config_key} to "
                    "the field to read (dotted paths like reward_model.ground_truth work) or "
                    f"check data.format ({self.format!r})"
                )
        if not self.records:
            raise ConfigError(
                f"{self.what}: {self.path}: every one of its {self.num_rows} rows was skipped "
                f"({dict(self.skipped)}); check data.prompt_key, data.answer_key and data.format"
            )
        return PromptDataset(self.records, str(self.path), self.num_rows, dict(self.skipped))


def _scan(
    path: str | Path,
    format: str,
    *,
    prompt_key: str | None,
    answer_key: str | None,
    what: str,
    max_prompt_length: int | None,
    errors: list[str] | None,
) -> PromptDataset | None:
    """Read a file. errors None: raise the first problem. A list: append each bad row's
    message and go on (a checker reports every bad line in one go), stopping after
    MAX_CHECK_ERRORS; returns None when a row was bad."""
    if format not in _LAYOUTS:
        raise ConfigError(
            f"data.format {format!r} is not read from a file; choose one of {', '.join(FILE_FORMATS)}"
        )
    path = _local_path(path, format, prompt_key=prompt_key, answer_key=answer_key, what=what)
    check_path(path, what)
    reader = _FileReader(
        path,
        format,
        prompt_key=prompt_key,
        answer_key=answer_key,
        what=what,
        max_prompt_length=max_prompt_length,
    )
    bad = 0
    for where, raw in reader.rows():
        try:
            reader.add(raw, where)
        except ConfigError as e:
            if errors is None:
                raise
            errors.append(str(e))
            bad += 1
            if bad == MAX_CHECK_ERRORS:
                errors.append(f"{what}: {path}: stopped checking after {bad} bad rows")
                return None
    if bad:
        return None  # the whole-file checks would only repeat what the bad rows say
    return reader.finish()


def _local_path(
    path: str | Path,
    format: str,
    *,
    prompt_key: str | None,
    answer_key: str | None,
    what: str,
) -> Path:
    """The file to read: ``path`` itself, or for ``hf://Org/Name`` the local copy in the
    layout of ``format`` (fetched and converted once, data/hub_datasets.py)."""
    if not is_hf_uri(path):
        return Path(path)
    layout = _LAYOUTS[format]
    return resolve_data_path(
        path,
        format,
        what=what,
        prompt_keys=(prompt_key,) if prompt_key else layout.prompt_keys,
        answer_keys=(answer_key,) if answer_key else layout.answer_keys,
    )


def load_prompt_file(
    path: str | Path,
    format: str,
    *,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    what: str = "dataset file",
    max_prompt_length: int | None = None,
) -> PromptDataset:
    """Read a jsonl or parquet file of prompts in one of the FILE_FORMATS layouts.

    Args:
        path: the .jsonl or .parquet file, or a hub dataset ``hf://Org/Name[:split]``
            (fetched into the HF cache and converted on first use; data/hub_datasets.py).
        format: "dapo_math", "aime" or "gsm8k".
        prompt_key: field (dotted path allowed) holding the prompt; None uses the layout's.
        answer_key: field (dotted path allowed) holding the ground truth; None uses the layout's.
        what: how errors name the path (e.g. "data.train_path").
        max_prompt_length: data.max_prompt_length; a row over max_row_bytes of it is an
            error, found before the row is parsed. None: rows are not bounded.

    Returns:
        The usable records and the count of skipped rows by reason.

    Raises:
        ConfigError: a missing or unreadable file, unknown extension or format, an invalid
            row (UTF-8, JSON, field type, length; the message names the file and the line),
            a field no row has, every row skipped.
    """
    dataset = _scan(
        path,
        format,
        prompt_key=prompt_key,
        answer_key=answer_key,
        what=what,
        max_prompt_length=max_prompt_length,
        errors=None,
    )
    assert dataset is not None  # without an error list, _scan raises instead
    return dataset


def check_prompt_file(
    path: str | Path,
    format: str,
    *,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    what: str = "dataset file",
    max_prompt_length: int | None = None,
) -> list[str]:
    """The problems load_prompt_file would raise for this file, every bad row's (up to
    MAX_CHECK_ERRORS) rather than the first, as one-line messages; [] when it loads.
    Arguments as for load_prompt_file."""
    errors: list[str] = []
    try:
        _scan(
            path,
            format,
            prompt_key=prompt_key,
            answer_key=answer_key,
            what=what,
            max_prompt_length=max_prompt_length,
            errors=errors,
        )
    except ConfigError as e:
        errors.append(str(e))
    return errors


def _first_present(row: dict[str, Any], keys: Sequence[str], where: str) -> tuple[str, Any]:
    """The first of `keys` the row has, and its value; (keys[0], _MISSING) if none."""
    for key in keys:
        value = _lookup(row, key, where)
        if value is not _MISSING:
            return key, value
    return keys[0], _MISSING


@dataclass
class DatasetSplits:
    """The training prompts and, when configured, the validation prompts."""

    train: PromptDataset
    val: PromptDataset | None


def build_datasets(data: DataConfig, *, seed: int) -> DatasetSplits:
    """Load (or, for the arithmetic task, generate) the datasets a run config names.

    Args:
        data: the run's data section.
        seed: run.seed; the generated tasks and data.val_fraction's held-out split (NeMo
            RL's data.train.seed, ``${grpo.seed}``) use it (file order is the sampler's job).
    """
    if data.format == "arithmetic":
        # Imported here because arithmetic.py builds on PromptRecord from this module.

        task = data.arithmetic
        train, val = make_train_val_split(
            task.num_train, task.num_val, seed=seed, num_operands=task.difficulty
        )
        name = f"arithmetic(difficulty={task.difficulty}, seed={seed})"
        return DatasetSplits(
            PromptDataset(train, f"{name} train", len(train)),
            PromptDataset(val, f"{name} validation", len(val)) if val else None,
        )
    if data.format == "remainder":
        rs = data.remainder
        problems = RemainderTask(rs.min_dividend, rs.max_dividend, rs.min_divisor, rs.max_divisor)
        train, val = remainder_split(rs.num_train, rs.num_val, seed=seed, task=problems)
        name = (
            f"remainder(n={rs.min_dividend}..{rs.max_dividend}, "
            f"d={rs.min_divisor}..{rs.max_divisor}, seed={seed})"
        )
        return DatasetSplits(
            PromptDataset(train, f"{name} train", len(train)),
            PromptDataset(val, f"{name} validation", len(val)) if val else None,
        )
    if data.train_path is None:
        raise ConfigError(
            f"data.train_path: data.format {data.format} reads prompts from a file; set it"
        )
    train_set = load_prompt_file(
        data.train_path, data.format, **_file_args(data, "data.train_path")
    )
    val_set = None
    if data.val_path is not None:
        val_set = load_prompt_file(data.val_path, data.format, **_file_args(data, "data.val_path"))
    elif data.val_fraction is not None:
        # NeMo RL's split_validation_size (data/val_split.py).
        fraction = data.val_fraction
        train, val, n_train, n_val = split_validation(
            train_set.records, train_set.num_rows, train_set.source, fraction, seed
        )
        where = f"{train_set.source} (data.val_fraction = {fraction}, seed {seed})"
        train_set = PromptDataset(train, f"{where} training share", n_train, {})
        val_set = PromptDataset(val, f"{where} held-out share", n_val, {})
    return DatasetSplits(train_set, val_set)


def _file_args(data: DataConfig, what: str) -> dict[str, Any]:
    """load_prompt_file's (and check_prompt_file's) keyword arguments for a data file."""
    return {
        "prompt_key": data.prompt_key,
        "answer_key": data.answer_key,
        "what": what,
        "max_prompt_length": data.max_prompt_length,
    }


def check_data_files(data: DataConfig) -> list[str]:
    """The problems build_datasets would raise for the data files of `data` (each bad row
    of each file, up to a cap), without stopping at the first; [] for the arithmetic task."""
    if data.format in GENERATED_FORMATS:
        return []  # generated in memory: nothing to read
    if data.train_path is None:
        return [f"data.train_path: data.format {data.format} reads prompts from a file; set it"]
    errors = check_prompt_file(data.train_path, data.format, **_file_args(data, "data.train_path"))
    if data.val_path is not None:
        errors += check_prompt_file(data.val_path, data.format, **_file_args(data, "data.val_path"))
    return errors


@dataclass
class EncodedPrompts:
    """Token ids of the prompts that fit, aligned with their records."""

    input_ids: list[list[int]]
    """Prompt token ids (chat template applied when asked), one list per kept record."""
    records: list[PromptRecord]
    """The kept records; ``records[i]`` is the problem of ``input_ids[i]``."""
    num_too_long: int
    """Prompts skipped because they have more than max_prompt_length tokens."""


def encode_prompts(
    records: Sequence[PromptRecord],
    tokenizer: PreTrainedTokenizerBase,
    *,
    apply_chat_template: bool,
    max_prompt_length: int,
    prompt_template: str | None = None,
) -> EncodedPrompts:
    """Tokenise prompts, skipping (and counting) those longer than max_prompt_length tokens.

    A prompt_template (data.prompt_template) first makes each problem's user message
    (data/prompt_template.py: NeMo RL's prompt_file, ``template.format(problem)``, applied
    before the chat template as its math_hf_data_processor does); the records keep the
    problem as it was.

    With apply_chat_template the messages go through the tokenizer's chat template with the
    generation prompt appended, and the template alone decides the special tokens (no BOS is
    added on top). Without it the plain text is tokenised with the tokenizer's own special
    tokens (e.g. the char tokenizer's <bos>).
    """
    if max_prompt_length < 1:
        raise ValueError(f"data.max_prompt_length must be >= 1, got {max_prompt_length}")
    if not records:
        return EncodedPrompts([], [], 0)
    messages = [apply_prompt_template(r.messages, prompt_template) for r in records]
    if apply_chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"data.apply_chat_template is true but the tokenizer "
                f"{getattr(tokenizer, 'name_or_path', '')!r} has no chat template; set "
                "data.apply_chat_template: false or use a tokenizer that ships one"
            )
        texts = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    else:
        plain = ["\n".join(m["content"] for m in m_list) for m_list in messages]
        ids = tokenizer(plain, add_special_tokens=True)["input_ids"]
    kept = [i for i, tokens in enumerate(ids) if len(tokens) <= max_prompt_length]
    return EncodedPrompts(
        input_ids=[list(ids[i]) for i in kept],
        records=[records[i] for i in kept],
        num_too_long=len(records) - len(kept),
    )
