"""Load the older part of a long metrics.jsonl without blocking the dashboard.

Parsing JSON is the whole cost of opening a run: ~100 us per line of ~100
metrics, so 100,000 steps are ~10 s of CPU. The dashboard therefore reads the
last few MB itself (first screen in a fraction of a second) and hands the bytes
before them to worker processes in chunks, newest chunk first, merging each
finished chunk in front of what it has. Processes, not threads: the parse would
hold the GIL and stall the UI. Workers run at lower priority because the
trainer may be using the same CPU.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path

from .jsonl_tail import line_start_at_or_after
from .metric_table import MetricTable, table_from_records

CHUNK_BYTES = 32 << 20

_executor: cf.ProcessPoolExecutor | None = None


@dataclass
class ChunkResult:
    table: MetricTable
    garbage_lines: int


def parse_range(path: str, start: int, end: int) -> ChunkResult:
    """Parse the lines in bytes [start, end) of a JSONL file (both on line starts)."""
    import json

    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    records = []
    garbage = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            garbage += 1
            continue
        if isinstance(obj, dict):
            records.append(obj)
        else:
            garbage += 1
    table, rejected = table_from_records(records)
    return ChunkResult(table, garbage + rejected)


def _lower_priority() -> None:
    try:
        os.nice(10)
    except (AttributeError, OSError):
        pass


def _shared_executor() -> cf.ProcessPoolExecutor:
    global _executor
    if _executor is None:
        # Half the cores: on a laptop watching its own training run the trainer keeps the rest.
        workers = max(1, min(4, (os.cpu_count() or 2) // 2))
        _executor = cf.ProcessPoolExecutor(
            max_workers=workers,
            # spawn: forking a process that runs an asyncio UI with threads is unsafe.
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_lower_priority,
        )
    return _executor


def _drop_broken_executor() -> None:
    global _executor
    if _executor is not None and getattr(_executor, "_broken", False):
        _executor = None


class HistoryLoader:
    """Parses bytes [0, end) of a file in the background, newest chunk first."""

    def __init__(self, path: str | os.PathLike, end: int, chunk_bytes: int = CHUNK_BYTES):
        self.path = Path(path)
        self.end = end
        self.garbage_lines = 0
        bounds = _chunk_bounds(self.path, end, chunk_bytes)
        # Newest first, so the chart fills leftwards from what is already shown.
        self._ranges = list(reversed(list(zip(bounds[:-1], bounds[1:]))))
        executor = _shared_executor()
        self._futures = [executor.submit(parse_range, str(self.path), a, b) for a, b in self._ranges]
        self._merged = 0
        self.bytes_done = 0
        self.error: str | None = None

    @property
    def done(self) -> bool:
        return self._merged == len(self._futures)

    @property
    def progress(self) -> float:
        return self.bytes_done / self.end if self.end else 1.0

    def ready_tables(self) -> list[ChunkResult]:
        """Finished chunks that join what is already merged, newest first; never blocks."""
        out = []
        while self._merged < len(self._futures) and self._futures[self._merged].done():
            future = self._futures[self._merged]
            a, b = self._ranges[self._merged]
            self._merged += 1
            self.bytes_done += b - a
            try:
                result = future.result()
            except (OSError, cf.process.BrokenProcessPool) as err:
                # A vanished file is noticed (and reloaded) by the tail reader;
                # a dead pool is rebuilt for the next loader.
                self.error = f"history chunk {a}-{b}: {err}"
                _drop_broken_executor()
                continue
            self.garbage_lines += result.garbage_lines
            out.append(result)
        return out

    def cancel(self) -> None:
        for future in self._futures:
            future.cancel()
        self._merged = len(self._futures)


def _chunk_bounds(path: Path, end: int, chunk_bytes: int) -> list[int]:
    bounds = [0]
    with open(path, "rb") as f:
        while bounds[-1] < end:
            nxt = line_start_at_or_after(f, bounds[-1] + chunk_bytes)
            bounds.append(min(nxt, end) if nxt > bounds[-1] else end)
    return bounds
