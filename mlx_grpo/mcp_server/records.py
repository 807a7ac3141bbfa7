"""Bounded reads of a run's JSONL files for an agent: records from the end back, a cursor to page on, each
string and the whole answer cut to size, and the values an agent passes checked."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..common.terminal import terminal_safe, terminal_safe_obj
from ..common.user_files import open_regular
from ..telemetry.rundir.writer import loads_object

MAX_OUTPUT_CHARS = 60_000  # what one tool returns at most: an agent's context is not a log file
MAX_RECORDS = 200  # records one read returns at most; `before` pages back
MAX_STRING_CHARS = 2_000  # a longer string in a record (a completion) is cut
SCAN_BYTES = 16 << 20  # what one read looks at, backward from its cursor
MAX_LINE_BYTES = 4 << 20  # a longer line is skipped (no record of ours is near it)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "\n... (cut)"


def _overrides(overrides: dict[str, Any] | None) -> list[str]:
    # one token each (`--set=KEY=VALUE`): a key an agent writes as '--rubric-file' stays a config key
    return [f"--set={key}={json.dumps(value)}" for key, value in (overrides or {}).items()]


def _plain_values(what: str, values: list[str]) -> list[str]:
    """Values passed on as command-line arguments: none may read as an option (`--rubric-file=x`)."""
    for value in values:
        if not isinstance(value, str) or value.startswith("-"):
            raise UserError(f"{what}: {terminal_safe(str(value))!r} is not a reward name "
                            "(it would be read as an option)")
    return values


def _cut_strings(obj: Any) -> Any:
    """`obj` with every string longer than MAX_STRING_CHARS cut, saying how much was left out."""
    if isinstance(obj, str):
        cut = len(obj) - MAX_STRING_CHARS
        return obj if cut <= 0 else f"{obj[:MAX_STRING_CHARS]}... ({cut} characters cut)"
    if isinstance(obj, dict):
        return {_cut_strings(k): _cut_strings(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cut_strings(v) for v in obj]
    return obj


def tail_records(path: Path, count: int, before: int | None = None) -> tuple[list[tuple[int, dict]], int, int]:
    """Up to the last `count` JSON-object lines of a regular file that start before byte `before` (None: the
    end), read backward in blocks, at most SCAN_BYTES of the file, each with the byte its line starts at,
    oldest first; the byte the scan stopped at (0: the start of the file was reached); and how many lines
    were skipped (not a JSON object, or longer than MAX_LINE_BYTES)."""
    try:
        f = open_regular(path)
    except FileNotFoundError:
        return [], 0, 0
    except OSError as err:
        raise UserError(f"{terminal_safe(str(path))}: {err.strerror or err}; not read") from None
    found: list[tuple[int, dict]] = []
    skipped = 0
    with f:
        size = os.fstat(f.fileno()).st_size
        end = size if before is None else max(0, min(int(before), size))
        pos, carry, skipping = end, b"", False
        while pos > 0 and len(found) < count and end - pos < SCAN_BYTES:
            block = min(1 << 20, pos)
            pos -= block
            f.seek(pos)
            data = f.read(block) + carry
            lines = data.split(b"\n")
            carry = lines[0]
            offset = pos + len(carry) + 1
            starts = []
            for line in lines[1:]:
                starts.append((offset, line))
                offset += len(line) + 1
            if skipping and starts:  # the end of a line too long to read: dropped
                starts.pop()
                skipping = False
                skipped += 1
            for start, line in reversed(starts):
                if start >= end or not line.strip():
                    continue
                obj = _record(line)
                if obj is None:
                    skipped += 1
                    continue
                found.append((start, obj))
                if len(found) == count:
                    break
            if len(carry) > MAX_LINE_BYTES:
                carry, skipping = b"", True
        if pos > 0 and skipping and len(found) < count:  # stopped inside a line too long to read
            skipped += 1
        if pos == 0 and len(found) < count and (carry.strip() or skipping):
            obj = None if skipping else _record(carry)
            if obj is None:
                skipped += 1
            else:
                found.append((0, obj))
        scanned_to = found[-1][0] if len(found) == count else pos
    return found[::-1], scanned_to, skipped


def _record(line: bytes) -> dict | None:
    obj = loads_object(line.strip())
    return None if obj is None else _cut_strings(terminal_safe_obj(obj))


def _page(found: list[tuple[int, dict]], scanned_to: int, skipped: int) -> dict:
    """The reply of a read tool: the records, the oldest dropped until the reply fits MAX_OUTPUT_CHARS, and
    `before`, the cursor that reads the ones before them (None: the file holds nothing earlier)."""
    sizes = [len(json.dumps(record)) + 2 for _, record in found]
    total, first = sum(sizes), 0
    while first < len(found) - 1 and total > MAX_OUTPUT_CHARS:
        total -= sizes[first]
        first += 1
    cursor = found[first][0] if first else scanned_to
    return {"records": [record for _, record in found[first:]], "before": cursor or None,
            **({"skipped_lines": skipped} if skipped else {})}

