"""Datasets and prompts: the built-in arithmetic task, JSONL prompt/answer files, GSM8K rows, and Parquet,
CSV and Hugging Face Hub datasets through Hugging Face `datasets` (an optional extra).

A row is a dict with "prompt" and "answer" strings plus any extra columns (for
example "difficulty"), which reach reward functions as keyword lists. This module
imports no mlx.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import io
import json
import logging
import math
import random
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common.errors import UserError, install_hint
from .tasks import arithmetic, reasoning_gym

GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def _gsm8k_answer(text: str, where: str) -> str:
    match = GSM8K_ANSWER.search(text)
    if match is None:
        raise UserError(f"{where}: GSM8K answer has no final '#### <number>' line")
    return match.group(1).replace(",", "").strip()


def _messages(value: list, where: str, field: str) -> list[dict]:
    """A conversational prompt: chat messages with string roles and contents, ending with the user's turn."""
    if not value or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                            for m in value):
        raise UserError(f"{where}: field '{field}' is a list, so it must hold messages "
                        '{"role": "...", "content": "..."}')
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _transcript(messages: list[dict]) -> str:
    """A conversation as text, for reward functions, samples and logs."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


# Other tools' names for the reference answer, tried in this order when a dataset has no `answer` column (and
# answer_field is left at its default): TRL's and open-r1's `solution`, then names other GRPO datasets use, then
# the `completion` of mlx-lm's and TRL's prompt/completion rows. With none of them, the rows are prompts only.
ANSWER_LIKE = ("solution", "ground_truth", "reference_answer", "final_answer", "expected_answer", "target",
               "completion")
_said: set[str] = set()  # notes already printed: the trainer, its memory plan and evaluation each read the rows


def _say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        print(f"mlx-grpo: note: {text}", file=sys.stderr)


def answer_column(columns: Any, answer_field: str, where: str) -> str | None:
    """The column holding the reference answer: `answer_field` when the data has it; else, for the default
    `answer`, the first of ANSWER_LIKE it has, said in a note; None (prompts only) when it has none."""
    if answer_field in columns:
        return answer_field
    if answer_field != "answer":  # the user named the column: it must be there
        raise UserError(f"{where}: missing field '{answer_field}' (answer_field; the data has "
                        f"{', '.join(repr(str(c)) for c in columns) or 'no fields'})")
    found = next((name for name in ANSWER_LIKE if name in columns), None)
    if found is not None:
        _say_once(f"{where.split(':')[0]}: no 'answer' column; '{found}' is read as the reference answer "
                  f"(answer_field: {found})")
    else:
        _say_once(f"{where.split(':')[0]}: no answer column ({', '.join(('answer',) + ANSWER_LIKE)}): prompts "
                  "only, for rewards that need no reference answer")
    return found


# Reward functions get these as arguments; a dataset column of the same name would collide with them.
REWARD_ARGUMENTS = frozenset({"prompts", "completions", "answers"})


def _row(record: dict, where: str, fmt: str, prompt_field: str, answer_field: str | None) -> dict:
    """One dataset record (a JSONL object or a table row) as a row; problems are reported at `where`. With
    no `answer_field` (prompts only) the row's answer is empty."""
    if fmt == "auto":
        fmt = "gsm8k" if "question" in record and prompt_field not in record else "prompt_answer"
    if fmt == "gsm8k":
        for key in ("question", "answer"):
            if not isinstance(record.get(key), str):
                raise UserError(f"{where}: GSM8K row needs a string '{key}' field")
        row = {k: v for k, v in record.items() if k not in ("question", "answer")}
        row.update(prompt=record["question"], answer=_gsm8k_answer(record["answer"], where))
    else:
        for key in (prompt_field, answer_field):
            if key is not None and key not in record:
                raise UserError(f"{where}: missing field '{key}' (the row has "
                                f"{', '.join(repr(str(k)) for k in record) or 'no fields'})")
        prompt = record[prompt_field]
        messages = _messages(prompt, where, prompt_field) if isinstance(prompt, list) else None
        if messages is None and not isinstance(prompt, str):
            raise UserError(f"{where}: field '{prompt_field}' must be a string or a list of messages "
                            "({\"role\": ..., \"content\": ...})")
        answer = record[answer_field] if answer_field is not None else ""
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise UserError(f"{where}: field '{answer_field}' must be a string or a number, got "
                            f"{'null' if answer is None else type(answer).__name__}")
        row = {k: v for k, v in record.items() if k not in (prompt_field, answer_field)}
        row.update(prompt=prompt if messages is None else _transcript(messages), answer=str(answer))
        if answer_field not in (None, "answer", *REWARD_ARGUMENTS):
            row[answer_field] = answer  # TRL passes every column under its own name: `solution` stays `solution`
        if messages is not None:
            row["messages"] = messages
    for key in ("prompt", "answer"):
        try:
            row[key].encode("utf-8")
        except UnicodeEncodeError as err:  # a JSON \ud800 escape: no tokenizer takes it
            raise UserError(f"{where}: field '{prompt_field if key == 'prompt' else answer_field}' is not valid "
                            f"text (a lone surrogate, {err.object[err.start]!a}); fix or drop the row") from None
    shadowing = sorted(REWARD_ARGUMENTS & set(row))
    if shadowing:
        raise UserError(f"{where}: column '{shadowing[0]}' has the name of a reward function's own argument "
                        "(prompts, completions, answers): rename it")
    return row


def read_jsonl_dataset(path: Path, fmt: str, prompt_field: str, answer_field: str) -> list[dict]:
    """Rows from a JSONL file, or from one JSON document as pandas' `to_json` writes it (see
    `_document_records`); every problem is reported with its line number. A byte-order mark is read as
    editors on Windows write it: UTF-8's is skipped, UTF-16's decodes the file as UTF-16."""
    if not path.is_file():
        kind = ("is not a regular file (a directory, a FIFO or a device)" if path.exists() else
                "is a symbolic link that leads nowhere (a loop, or its target is gone)" if path.is_symlink() else
                "not found")
        raise UserError(f"{path}: dataset file {kind}")
    with path.open("rb") as fh:
        head = fh.read(4)
        source: Any = fh
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            try:
                source = io.BytesIO((head + fh.read()).decode("utf-16").encode("utf-8"))
            except UnicodeError as err:
                raise UserError(f"{path}: starts with a UTF-16 mark but is not UTF-16 text ({err.reason})") from None
        else:
            fh.seek(3 if head.startswith(codecs.BOM_UTF8) else 0)
        start = source.tell()
        if path.suffix.lower() == ".json" or source.read(64).lstrip()[:1] == b"[":
            source.seek(start)
            records = _document_records(source.read(), path, prompt_field)
            if records is not None:
                return _rows(records, path, fmt, prompt_field, answer_field)
        source.seek(start)
        return _jsonl_rows(source, path, fmt, prompt_field, answer_field)


def _fields_of(record: dict, fmt: str, prompt_field: str, answer_field: str, where: str) -> str | None:
    """The answer column for rows like `record` (GSM8K rows have theirs)."""
    if fmt == "gsm8k" or (fmt == "auto" and "question" in record and prompt_field not in record):
        return answer_field
    return answer_column(record, answer_field, where)


def _jsonl_rows(lines: Any, path: Path, fmt: str, prompt_field: str, answer_field: str | None) -> list[dict]:
    rows: list[dict] = []
    resolved = False
    for line_no, raw in enumerate(lines, 1):
        where = f"{path}:{line_no}"
        if b"\x00" in raw:  # every other byte zero: UTF-16 saved without its byte-order mark
            raise UserError(f"{where}: holds NUL bytes, as UTF-16 text without a byte-order mark does; "
                            "save the file as UTF-8")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UserError(f"{where}: not UTF-8 text (byte {err.object[err.start]:#04x})") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{where}: malformed JSON ({err.msg})") from None
        except RecursionError:
            raise UserError(f"{where}: JSON nested too deeply") from None
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected a JSON object per line")
        if not resolved:
            answer_field, resolved = _fields_of(record, fmt, prompt_field, answer_field, where), True
        rows.append(_row(record, where, fmt, prompt_field, answer_field))
    if not rows:
        raise UserError(f"{path}: dataset is empty")
    return rows


def _rows(records: list[dict], path: Path, fmt: str, prompt_field: str, answer_field: str) -> list[dict]:
    if records:
        answer_field = _fields_of(records[0], fmt, prompt_field, answer_field, f"{path}: record 1")
    rows = [_row(record, f"{path}: record {n}", fmt, prompt_field, answer_field) for n, record in enumerate(records, 1)]
    if not rows:
        raise UserError(f"{path}: dataset is empty")
    return rows


def _document_records(data: bytes, path: Path, prompt_field: str) -> list[dict] | None:
    """The records of a file that is one JSON document, as pandas reads them back: a list of records
    (`to_json(orient="records")`, also `datasets`' JSON), columns of {index: value} (pandas' default
    `to_json`), `orient="index"`, `"split"` and `"table"`. None when the file is not one JSON document
    (JSONL, read line by line) or is a single record (a one-line JSONL file)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte {err.object[err.start]:#04x})") from None
    except (json.JSONDecodeError, RecursionError):
        return None
    if isinstance(doc, list):
        if not all(isinstance(r, dict) for r in doc):
            raise UserError(f"{path}: a JSON list must hold one object per row")
        return doc
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected JSON objects (one per line, or a list of them)")
    if isinstance(doc.get("data"), list) and ("schema" in doc or "columns" in doc):  # orient table / split
        if "schema" in doc:
            return [{k: v for k, v in r.items() if k != "index"} for r in doc["data"] if isinstance(r, dict)]
        columns = doc.get("columns")
        if isinstance(columns, list) and all(isinstance(r, list) and len(r) == len(columns) for r in doc["data"]):
            return [dict(zip(columns, r)) for r in doc["data"]]
    values = list(doc.values())
    if values and all(isinstance(v, dict) for v in values):
        if prompt_field in doc or "question" in doc:  # columns of {index: value}
            index = list(values[0])
            return [{column: cells.get(i) for column, cells in doc.items()} for i in index]
        return values  # orient index: {index: record}
    return None


# Local files read through Hugging Face `datasets` (the `data` extra), by their suffix; anything else is JSONL.
TABLE_FORMATS = {".parquet": "parquet", ".csv": "csv"}
FILE_SUFFIXES = {".jsonl", ".json", *TABLE_FORMATS}
# owner/name, optionally :config (a dataset's subset, such as openai/gsm8k:main)
HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+(:[\w.-]+)?")
INSTALL_DATA = install_hint("data")


@contextlib.contextmanager
def _quiet_datasets(datasets: Any):
    """Hugging Face datasets and hub print progress bars, retries and read errors of their own on stderr;
    here the error that matters reaches the user as one line instead."""
    loggers = [logging.getLogger(name) for name in ("datasets", "huggingface_hub")]
    levels = [logger.level for logger in loggers]
    bars_were_off = datasets.are_progress_bars_disabled()
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        if not bars_were_off:
            datasets.enable_progress_bars()


def _import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError(f"{what} needs Hugging Face datasets, which is not installed: {INSTALL_DATA}") from None
    return datasets


def _table_rows(table: Any, where: str, fmt: str, prompt_field: str, answer_field: str) -> list[dict]:
    """Rows of a `datasets.Dataset`: a missing column is named once, other problems with their row number."""
    columns = table.column_names
    if fmt == "auto":
        fmt = "gsm8k" if "question" in columns and prompt_field not in columns else "prompt_answer"
    if fmt != "gsm8k":
        answer_field = answer_column(columns, answer_field, where)
    for key in ("question", "answer") if fmt == "gsm8k" else (prompt_field, answer_field):
        if key is not None and key not in columns:
            raise UserError(f"{where}: no column '{key}' (columns: {', '.join(columns) or 'none'})")
    rows = [_row(record, f"{where}: row {n}", fmt, prompt_field, answer_field)
            for n, record in enumerate(table.to_list(), 1)]
    if not rows:
        raise UserError(f"{where}: dataset is empty")
    return rows


def read_table_dataset(path: Path, fmt: str, prompt_field: str, answer_field: str) -> list[dict]:
    """Rows from a local .parquet or .csv file, through Hugging Face datasets. A CSV's answers are kept as
    written (read as numbers, "2" would become "2.0")."""
    kind = TABLE_FORMATS[path.suffix.lower()]
    if not path.is_file():
        raise UserError(f"{path}: dataset file not found")
    datasets = _import_datasets(f"{path}: reading a .{kind} dataset")
    if kind == "parquet" and _parquet_rows(path) == 0:  # datasets' reader fails on it with an Arrow error
        raise UserError(f"{path}: dataset is empty (a parquet file with no rows)")
    options = {"converters": {answer_field: str}} if kind == "csv" else {}
    # A throwaway cache: datasets would otherwise keep an Arrow copy of every file it reads under ~/.cache.
    with tempfile.TemporaryDirectory(prefix="mlx-grpo-data-") as cache, _quiet_datasets(datasets):
        source = _utf8_csv(path, Path(cache)) if kind == "csv" else path
        try:
            table = datasets.load_dataset(kind, data_files=str(source), split="train", cache_dir=cache,
                                          keep_in_memory=True, **options)
        except Exception as err:  # whatever the reader makes of a broken file, said in one line
            cause = err.__cause__ or err
            detail = " ".join(str(cause).split())[:300]
            raise UserError(f"{path}: not a readable {kind} file ({type(cause).__name__}: {detail})") from None
    return _table_rows(table, str(path), fmt, prompt_field, answer_field)


def _parquet_rows(path: Path) -> int | None:
    """The row count a parquet file's footer gives (None when it cannot be read: the reader then says why)."""
    try:
        import pyarrow.parquet as pq

        return pq.read_metadata(path).num_rows
    except Exception:  # not parquet, damaged, no pyarrow: the datasets reader's own one line follows
        return None


def _utf8_csv(path: Path, scratch: Path) -> Path:
    """A CSV as UTF-8, which is all `datasets` reads: the file itself when it is (a UTF-8 mark is fine), else a
    UTF-8 copy in `scratch` of what spreadsheets save: UTF-16 (Excel's "Unicode"), or Windows-1252 (Excel's
    plain "CSV" on Windows; Latin-1 is its subset), said in a note since that is a guess."""
    data = path.read_bytes()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            text = data.decode("utf-16")
        except UnicodeError as err:
            raise UserError(f"{path}: starts with a UTF-16 mark but is not UTF-16 text ({err.reason})") from None
    else:
        try:
            data.decode("utf-8")
            return path
        except UnicodeDecodeError as err:
            line = data[: err.start].count(b"\n") + 1
            text = data.decode("cp1252", errors="replace")
            print(f"mlx-grpo: note: {path} is not UTF-8 (line {line}); read as Windows-1252, as Excel saves CSV on "
                  "Windows. Save it as 'CSV UTF-8' if its text looks wrong", file=sys.stderr)
    copy = scratch / f"{path.stem}.utf8.csv"
    copy.write_text(text, encoding="utf-8")
    return copy


HF_PREFIX = "hf:"  # hf:NAME[:config], a Hugging Face datasets name, read from the local cache first


@contextlib.contextmanager
def _offline(datasets: Any):
    """Hugging Face datasets and hub reading their local cache only (no request, so no ~25 s of retries)."""
    import huggingface_hub.constants as hub

    saved = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved


def read_hub_dataset(name: str, split: str, fmt: str, prompt_field: str, answer_field: str,
                     cache_first: bool = False) -> list[dict]:
    """Rows of one split of a Hugging Face Hub dataset (`owner/name` or `owner/name:config`); `cache_first`
    (hf:NAME) reads the local datasets cache before asking the Hub."""
    shown = HF_PREFIX + name if cache_first else name
    datasets = _import_datasets(f"{shown}: not a local file; loading it with Hugging Face datasets")
    repo, _, subset = name.partition(":")
    with _quiet_datasets(datasets):
        table, cached_error = None, None
        if cache_first:
            try:
                with _offline(datasets):
                    table = datasets.load_dataset(repo, subset or None, split=split)
            except Exception as err:  # not in the cache: the Hub next
                cached_error = err
        if table is None:
            try:
                table = datasets.load_dataset(repo, subset or None, split=split)
            except Exception as err:  # unreachable hub, unknown name, config or split: one line
                detail = " ".join(str(err).split())[:300]
                where = ("is not in the local datasets cache, and loading" if cached_error is not None
                         else "no such file, and loading")
                raise UserError(f"{shown}: {where} its '{split}' split from the Hugging Face Hub failed "
                                f"({type(err).__name__}: {detail}); offline, a dataset is read from the cache that "
                                "an earlier download (datasets.load_dataset) left in ~/.cache/huggingface") from None
    return _table_rows(table, f"{shown} ({split} split)", fmt, prompt_field, answer_field)


def read_dataset_file(path: Path, fmt: str, prompt_field: str, answer_field: str) -> list[dict]:
    """Rows from a local file: .parquet and .csv through Hugging Face datasets, anything else as JSONL."""
    if path.suffix.lower() in TABLE_FORMATS:
        return read_table_dataset(path, fmt, prompt_field, answer_field)
    if path.suffix.lower() == ".tsv":
        raise UserError(f"{path}: tab-separated files are not read; save it as .csv (comma-separated) or .jsonl")
    return read_jsonl_dataset(path, fmt, prompt_field, answer_field)


def read_dataset(source: str, base_dir: Path, split: str, config: Any) -> list[dict]:
    """A config's dataset: a local file (relative to `base_dir`), or else, when `source` reads as
    `owner/name[:config]` or `hf:NAME[:config]`, the `split` of that Hugging Face dataset."""
    if source.startswith(HF_PREFIX):
        return read_hub_dataset(source[len(HF_PREFIX):], split, config.dataset_format, config.prompt_field,
                                config.answer_field, cache_first=True)
    path = Path(source).expanduser()
    path = path if path.is_absolute() else base_dir / path
    fields = (config.dataset_format, config.prompt_field, config.answer_field)
    # A name whose first part is a local directory is a mistyped path, not a hub dataset: say so at once
    # instead of after the hub's ~20 s of retries.
    local_dir = (base_dir / source.split("/", 1)[0]).is_dir()
    if path.is_dir():
        return read_dataset_file(mlx_lm_split(path, split), *fields)
    if path.exists() or path.suffix.lower() in FILE_SUFFIXES or not HUB_NAME.fullmatch(source) or local_dir:
        return read_dataset_file(path, *fields)
    return read_hub_dataset(source, split, *fields)


# mlx-lm's data directory: `data: DIR` holds train.jsonl and, for validation, valid.jsonl (test.jsonl is its
# `--test` set, unused here).
MLX_LM_SPLITS = {"train": "train.jsonl", "test": "valid.jsonl"}


def mlx_lm_split(directory: Path, split: str) -> Path:
    """The file of `split` in an mlx-lm data directory (train.jsonl; valid.jsonl for held-out)."""
    path = directory / MLX_LM_SPLITS[split]
    if not path.is_file():
        found = ", ".join(sorted(p.name for p in directory.glob("*.jsonl"))) or "no .jsonl files"
        raise UserError(f"{directory}: a dataset directory is read as mlx-lm reads it, with train.jsonl for "
                        f"training and valid.jsonl for held-out; it has no {path.name} (found: {found})")
    return path


def _has_valid_split(source: str, base_dir: Path) -> bool:
    path = Path(source).expanduser()
    path = path if path.is_absolute() else base_dir / path
    return path.is_dir() and (path / MLX_LM_SPLITS["test"]).is_file()


def load_datasets(config: Any, base_dir: Path) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) for a run config."""
    if config.dataset == "arithmetic":
        train = arithmetic.make_split("train", config.train_size, config.seed)
        heldout = arithmetic.make_split("heldout", config.eval_size, config.seed)
    elif reasoning_gym.is_task(config.dataset) and config.eval_dataset is None:
        train, heldout = reasoning_gym.splits(config.dataset, config.dataset_options, config.train_size,
                                              config.eval_size, config.seed)
    else:
        train = read_dataset(config.dataset, base_dir, "train", config)
        if config.eval_dataset is not None:
            heldout = read_dataset(config.eval_dataset, base_dir, "test", config)
        elif _has_valid_split(config.dataset, base_dir):
            heldout = read_dataset(config.dataset, base_dir, "test", config)
        else:
            # Hold out a fixed slice so evaluation never sees training prompts.
            shuffled = train[:]
            random.Random(config.seed).shuffle(shuffled)
            n_eval = min(config.eval_size, max(1, len(shuffled) // 20)) if len(shuffled) > 1 else 0
            heldout, train = shuffled[:n_eval], shuffled[n_eval:] or shuffled
        heldout = heldout[: config.eval_size]
    _refuse_answer_rewards(train, config)
    return train, heldout


# Built-in rewards and checks that compare a completion with the row's reference answer.
NEEDS_ANSWER = ("answer_check", "check_answer", "number_check", "check_numbers", "digit_match", "last_number_check",
                "last_number_digits", "task_score")


def _refuse_answer_rewards(rows: list[dict], config: Any) -> None:
    """Prompts-only data trains with rewards that need no reference answer; one that does is named."""
    if any(row["answer"] for row in rows):
        return
    needs = [spec.name for spec in config.rewards if spec.name in NEEDS_ANSWER]
    if config.correctness in ("answer", "last_number"):
        needs.append(f"correctness: {config.correctness}")
    if needs:
        raise UserError(f"{config.dataset}: the rows have no reference answer (no column answer, "
                        f"{', '.join(ANSWER_LIKE)}), and {', '.join(needs)} compare completions with one: set "
                        "answer_field to the column that holds it, or use rewards that need none (e.g. format_exact "
                        "or your own file.py:function)")


def epoch_steps(config: Any, base_dir: Path) -> Any:
    """`config` with its `epochs` turned into `num_steps` (each step draws batch_size training rows), said in a
    note; run.json then records the steps."""
    rows = len(load_datasets(config, base_dir)[0])
    steps = max(1, math.ceil(config.epochs * rows / config.batch_size))
    print(f"mlx-grpo: note: epochs: {config.epochs:g} is {steps} steps ({rows} training rows, {config.batch_size} "
          "prompts per step)", file=sys.stderr)
    return dataclasses.replace(config, num_steps=steps, epochs=None)


def extra_columns(rows: list[dict]) -> dict[str, list]:
    """Columns beyond prompt/answer, aligned with rows (missing values become None)."""
    names = sorted({k for row in rows for k in row} - {"prompt", "answer"})
    return {name: [row.get(name) for row in rows] for name in names}


@dataclass
class PromptOrder:
    """Epoch-shuffled order over the training rows, resumable from (epoch, position)."""

    num_rows: int
    seed: int
    epoch: int = 0
    position: int = 0

    def _permutation(self, epoch: int) -> list[int]:
        # Shuffling 20,000 rows costs ~20 ms: once per epoch, not once per step.
        cached = getattr(self, "_cached", None)
        if cached is None or cached[0] != epoch:
            order = list(range(self.num_rows))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._cached = cached = (epoch, order)
        return cached[1]

    def next_indices(self, count: int) -> list[int]:
        """The next `count` rows. The epoch advances as soon as its last row is drawn, so `epoch`
        changes during the step that finishes an epoch (the step that closes it in the metrics)."""
        out: list[int] = []
        while len(out) < count:
            if self.position >= self.num_rows:  # a checkpoint saved at an epoch's end by an older version
                self.epoch, self.position = self.epoch + 1, 0
            out.append(self._permutation(self.epoch)[self.position])
            self.position += 1
            if self.position == self.num_rows:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


@dataclass
class EncodedPrompt:
    tokens: list[int]
    truncated: bool


def render_prompt(tokenizer: Any, text: str, system_prompt: str | None, use_chat_template: bool,
                  messages: list[dict] | None = None, tools: list[dict] | None = None) -> str | list[int]:
    """The prompt as the model sees it: through the chat template when the tokenizer has one. A
    conversational row's `messages` are the conversation itself (the system prompt goes first unless
    the conversation has its own)."""
    conversation = list(messages) if messages else [{"role": "user", "content": text}]
    if system_prompt and conversation[0]["role"] != "system":
        conversation.insert(0, {"role": "system", "content": system_prompt})
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        extra = {"tools": tools} if tools else {}  # the tools' schemas, which the template shows the model
        return tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, **extra)
    return "\n".join(m["content"] for m in conversation)


# No token spans more characters than this: text further left than max_prompt_length tokens of this size
# cannot survive the cut, so it is dropped before tokenizing (a 10 MB prompt would otherwise be tokenized
# whole every time it is drawn).
MAX_CHARS_PER_TOKEN = 64


def encode_prompt(tokenizer: Any, text: str, config: Any, messages: list[dict] | None = None,
                  tools: list[dict] | None = None) -> EncodedPrompt:
    """Token ids of one prompt (or conversation), cut from the left to max_prompt_length."""
    keep_chars = config.max_prompt_length * MAX_CHARS_PER_TOKEN
    if messages is None:
        cut = len(text) > keep_chars
        if cut:
            text = text[-keep_chars:]
    else:  # a conversation loses its oldest text first, to the same budget
        cut = sum(len(m["content"]) for m in messages) > keep_chars
        if cut:
            kept, budget = [], keep_chars
            for message in reversed(messages):
                content = message["content"][-budget:] if budget > 0 else ""
                budget -= len(content)
                kept.append({**message, "content": content})
            messages = kept[::-1]
    rendered = render_prompt(tokenizer, text, config.system_prompt, config.use_chat_template, messages, tools)
    tokens = list(rendered) if not isinstance(rendered, str) else tokenizer.encode(rendered)
    if hasattr(tokens, "get"):  # some tokenizers return a BatchEncoding
        tokens = list(tokens["input_ids"])
    limit = config.max_prompt_length
    if len(tokens) > limit:
        return EncodedPrompt(tokens[-limit:], True)
    return EncodedPrompt(tokens, cut)


def longest_prompt(tokenizer: Any, rows: list[dict], config: Any, exact: int = 64,
                   tools: list[dict] | None = None) -> int:
    """Tokens of the longest prompt among `rows`, encoded as the trainer encodes it (chat template, system
    prompt, cut to max_prompt_length). Every prompt's text is counted in one batch call of the tokenizer;
    the `exact` longest by that count are then encoded exactly."""
    keep_chars = config.max_prompt_length * MAX_CHARS_PER_TOKEN
    # a conversation is cut like a plain prompt: a 10 MB message tokenized whole took gigabytes
    texts = [(_transcript(row["messages"]) if row.get("messages") else row["prompt"])[-keep_chars:] for row in rows]
    counts = [len(ids) for ids in getattr(tokenizer, "_tokenizer", tokenizer)(texts, add_special_tokens=False)["input_ids"]]
    longest = sorted(range(len(rows)), key=counts.__getitem__, reverse=True)[:exact]
    return max((len(encode_prompt(tokenizer, rows[i]["prompt"], config, rows[i].get("messages"), tools).tokens)
                for i in longest), default=0)
