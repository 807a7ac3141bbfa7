"""Write a run directory (format: docs/RUN_DIRECTORY.md). Imports no mlx.

Public API:

- `RunInfo`: run.json as a dataclass, the one place its keys are named. `RunInfo.from_dict(obj)` takes
  anything (a partial file, wrong types, not a dict) and never raises: a value of the wrong type is
  left at its default, keys it does not know are kept in `extra`; `to_dict()` is the on-disk layout.
  `Resume` is one entry of its `resumes` list.
- `read_run_info(run_dir) -> RunInfo | None` (None: no run.json, or not a JSON object) and
  `write_run_info(run_dir, info)` (atomic): every reader and writer of run.json goes through these.
- `new_run_info(run_dir, name, config, versions, device, total_steps, run_id=None, resume_step=None)`: the
  RunInfo a session starts with (`status: running`, the writer's `pid` and `hostname`, the config scrubbed of
  secrets); a resume (`resume_step`) keeps the existing run.json's `run_id`, `start_time` and unknown keys and
  appends a `Resume`.
- `RunDirWriter(path, fsync=False)`: the run directory's sink (events.py): `Start` creates the directory and
  writes run.json; `Scalars` one metrics.jsonl line `{"step", "time", ...metrics}`; `Samples` one
  samples.jsonl line per row; `AlertEvent` one alerts.jsonl line; `Final` final_metrics.json (atomic);
  `close(status)` rewrites run.json with `status` and `end_time` (atomic; on a full disk, in place).
  Each JSONL line is written with one `write` and flushed (and fsynced when `fsync=True`), so a
  reader sees whole lines except, at worst, a partial last one.
  A full disk: `Start` sets aside RESERVE_BYTES (`.reserve`); a write that fails is cut back to where it
  began (no torn line), the reserve is freed and the write tried once more. When that works,
  `out_of_space` names the file, so the trainer can checkpoint and stop with every step written; when it
  does not, `RunDirWriteError` (a UserError) says which file could not be written.
- `json_safe(obj)`: a copy with NaN/Inf as None and numpy scalars/arrays as plain Python.
- `atomic_write_text(path, text)`, `atomic_write_json(path, obj)`: temp file in the same directory, then `os.replace`.

JSON stays valid: a non-finite number (or None) becomes null, "there was something to measure but no
finite value"; a metric that does not apply is absent from the record.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import tempfile
import time as _time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ...common.errors import UserError
from ...common.secrets import scrub_secrets
from ...common.terminal import terminal_safe_obj
from ...common.user_files import read_regular_bytes
from ..events import AlertEvent, Final, Samples, Scalars, Sink, Start
from .layout import RunPaths

SCHEMA_VERSION = 1
STATUSES = ("running", "finished", "interrupted", "failed")
ENDED = STATUSES[1:]

SAMPLE_TEXT_LIMIT = 20_000  # characters of a prompt or completion kept in samples.jsonl


def clipped_text(value: Any) -> Any:
    """Sample text cut to SAMPLE_TEXT_LIMIT: a 10 MB prompt would otherwise be stored in every line it
    appears in, and slow every reader of samples.jsonl."""
    if isinstance(value, str) and len(value) > SAMPLE_TEXT_LIMIT:
        return value[:SAMPLE_TEXT_LIMIT] + f" [... {len(value) - SAMPLE_TEXT_LIMIT} more characters]"
    return value


def loads_object(data: bytes | str, display: bool = False) -> dict | None:
    """A JSON object from untrusted bytes, or None for anything else: not JSON, not UTF-8, nested too
    deep for the parser (a RecursionError, not a ValueError), or not an object. Every reader of a run
    directory parses through this, so no file content can crash one. `display`: for a reader that
    prints what it read, control characters in strings are made visible (common/terminal.py)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    return terminal_safe_obj(obj) if display else obj


MAX_JSON_FILE_BYTES = 64 << 20  # run.json, final_metrics.json, state.json: ours are a few KB


def read_json_object(path: Path, display: bool = False) -> dict | None:
    """`loads_object` of a file's bytes; None when it cannot be read, is not a regular file (a FIFO,
    /dev/zero, a directory, a symlink loop) or is larger than MAX_JSON_FILE_BYTES."""
    try:
        data = read_regular_bytes(path, MAX_JSON_FILE_BYTES + 1)
    except OSError:
        return None
    return loads_object(data, display) if len(data) <= MAX_JSON_FILE_BYTES else None


def json_safe(obj: Any) -> Any:
    """`obj` with non-finite floats as None and numpy values as plain Python ones."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def dumps_line(obj: Any) -> str:
    """One JSON line of `obj` as `json_safe` makes it. Most records are plain already: they are dumped as they
    are, and only one that JSON refuses (a NaN, a numpy value, a Path) is made safe first (a step's
    completions dump in 1.75 ms instead of 3.0 for 120 rows of a thinking run)."""
    try:
        return json.dumps(obj, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        return json.dumps(json_safe(obj), allow_nan=False, ensure_ascii=False)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temp file in the same directory, then `os.replace`: readers see the old file or the new."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; run files are read by other tools (and users)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as JSON so that a reader sees the old file or the new one, never a part."""
    atomic_write_text(path, json.dumps(json_safe(obj), allow_nan=False, ensure_ascii=False, indent=2) + "\n")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _timestamp(value: Any) -> float | None:
    # json.loads accepts NaN, Infinity and ints too large for a float: none of them is a time.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:
        return None


def _pid(value: Any) -> int | None:
    # os.kill and psutil raise OverflowError, not OSError, on a number no process id can be.
    pid = _int(value)
    return pid if pid is not None and 0 < pid < 2**31 else None


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


@dataclass
class Resume:
    """One `mlx-grpo train --resume` of a run: when, from which checkpoint step, what run.json said before."""

    time: float | None = None
    step: int | None = None
    previous_status: str | None = None

    @classmethod
    def from_dict(cls, obj: Any) -> "Resume":
        """Read a resume entry of run.json, keeping what it can."""
        obj = obj if isinstance(obj, dict) else {}
        return cls(_timestamp(obj.get("time")), _int(obj.get("step")), _str(obj.get("previous_status")))


@dataclass
class RunInfo:
    """run.json (docs/RUN_DIRECTORY.md). None (and {} for the mappings) means the file does not say."""

    schema_version: int = SCHEMA_VERSION
    run_id: str | None = None
    name: str | None = None
    start_time: float | None = None  # Unix seconds, of the first session
    end_time: float | None = None  # None while running
    status: str | None = None  # one of STATUSES when the trainer wrote it
    pid: int | None = None  # the writing process, so a reader can tell a crash from a slow step
    hostname: str | None = None
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config, free-form
    versions: dict[str, Any] = field(default_factory=dict)  # package -> version
    device: dict[str, Any] = field(default_factory=dict)  # backend, chip, memory, BLAS, dtype, world_size...
    total_steps: int | None = None  # positive, or None
    resumes: list[Resume] = field(default_factory=list)  # the file has the key only after a resume
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as they are

    @classmethod
    def from_dict(cls, obj: Any) -> "RunInfo":
        """Read run.json's mapping, tolerant of missing and unknown keys (kept in `extra`)."""
        if not isinstance(obj, dict):
            return cls()
        total = _int(obj.get("total_steps"))
        resumes = obj.get("resumes")
        schema = _int(obj.get("schema_version"))
        return cls(
            schema_version=SCHEMA_VERSION if schema is None else schema,
            run_id=_str(obj.get("run_id")),
            name=_str(obj.get("name")),
            start_time=_timestamp(obj.get("start_time")),
            end_time=_timestamp(obj.get("end_time")),
            status=_str(obj.get("status")),
            pid=_pid(obj.get("pid")),
            hostname=_str(obj.get("hostname")),
            config=_mapping(obj.get("config")),
            versions=_mapping(obj.get("versions")),
            device=_mapping(obj.get("device")),
            total_steps=total if total is not None and total > 0 else None,
            resumes=[Resume.from_dict(r) for r in resumes if isinstance(r, dict)] if isinstance(resumes, list) else [],
            extra={k: v for k, v in obj.items() if k not in _KNOWN_KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        """The on-disk layout: every field in this order, `resumes` only once there is one, then `extra`."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("resumes", "extra")}
        if self.resumes:
            out["resumes"] = [asdict(r) for r in self.resumes]
        return {**out, **{k: v for k, v in self.extra.items() if k not in _KNOWN_KEYS}}

    def run_fields(self) -> dict[str, Any]:
        """The top-level fields as on disk, without the config, versions and device mappings."""
        return {k: v for k, v in self.to_dict().items() if k not in ("config", "versions", "device")}

    @property
    def ended(self) -> bool:
        """True once the run finished, stopped or failed."""
        return self.status in ENDED

    @property
    def world_size(self) -> int:
        """Data-parallel processes that trained the run (the device section's `world_size`, else 1)."""
        size = _int(self.device.get("world_size"))
        return size if size is not None and size >= 1 else 1

    @property
    def last_session_start(self) -> float | None:
        """When the latest session began: the latest resume's time, else `start_time`."""
        times = [t for t in (self.start_time, *(r.time for r in self.resumes)) if t is not None]
        return max(times, default=None)


_KNOWN_KEYS = frozenset(f.name for f in fields(RunInfo)) - {"extra"}


def read_run_info(run_dir: str | os.PathLike, display: bool = False) -> RunInfo | None:
    """run.json of a run directory; None when it is missing, unreadable or not a JSON object.
    `display`: for printing (control characters made visible); a resume reads it as written."""
    obj = read_json_object(RunPaths(run_dir).run_json, display)
    return None if obj is None else RunInfo.from_dict(obj)


def write_run_info(run_dir: str | os.PathLike, info: RunInfo) -> None:
    """Write run.json atomically."""
    atomic_write_json(RunPaths(run_dir).run_json, info.to_dict())


RESERVE_BYTES = 4 << 20  # room for the last records, run.json and final_metrics.json once the disk is full


class RunDirWriteError(UserError):
    """A file of the run directory could not be written (a full or read-only disk)."""


def new_run_info(run_dir: str | os.PathLike, name: str, config: Mapping[str, Any],
                 versions: Mapping[str, Any] | None = None, device: Mapping[str, Any] | None = None,
                 total_steps: int | None = None, run_id: str | None = None,
                 resume_step: int | None = None) -> RunInfo:
    """The RunInfo a starting session writes (`status: running`, plus the writer's `pid` and `hostname` so a
    reader can tell a crash from a slow step; the config with its secrets scrubbed). `resume_step` (the
    checkpoint step a resumed run continues from, 0 when it starts over) keeps the existing run.json's
    `run_id`, `start_time` and the keys it does not know, and appends a `Resume` to its `resumes` list."""
    now = _time.time()
    # A resume continues the run.json the interrupted session left (none when it is missing or unreadable).
    previous = (read_run_info(run_dir) if resume_step is not None else None) or RunInfo()
    info = RunInfo(run_id=previous.run_id or run_id or uuid.uuid4().hex[:12], name=name,
                   start_time=now if previous.start_time is None else previous.start_time, status="running",
                   pid=os.getpid(), hostname=socket.gethostname(), config=scrub_secrets(dict(config)),
                   versions=dict(versions or {}), device=dict(device or {}), total_steps=total_steps,
                   extra=previous.extra)  # keys a later version wrote stay
    if resume_step is not None:
        info.resumes = [*previous.resumes, Resume(now, resume_step, previous.status)]
    return info


class RunDirWriter(Sink):
    """The run directory's sink: run.json (Start, and the status at close), metrics.jsonl (Scalars),
    samples.jsonl (Samples), alerts.jsonl (AlertEvent), final_metrics.json (Final)."""

    name = "run directory"

    def __init__(self, path: str | os.PathLike, fsync: bool = False):
        self.path = Path(path)
        self.paths = RunPaths(path)
        self.fsync = fsync
        self.info: RunInfo | None = None
        self._files: dict[str, Any] = {}
        self.out_of_space: str | None = None  # set when a write needed the reserve: stop soon

    def handle(self, event: Any) -> None:
        """Write what the run directory keeps of the event."""
        if isinstance(event, Start):
            self._start(event.info)
        elif isinstance(event, Scalars):
            record = {"step": int(event.step), "time": _time.time() if event.time is None else event.time,
                      **event.values}
            self._append(self.paths.metrics, [dumps_line(record)])
        elif isinstance(event, Samples) and event.rows:
            now = _time.time() if event.time is None else event.time
            self._append(self.paths.samples, [dumps_line({"step": int(event.step), "time": now, **row})
                                              for row in event.rows])
        elif isinstance(event, AlertEvent):
            self._append(self.paths.alerts, [dumps_line({"time": _time.time(), **event.record})])
        elif isinstance(event, Final):
            self._final(event.metrics)

    def _make_reserve(self) -> None:
        path = self.paths.reserve
        try:
            with open(path, "wb") as f:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)  # real blocks, not a sparse file
                else:
                    f.write(bytes(RESERVE_BYTES))
        except OSError:  # no room even for this: the first full write stops the run at once
            path.unlink(missing_ok=True)

    def _free_reserve(self) -> bool:
        try:
            self.paths.reserve.unlink()
        except OSError:
            return False
        return True

    def _start(self, info: RunInfo) -> None:
        """Create the directory, write run.json and set the reserve aside."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.info = info
        write_run_info(self.path, info)
        self._make_reserve()

    def _append(self, path: Path, lines: Iterable[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        try:
            self._append_bytes(path, data)
        except OSError as err:
            if not self._free_reserve():
                raise RunDirWriteError(f"{path}: cannot be written ({err.strerror or err})") from None
            try:
                self._append_bytes(path, data)
            except OSError as err2:
                raise RunDirWriteError(f"{path}: cannot be written ({err2.strerror or err2})") from None
            self.out_of_space = f"{path.name}: {err.strerror or err}"

    def _append_bytes(self, path: Path, data: bytes) -> None:
        f = self._files.get(path.name)
        if f is None:
            f = self._files[path.name] = open(path, "ab", buffering=0)
        start = f.seek(0, os.SEEK_END)
        try:
            # One write per call: the lines land together, and a reader never sees half a record in the middle.
            written = 0
            while written < len(data):
                written += f.write(data[written:])
            if self.fsync:
                os.fsync(f.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                f.truncate(start)  # no torn line: the file ends where this write began
            raise

    def _final(self, metrics: Mapping[str, Any]) -> None:
        """Write final_metrics.json."""
        try:
            atomic_write_json(self.paths.final_metrics, metrics)
        except OSError as err:
            self._free_reserve()
            raise RunDirWriteError(f"{self.paths.final_metrics}: cannot be written ({err.strerror or err})") from None

    def close(self, status: str = "finished") -> None:
        """Close the files and record how the run ended in run.json."""
        if status not in ENDED:
            raise ValueError(f"status must be one of {ENDED}, got {status!r}")
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self.info is not None:
            self.info.status, self.info.end_time = status, _time.time()
            text = json.dumps(json_safe(self.info.to_dict()), allow_nan=False, ensure_ascii=False, indent=2) + "\n"
            try:
                atomic_write_text(self.paths.run_json, text)
            except OSError as err:
                # A full disk has no room for the temp copy; the old run.json's blocks hold the new one.
                try:
                    with open(self.paths.run_json, "r+b") as f:
                        f.write(text.encode("utf-8"))
                        f.truncate()
                except OSError:
                    raise RunDirWriteError(f"{self.paths.run_json}: cannot be written "
                                           f"({err.strerror or err}); it still says 'running'") from None
        self._free_reserve()
