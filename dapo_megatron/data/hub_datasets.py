"""Prompt datasets named on the Hugging Face hub: ``data.train_path: hf://Org/Name[:split]``.

`resolve_data_path` turns such a name into a local .jsonl file that data/datasets.py reads
like any other: the dataset repository's data files are fetched once into the HF cache
(data/hub.py), then converted into the layout of ``data.format`` and written beside the
cache (``<HF cache>/../dapo-megatron/datasets/Org--Name/<commit>/<split>.<format>.jsonl``;
the commit keeps a newer upload of the dataset from being mistaken for the old one, and
the write is atomic, so an interrupted conversion is redone, never half-read).

Known datasets (KNOWN_DATASETS) have a converter written from their published columns:

- ``BytedTsinghua-SIA/DAPO-Math-17k``: ``prompt`` (chat messages), ``reward_model``
  (``{"style": "rule", "ground_truth": ...}``), ``data_source``, ``ability``,
  ``extra_info``. The file repeats each of its ~17.9k problems about 100 times; repeats are
  dropped (the first of each prompt is kept).
- ``BytedTsinghua-SIA/AIME-2024``: the same columns, AIME 2024's 30 problems (repeats
  dropped likewise).
- ``openai/gsm8k`` (config ``main``): ``question``, ``answer`` (a worked solution ending in
  ``#### N``); splits train and test.
- ``HuggingFaceH4/MATH-500``: ``problem``, ``answer``, ``solution``, ``subject``,
  ``level``, ``unique_id``; split test.
- ``nvidia/OpenMathInstruct-2``: ``problem``, ``generated_solution``, ``expected_answer``,
  ``problem_source``; splits train_1M (the default, NeMo RL's), train_2M, train_5M, train.
  Repeated problems (one per generated solution) are kept, as NeMo RL keeps them;
  ``generated_solution`` is dropped (see KnownDataset.drop_columns).

A converted row is in the layout data.format reads (dapo_math/aime: ``prompt`` messages and
``reward_model.ground_truth``; gsm8k: ``question`` and ``answer``) and keeps the dataset's
own columns too, so data.prompt_key / data.answer_key may still name them. Rows without a
prompt or an answer are written as they are: the reader skips and counts them.

Any other ``hf://`` dataset is fetched (its .parquet/.jsonl files of the split) and its
rows written unchanged: usable when data.format's fields, or data.prompt_key /
data.answer_key, name its columns; else the error lists its columns and the keys to set.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from dapo_megatron.config.errors import ConfigError
from dapo_megatron.data.hub import fetch_snapshot, hub_cache
from dapo_megatron.data.records import Message, gsm8k_final_answer

HF_SCHEME = "hf://"
DATA_FILE_PATTERNS = ("*.parquet", "*.jsonl")
"""The data files fetched of a dataset no converter knows."""
CONVERTED_DIR_ENV = "DAPO_MEGATRON_DATA_CACHE"
"""Overrides where converted files are written (default: beside the HF cache)."""
_BATCH_ROWS = 10_000


def is_hf_uri(value: str | os.PathLike[str] | None) -> bool:
    """Whether a data path names a hub dataset (``hf://Org/Name[:split]``)."""
    return isinstance(value, str) and value.startswith(HF_SCHEME)


@dataclass(frozen=True)
class HubDatasetRef:
    """A parsed ``hf://Org/Name[:split]``."""

    repo_id: str
    split: str | None
    """None: the dataset's default split (train, or the only one)."""


_REF = re.compile(r"^hf://([A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9])(?::([\w.-]+))?$")


def parse_hf_uri(value: str, what: str) -> HubDatasetRef:
    """``hf://Org/Name`` or ``hf://Org/Name:split``; a ConfigError naming the key otherwise."""
    match = _REF.match(value)
    if match is None or ".." in value:
        raise ConfigError(
            f"{what} = {value}: not a hub dataset name; write hf://Org/Name or "
            "hf://Org/Name:split (e.g. hf://openai/gsm8k:test)"
        )
    return HubDatasetRef(match.group(1), match.group(2))


# ----------------------------------------------------------------------------- converters


@dataclass(frozen=True)
class HubRow:
    """What a converter reads out of one published row."""

    prompt: str | list[Message] | None
    answer: str | None
    """The ground truth (GSM8K: the final number); None when the row has none."""
    solution: str | None = None
    """A worked solution ending in ``#### answer`` (GSM8K's ``answer`` column)."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _dapo_row(row: Mapping[str, Any]) -> HubRow:
    reward = row.get("reward_model")
    answer = reward.get("ground_truth") if isinstance(reward, Mapping) else None
    prompt = row.get("prompt")
    return HubRow(prompt if isinstance(prompt, (str, list)) else None, _text(answer))


def _gsm8k_row(row: Mapping[str, Any]) -> HubRow:
    solution = _text(row.get("answer"))
    final = gsm8k_final_answer(solution) if solution else None
    return HubRow(_text(row.get("question")), final, solution)


def _math500_row(row: Mapping[str, Any]) -> HubRow:
    return HubRow(_text(row.get("problem")), _text(row.get("answer")), None)


def _openmath2_row(row: Mapping[str, Any]) -> HubRow:
    # NeMo RL's response_datasets/openmathinstruct2.py format_data: the user message is
    # `problem` (input_key), the ground truth `expected_answer` (output_key's default).
    return HubRow(_text(row.get("problem")), _text(row.get("expected_answer")), None)


@dataclass(frozen=True)
class KnownDataset:
    """A hub dataset whose columns a converter maps to our layouts."""

    repo_id: str
    splits: Mapping[str, tuple[str, ...]]
    """Split -> the repository files (fnmatch patterns) that hold it."""
    default_split: str
    formats: tuple[str, ...]
    """The data.format values it is read with (the first is its natural one)."""
    convert: Callable[[Mapping[str, Any]], HubRow]
    dedupe: bool = False
    """Drop rows whose prompt repeats an earlier row's."""
    drop_columns: tuple[str, ...] = ()
    """Published columns not written to the converted file (the reader would keep them as
    every record's metadata, in the driver's memory)."""


KNOWN_DATASETS: dict[str, KnownDataset] = {
    d.repo_id.lower(): d
    for d in (
        KnownDataset(
            "BytedTsinghua-SIA/DAPO-Math-17k",
            {"train": ("data/*.parquet",)},
            "train",
            ("dapo_math", "aime"),
            _dapo_row,
            dedupe=True,
        ),
        KnownDataset(
            "BytedTsinghua-SIA/AIME-2024",
            {"train": ("data/*.parquet",)},
            "train",
            ("aime", "dapo_math"),
            _dapo_row,
            dedupe=True,
        ),
        KnownDataset(
            "openai/gsm8k",
            {"train": ("main/train-*.parquet",), "test": ("main/test-*.parquet",)},
            "train",
            ("gsm8k", "dapo_math", "aime"),
            _gsm8k_row,
        ),
        KnownDataset(
            "HuggingFaceH4/MATH-500",
            {"test": ("test.jsonl",)},
            "test",
            ("aime", "dapo_math"),
            _math500_row,
        ),
        # NeMo RL's OpenMathInstruct2Dataset loads split train_1M by default (it accepts
        # train, train_1M, train_2M, train_5M) and keeps every row: no dedupe, so that
        # data.val_fraction holds out the rows its split_validation_size holds out. The
        # solutions (~1M of them, a few KiB each) are not needed to score a final answer.
        KnownDataset(
            "nvidia/OpenMathInstruct-2",
            {
                "train_1M": ("data/train_1M-*.parquet",),
                "train_2M": ("data/train_2M-*.parquet",),
                "train_5M": ("data/train_5M-*.parquet",),
                "train": ("data/train-*.parquet",),
            },
            "train_1M",
            ("aime", "dapo_math"),
            _openmath2_row,
            drop_columns=("generated_solution",),
        ),
    )
}


def layout_row(
    row: Mapping[str, Any], hub_row: HubRow, format: str, drop: Sequence[str] = ()
) -> dict[str, Any]:
    """The row in data.format's layout, with the dataset's own columns (but ``drop``) kept
    beside it."""
    out = {k: v for k, v in row.items() if k not in drop}
    if format == "gsm8k":
        prompt = hub_row.prompt
        if isinstance(prompt, list):
            prompt = "\n".join(str(m.get("content") or "") for m in prompt)
        out["question"] = prompt
        out["answer"] = hub_row.solution or (
            None if hub_row.answer is None else f"#### {hub_row.answer}"
        )
        return out
    prompt = hub_row.prompt
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    out["prompt"] = prompt
    out["reward_model"] = {"style": "rule", "ground_truth": hub_row.answer}
    return out


# ----------------------------------------------------------------------------- files


def split_files(snapshot: Path, patterns: Sequence[str], split: str | None) -> list[Path]:
    """The snapshot's data files matching ``patterns`` and, when ``split`` is given, whose
    path names the split (a directory or a file name ``split``, ``split-*``, ``split_*``,
    ``split.*``), sorted so shards concatenate in order."""
    files = sorted(
        p
        for p in snapshot.rglob("*")
        if p.is_file() and any(fnmatch(p.relative_to(snapshot).as_posix(), q) for q in patterns)
    )
    if split is None:
        return files
    marker = re.compile(rf"^{re.escape(split)}(?:$|[-_.])")
    return [p for p in files if any(marker.match(part) for part in p.relative_to(snapshot).parts)]


def _file_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a .parquet (in batches: DAPO-Math-17k has 1.8M rows) or .jsonl file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS):
            yield from batch.to_pylist()
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _row_count(path: Path) -> int | None:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    return None


def converted_root(env: Mapping[str, str] | None = None) -> Path:
    """Where converted files go: DAPO_MEGATRON_DATA_CACHE, else beside the HF cache."""
    env = os.environ if env is None else env
    if env.get(CONVERTED_DIR_ENV):
        return Path(env[CONVERTED_DIR_ENV]).expanduser()
    return hub_cache(env).parent / "dapo-megatron" / "datasets"


def _write_jsonl(
    out: Path,
    files: Sequence[Path],
    rows_of: Callable[[dict[str, Any]], dict[str, Any] | None],
    label: str,
) -> tuple[int, int]:
    """Write every converted row of ``files`` to ``out`` atomically; (written, dropped)."""
    from tqdm import tqdm

    counts = [_row_count(f) for f in files]
    total = None if None in counts else sum(c for c in counts if c is not None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    written = dropped = 0
    try:
        with (
            open(tmp, "w", encoding="utf-8") as f,
            tqdm(
                total=total, unit=" rows", desc=f"[data] converting {label}", mininterval=1.0
            ) as bar,
        ):
            for path in files:
                for row in _file_rows(path):
                    bar.update(1)
                    converted = rows_of(row)
                    if converted is None:
                        dropped += 1
                        continue
                    f.write(json.dumps(converted, ensure_ascii=False, default=str) + "\n")
                    written += 1
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return written, dropped


# ----------------------------------------------------------------------------- resolution


def resolve_data_path(
    value: str | os.PathLike[str],
    format: str,
    *,
    what: str,
    prompt_keys: Sequence[str] = (),
    answer_keys: Sequence[str] = (),
) -> Path:
    """The local file of a data path: itself, or for ``hf://`` the converted copy.

    Args:
        value: data.train_path / data.val_path.
        format: data.format (the layout the converted file is written in).
        what: the key, for messages.
        prompt_keys, answer_keys: the fields the reader will look for (data.prompt_key or
            the layout's); an unknown dataset without any of them is an error listing its
            columns.

    Raises:
        ConfigError: a malformed name, a split or format the dataset has not, a dataset not
            cached and not downloadable (names dapo-prepare), columns that do not map.
    """
    if not is_hf_uri(value):
        return Path(value)
    assert isinstance(value, str)
    ref = parse_hf_uri(value, what)
    known = KNOWN_DATASETS.get(ref.repo_id.lower())
    if known is not None:
        return _resolve_known(value, ref, known, format, what)
    return _resolve_other(value, ref, format, what, prompt_keys, answer_keys)


def _resolve_known(
    value: str, ref: HubDatasetRef, known: KnownDataset, format: str, what: str
) -> Path:
    if format not in known.formats:
        raise ConfigError(
            f"{what} = {value}: {known.repo_id} is read with data.format "
            f"{' or '.join(known.formats)}, not {format!r}; set data.format={known.formats[0]}"
        )
    split = ref.split or known.default_split
    if split not in known.splits:
        raise ConfigError(
            f"{what} = {value}: {known.repo_id} has no split {split!r}; it has "
            f"{', '.join(known.splits)} (write hf://{known.repo_id}:{next(iter(known.splits))})"
        )
    patterns = known.splits[split]
    snapshot = fetch_snapshot(
        known.repo_id,
        "dataset",
        patterns,
        what=what,
        value=value,
        complete=lambda p: bool(split_files(p, patterns, None)),
    )
    out = converted_root() / known.repo_id.replace("/", "--") / snapshot.name
    out = out / f"{split}.{format}.jsonl"
    if out.is_file():
        return out
    seen: set[str] = set()

    def convert(row: dict[str, Any]) -> dict[str, Any] | None:
        hub_row = known.convert(row)
        if known.dedupe:
            key = json.dumps(hub_row.prompt, sort_keys=True, default=str)
            if key in seen:
                return None
            seen.add(key)
        return layout_row(row, hub_row, format, known.drop_columns)

    files = split_files(snapshot, patterns, None)
    written, dropped = _write_jsonl(out, files, convert, f"{value} ({split})")
    repeats = f", {dropped} repeated prompts dropped" if dropped else ""
    print(f"[data] {value}: {written} rows{repeats} -> {out}", flush=True)
    return out


def _resolve_other(
    value: str,
    ref: HubDatasetRef,
    format: str,
    what: str,
    prompt_keys: Sequence[str],
    answer_keys: Sequence[str],
) -> Path:
    split = ref.split or "train"

    def files_of(snapshot: Path) -> list[Path]:
        files = split_files(snapshot, DATA_FILE_PATTERNS, split)
        if not files and ref.split is None:
            # No "train" split: a dataset of one split (often "test") is used whole.
            files = split_files(snapshot, DATA_FILE_PATTERNS, None)
        return files

    snapshot = fetch_snapshot(
        ref.repo_id,
        "dataset",
        DATA_FILE_PATTERNS,
        what=what,
        value=value,
        complete=lambda p: bool(split_files(p, DATA_FILE_PATTERNS, None)),
    )
    files = files_of(snapshot)
    if not files:
        found = [p.relative_to(snapshot).as_posix() for p in split_files(snapshot, ("*",), None)]
        raise ConfigError(
            f"{what} = {value}: {ref.repo_id} has no .parquet or .jsonl file of split "
            f"{split!r} (its files: {', '.join(found[:8]) or 'none'}); name the split as "
            f"hf://{ref.repo_id}:SPLIT or download the data and point {what} at a local file"
        )
    first = next(_file_rows(files[0]), None)
    if first is not None:
        _check_columns(value, what, format, first, prompt_keys, answer_keys)
    out = converted_root() / ref.repo_id.replace("/", "--") / snapshot.name
    out = out / f"{split}.jsonl"
    if not out.is_file():
        written, _ = _write_jsonl(out, files, lambda row: row, f"{value} ({split})")
        print(f"[data] {value}: {written} rows -> {out}", flush=True)
    return out


def _has(row: Mapping[str, Any], key: str) -> bool:
    """Whether ``row`` has ``key``, a literal column or a dotted path into mappings."""
    if key in row:
        return True
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
    return True


def _check_columns(
    value: str,
    what: str,
    format: str,
    row: Mapping[str, Any],
    prompt_keys: Sequence[str],
    answer_keys: Sequence[str],
) -> None:
    """An unknown dataset must have the prompt and answer fields the reader looks for."""
    missing = [
        f"{config_key} (looked for {' or '.join(map(repr, keys))})"
        for keys, config_key in ((prompt_keys, "data.prompt_key"), (answer_keys, "data.answer_key"))
        if keys and not any(_has(row, k) for k in keys)
    ]
    if missing:
        raise ConfigError(
            f"{what} = {value}: no converter knows this dataset and its columns "
            f"{sorted(row)} do not hold data.format {format!r}'s fields; set "
            f"{' and '.join(missing)} to its columns (dotted paths reach into nested ones), "
            "see docs/guides/data.md"
        )
