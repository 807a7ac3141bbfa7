"""Rows from a JSONL file, or from one JSON document as pandas writes it, whatever byte-order mark it has."""

from __future__ import annotations

import codecs
import io
import json
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from .rows import _row, answer_column


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

