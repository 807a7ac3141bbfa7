"""Rows through Hugging Face `datasets` (the `data` extra): local .parquet and .csv files and Hub datasets."""

from __future__ import annotations

import codecs
import contextlib
import logging
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..common.errors import UserError, install_hint
from .rows import _row, answer_column

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
