"""Load the older part of a long metrics.jsonl without blocking the dashboard.

Parsing JSON is the whole cost of opening a run: ~100 us per line of ~100
metrics, so 100,000 steps are ~10 s of CPU. The dashboard therefore reads the
last few MB itself (first screen in a fraction of a second) and hands the bytes
before them to worker processes in chunks, newest chunk first, joining each
finished chunk in front of what it has.

Workers are plain `python -m mlx_grpo.telemetry.rundir.history_loader` subprocesses
that write their columns to an .npz file: not threads, whose parsing would hold
the GIL and stall the UI, and not multiprocessing, which re-imports the
caller's __main__ and trips over Textual's replaced stderr. They run at lower
priority because the trainer may be using the same CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...common.terminal import json_may_hold_control, terminal_safe_obj
from .jsonl_tail import line_start_at_or_after
from .metric_table import MetricTable, table_from_records

CHUNK_BYTES = 32 << 20
# The package root, so a worker finds mlx_grpo even when it is not installed.
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])


@dataclass
class ChunkResult:
    """The records of one chunk of metrics.jsonl as a table, and how many lines were not records."""

    table: MetricTable
    garbage_lines: int


try:  # optional: orjson parses a metrics line several times faster than json.loads (not a dependency)
    import orjson
except ImportError:
    orjson = None


def _loads(line: bytes):
    """One JSON line: orjson when installed, else (and for what orjson refuses: NaN/Infinity tokens that
    other writers put in JSONL, which json.loads reads) the standard library. orjson reads an integer beyond
    64 bits as a float: the metric table holds floats anyway."""
    if orjson is not None:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    return json.loads(line)


def parse_range(path: str, start: int, end: int) -> ChunkResult:
    """Parse the lines in bytes [start, end) of a JSONL file (both on line starts)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    records = []
    garbage = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = _loads(line)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep to parse
            garbage += 1
            continue
        if isinstance(obj, dict):
            records.append(terminal_safe_obj(obj) if json_may_hold_control(line) else obj)
        else:
            garbage += 1
    table, rejected = table_from_records(records)
    return ChunkResult(table, garbage + rejected)


def save_chunk(result: ChunkResult, out: str) -> None:
    """Write a chunk's table where the parent process will find it (atomically)."""
    t = result.table
    names = t.names
    values = np.stack([t.column(n) for n in names]) if names else np.empty((0, len(t)))
    tmp = out + ".tmp.npz"
    np.savez(tmp, steps=t.steps, times=t.times, values=values,
             names=np.array(json.dumps(names)), garbage=np.array(result.garbage_lines))
    os.replace(tmp, out)  # the parent sees the file only when it is complete


def load_chunk(path: str) -> ChunkResult:
    """Read back a chunk saved by save_chunk."""
    with np.load(path) as z:
        names = json.loads(str(z["names"]))
        table = MetricTable.from_columns(z["steps"], z["times"], dict(zip(names, z["values"])))
        return ChunkResult(table, int(z["garbage"]))


@dataclass
class _Job:
    start: int
    end: int
    out: str
    proc: subprocess.Popen | None = None


class HistoryLoader:
    """Parses bytes [0, end) of a file in background processes, newest chunk first."""

    def __init__(self, path: str | os.PathLike, end: int, chunk_bytes: int = CHUNK_BYTES,
                 workers: int | None = None):
        self.path = Path(path)
        self.end = end
        self.garbage_lines = 0
        self.bytes_done = 0
        self.error: str | None = None
        # Half the cores: on a laptop watching its own training run the trainer keeps the rest.
        self.workers = workers or max(1, min(4, (os.cpu_count() or 2) // 2))
        self._dir = tempfile.mkdtemp(prefix="mlx_grpo_history_")
        bounds = _chunk_bounds(self.path, end, chunk_bytes)
        # Newest first, so the chart fills leftwards from what is already shown.
        ranges = list(reversed(list(zip(bounds[:-1], bounds[1:]))))
        self._jobs = [_Job(a, b, os.path.join(self._dir, f"chunk{i}.npz")) for i, (a, b) in enumerate(ranges)]
        self._next = 0     # first job not started
        self._merged = 0   # jobs handed out by ready_tables
        self._launch()

    @property
    def done(self) -> bool:
        """True once every chunk has been read and merged."""
        return self._merged == len(self._jobs)

    @property
    def progress(self) -> float:
        """Share of the file read so far, 0 to 1."""
        return self.bytes_done / self.end if self.end else 1.0

    def _launch(self) -> None:
        running = sum(1 for j in self._jobs[self._merged : self._next] if j.proc and j.proc.poll() is None)
        pythonpath = os.pathsep.join(filter(None, (_PACKAGE_PARENT, os.environ.get("PYTHONPATH"))))
        env = {**os.environ, "PYTHONPATH": pythonpath}
        while running < self.workers and self._next < len(self._jobs):
            job = self._jobs[self._next]
            job.proc = subprocess.Popen(
                [sys.executable, "-m", "mlx_grpo.telemetry.rundir.history_loader", str(self.path),
                 str(job.start), str(job.end), job.out],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
            )
            self._next += 1
            running += 1

    def ready_tables(self) -> list[ChunkResult]:
        """Finished chunks that join what is already merged, newest first; never blocks."""
        out = []
        while self._merged < self._next:
            job = self._jobs[self._merged]
            code = job.proc.poll() if job.proc else None
            if code is None:
                break
            self._merged += 1
            self.bytes_done += job.end - job.start
            err = job.proc.stderr.read().decode(errors="replace").strip() if job.proc.stderr else ""
            if job.proc.stderr:
                job.proc.stderr.close()
            if code != 0 or not os.path.exists(job.out):
                # A vanished file is noticed (and reloaded) by the tail reader.
                last = err.splitlines()[-1] if err else f"exit code {code}"
                self.error = f"history bytes {job.start}-{job.end} not loaded: {last}"
                continue
            result = load_chunk(job.out)
            os.unlink(job.out)
            self.garbage_lines += result.garbage_lines
            out.append(result)
            self._launch()
        if self.done:
            self.cancel()
        return out

    def cancel(self) -> None:
        """Stop the workers and remove their files."""
        for job in self._jobs:
            if job.proc is not None:
                if job.proc.poll() is None:
                    job.proc.kill()
                    job.proc.wait()
                if job.proc.stderr and not job.proc.stderr.closed:
                    job.proc.stderr.close()
        self._merged = self._next = len(self._jobs)
        shutil.rmtree(self._dir, ignore_errors=True)


def _chunk_bounds(path: Path, end: int, chunk_bytes: int) -> list[int]:
    bounds = [0]
    with open(path, "rb") as f:
        while bounds[-1] < end:
            nxt = line_start_at_or_after(f, bounds[-1] + chunk_bytes)
            bounds.append(min(nxt, end) if nxt > bounds[-1] else end)
    return bounds


def _worker(argv: list[str]) -> int:
    path, start, end, out = argv
    try:
        os.nice(10)
    except (AttributeError, OSError):
        pass
    save_chunk(parse_range(path, int(start), int(end)), out)
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
