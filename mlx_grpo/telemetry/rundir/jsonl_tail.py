"""Follow one append-only JSONL file that another process is writing.

The reader keeps a byte offset and reads only what was appended since the last
poll, in one bulk read. It is built for files it does not control:

- a last line without its newline is kept back until the writer finishes it;
- a file that shrank (truncated), was replaced (new inode, e.g. an atomic
  rename), or whose first bytes or the bytes just before the read offset
  changed (rewritten in place; cut back by a resumed run and grown again
  between two polls) is read again from the start, and the caller is told so
  it can drop what it derived;
- a file that does not exist yet is simply empty until it appears;
- lines that are not JSON objects are skipped and counted, never raised;
- what is not a regular file (a directory, a FIFO, /dev/zero, a symlink loop) is not read: `error` says
  why; a file is read in bounded blocks and a line longer than MAX_LINE_BYTES is skipped, so a 4 GB file
  without a newline costs time, not memory;
- strings that hold control characters come back with them made visible (common/terminal.py).

Imports no mlx: the dashboard uses it in environments that only watch runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...common.terminal import json_may_hold_control, terminal_safe_obj
from ...common.user_files import open_regular

# Bytes from the start of the file, and just before the offset, remembered to
# notice a rewrite that left the file at least as long as before.
_HEAD_BYTES = 256
_MARK_BYTES = 64
READ_BLOCK = 16 << 20
MAX_LINE_BYTES = 64 << 20


@dataclass
class TailResult:
    """The records read since the last poll, and whether the file was replaced under the reader."""

    records: list[dict] = field(default_factory=list)
    # True when the file was truncated or replaced: everything read before is stale.
    reset: bool = False
    # Byte offset where reading (re)started when the file was opened with a
    # tail window; lines before it were not read (the caller may load them).
    skipped_to: int = 0


class JsonlTail:
    """Incremental reader of one JSONL file; call `poll()` as often as you like."""

    def __init__(self, path: str | os.PathLike, initial_tail_bytes: int | None = None, min_skip_bytes: int = 0):
        self.path = Path(path)
        # When a file is first seen and is larger than this (by at least
        # min_skip_bytes), start near its end on a line boundary instead of at
        # byte 0; `TailResult.skipped_to` says where.
        self.initial_tail_bytes = initial_tail_bytes
        self.min_skip_bytes = min_skip_bytes
        self.offset = 0
        self.garbage_lines = 0
        self.lines_read = 0
        self._identity: tuple[int, int] | None = None
        self._head = b""
        self._mark = b""
        self._partial = b""
        self._skipping_line = False  # inside a line longer than MAX_LINE_BYTES
        self.error: str | None = None  # why the file cannot be read (not a regular file...), None when it can

    @property
    def pending_partial(self) -> bool:
        """True while a last line without its newline is held back."""
        return bool(self._partial)

    def poll(self, final: bool = False) -> TailResult:
        """Read whatever was appended since the last call.

        `final=True` says the writer is done: a last line that never got its
        newline is parsed anyway if it is a complete JSON object.
        """
        result = TailResult()
        try:
            f = open_regular(self.path)
        except FileNotFoundError:
            self.error = None
            return result
        except OSError as err:
            self.error = f"{self.path.name}: {err.strerror or err}, not read"
            return result
        self.error = None
        with f:
            st = os.fstat(f.fileno())
            identity = (st.st_dev, st.st_ino)
            if self._identity is not None and self._is_stale(f, identity, st.st_size):
                self._forget()
                result.reset = True
            if self._identity is None:
                self._identity = identity
                tail = self.initial_tail_bytes
                if tail is not None and st.st_size - tail > max(0, self.min_skip_bytes):
                    self.offset = line_start_at_or_after(f, st.st_size - self.initial_tail_bytes)
                    result.skipped_to = self.offset
            if st.st_size > self.offset:
                f.seek(self.offset)
                while self.offset < st.st_size and (data := f.read(min(READ_BLOCK, st.st_size - self.offset))):
                    self.offset += len(data)
                    result.records.extend(self._parse(data))
                self._remember_head(f)
                self._mark = self._read_mark(f)
        if final and self._partial:
            tail, self._partial = self._partial, b""
            result.records.extend(self._parse_lines([tail]))
        return result

    def _is_stale(self, f, identity: tuple[int, int], size: int) -> bool:
        if identity != self._identity or size < self.offset:
            return True
        if self._head:
            f.seek(0)
            if f.read(len(self._head)) != self._head:
                return True
        return bool(self._mark) and self._read_mark(f) != self._mark

    def _read_mark(self, f) -> bytes:
        start = max(0, self.offset - _MARK_BYTES)
        f.seek(start)
        return f.read(self.offset - start)

    def _remember_head(self, f) -> None:
        if len(self._head) < _HEAD_BYTES:
            f.seek(0)
            self._head = f.read(min(_HEAD_BYTES, self.offset))

    def _forget(self) -> None:
        self.offset = 0
        self._identity = None
        self._head = b""
        self._mark = b""
        self._partial = b""
        self._skipping_line = False

    def _parse(self, data: bytes) -> list[dict]:
        if self._skipping_line:
            newline = data.find(b"\n")
            if newline < 0:
                return []
            data, self._skipping_line = data[newline + 1:], False
        lines = (self._partial + data).split(b"\n")
        # The element after the last newline is an unfinished line (or b"").
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial, self._skipping_line = b"", True
            self.garbage_lines += 1
        return self._parse_lines(lines)

    def _parse_lines(self, lines: list[bytes]) -> list[dict]:
        records = []
        loads = json.loads
        for line in lines:
            if not line.strip():
                continue
            self.lines_read += 1
            try:
                obj = loads(line)
            except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep to parse
                self.garbage_lines += 1
                continue
            if isinstance(obj, dict):
                # Every record shown by the dashboard, report and compare passes here: no raw escapes.
                records.append(terminal_safe_obj(obj) if json_may_hold_control(line) else obj)
            else:
                self.garbage_lines += 1
        return records


def line_start_at_or_after(f, pos: int) -> int:
    """Offset of the first line that starts at or after `pos`."""
    if pos <= 0:
        return 0
    f.seek(pos - 1)
    while True:
        block = f.read(65536)
        if not block:
            return f.tell()
        newline = block.find(b"\n")
        if newline >= 0:
            return f.tell() - len(block) + newline + 1
