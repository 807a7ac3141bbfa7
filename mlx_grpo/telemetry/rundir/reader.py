"""Follow a run directory live: run.json, metrics, samples and alerts.

`RunReader.poll()` reads what the trainer appended since the last poll and
keeps it in a `RunView`. Opening a long run is fast: only the last few MB of
metrics.jsonl are parsed before the first screen; older lines are parsed in
background processes and joined in front as they finish (history_loader.py).

Run states (`RunView.status`), first match wins:

- `waiting`     the directory, or both run.json and metrics.jsonl, do not exist yet.
- `finished`, `interrupted`, `failed`: run.json's `status` says so.
- `crashed`     run.json says `running`, has the writer's `pid` (and `hostname`,
                when given, is this machine) and no process with that pid exists.
                A reused pid can hide a crash; a stall is still noticed then.
- `starting`    running, no metric record yet, and less than STARTUP_GRACE_S since
                `start_time` (model loading, first rollout).
- `stalled`     running and no new metric record for longer than
                max(STALL_FLOOR_S, STALL_FACTOR x the median interval between the
                recent records), or STARTUP_GRACE_S without any record.
- `live`        otherwise.

Imports no mlx.
"""

from __future__ import annotations

import math
import os
import socket
import stat
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...common.errors import UserError
from ..alerts.alert import Alert
from .history_loader import HistoryLoader
from .jsonl_tail import JsonlTail
from .layout import ALERTS, METRICS, SAMPLES, RunPaths
from .metric_table import MetricTable, table_from_records
from .writer import ENDED, RunInfo, read_json_object, read_run_info

STALL_FLOOR_S = 60.0
STALL_FACTOR = 10.0
STARTUP_GRACE_S = 600.0
# Records used for the typical step interval and the ETA's pace.
PACE_WINDOW = 50
# An alert stands (its metric is highlighted) until this many metric records
# have been logged after the step it fired at.
STANDING_RECORDS = 10

# Bytes of metrics.jsonl parsed before the first screen; the rest is history.
TAIL_BYTES = 4 << 20
# History smaller than this is parsed at once instead of in a background process.
SYNC_HISTORY_BYTES = 1 << 20
# Only the recent samples are shown, and alerts are rare: read just their ends.
SAMPLES_TAIL_BYTES = 1 << 20
ALERTS_TAIL_BYTES = 4 << 20
MAX_SAMPLES = 500
MAX_ALERTS = 5000


def pid_alive(pid: int) -> bool:
    """True when a process with this id exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists but belongs to someone else, or cannot tell
    return True


@dataclass
class AlertEntry:
    """An alert read back, and whether the trainer or the dashboard raised it."""

    alert: Alert
    # "run": from alerts.jsonl (the trainer); "dashboard": the same rules
    # evaluated here on the records read, shown only when the file lacks it.
    source: str


@dataclass
class RunView:
    """What is known of one run directory so far: run.json, its metrics as a table, alerts, samples."""

    run_dir: Path
    info: RunInfo | None = None  # None until a run.json was read
    table: MetricTable = field(default_factory=MetricTable)
    samples: deque = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    # Samples ever appended, and times samples.jsonl started over: lets a view
    # add just the new ones (the deque drops the oldest).
    samples_received: int = 0
    samples_resets: int = 0
    alerts: list[AlertEntry] = field(default_factory=list)
    garbage: dict[str, int] = field(default_factory=dict)
    # Fraction of older metric history parsed so far; None when nothing is pending.
    history_progress: float | None = None
    notes: list[str] = field(default_factory=list)
    exists: bool = False

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        """The run's name: run.json's, else the directory's."""
        return (self.info and self.info.name) or self.run_dir.name

    @property
    def total_steps(self) -> int | None:
        """The steps the run means to train, when run.json says."""
        return self.info.total_steps if self.info else None

    @property
    def step(self) -> int | None:
        """The last step with a record, or None."""
        last = self.table.last_step()
        return None if last is None else int(last)

    @property
    def start_time(self) -> float | None:
        """When the run started: run.json's time, else its first record's."""
        if self.info and self.info.start_time is not None:
            return float(self.info.start_time)
        times = self.table.times
        return float(times[0]) if len(times) and times[0] == times[0] else None

    # ------------------------------------------------------------------ pace
    def last_record_time(self) -> float | None:
        """The time of the last record, or None."""
        times = self.table.times
        return float(times[-1]) if len(times) and times[-1] == times[-1] else None

    def step_interval(self) -> float | None:
        """Median seconds between the recent metric records."""
        times = self.table.times[-PACE_WINDOW:]
        gaps = np.diff(times[np.isfinite(times)])
        gaps = gaps[gaps > 0]
        return float(np.median(gaps)) if len(gaps) else None

    def seconds_per_step(self) -> float | None:
        """Recent seconds per step, from the records' times."""
        steps = self.table.steps[-PACE_WINDOW:]
        times = self.table.times[-PACE_WINDOW:]
        ok = np.isfinite(times)
        steps, times = steps[ok], times[ok]
        if len(steps) < 2 or steps[-1] <= steps[0] or times[-1] <= times[0]:
            return None
        return float((times[-1] - times[0]) / (steps[-1] - steps[0]))

    # ------------------------------------------------------------------ derived
    def status(self, now: float, alive: Callable[[int], bool] = pid_alive) -> str:
        """waiting, starting, live, stalled, crashed, or how it ended: from run.json, the records and the
        trainer's process."""
        if not self.exists or (self.info is None and not len(self.table)):
            return "waiting"
        info = self.info or RunInfo()
        if info.ended:
            return info.status
        if info.pid is not None and info.hostname in (None, socket.gethostname()) and not alive(info.pid):
            return "crashed"
        last = self.last_record_time()
        if last is None:
            start = self.start_time
            return "stalled" if start is not None and now - start > STARTUP_GRACE_S else "starting"
        interval = self.step_interval() or 0.0
        limit = max(STALL_FLOOR_S, STALL_FACTOR * interval)
        return "stalled" if now - last > limit else "live"

    def elapsed(self, now: float, status: str) -> float | None:
        """Seconds since the start: to now while running, to the end once ended."""
        start = self.start_time
        if start is None:
            return None
        end = self.info.end_time if self.info else None
        if end is not None:
            return max(0.0, float(end) - start)
        if status in ENDED or status == "crashed":
            last = self.last_record_time()
            return max(0.0, last - start) if last is not None else None
        return max(0.0, now - start)

    def eta(self, status: str) -> float | None:
        """Seconds to `total_steps` at the recent pace; None unless live (a stall has no pace)."""
        if status != "live":
            return None
        total, step, pace = self.total_steps, self.step, self.seconds_per_step()
        if total is None or step is None or pace is None:
            return None
        return max(0, total - step) * pace

    def _standing_since(self) -> float:
        # Fewer than STANDING_RECORDS records after step s  <=>  s >= steps[-STANDING_RECORDS].
        steps = self.table.steps
        return float(steps[-STANDING_RECORDS]) if len(steps) >= STANDING_RECORDS else -math.inf

    def alert_stands(self, alert: Alert) -> bool:
        """True until STANDING_RECORDS metric records were logged after the alert's step."""
        return alert.step >= self._standing_since()

    def standing_alerts(self) -> dict[str, str]:
        """metric -> highest level among its alerts that still stand."""
        since = self._standing_since()
        rank = {"info": 0, "warning": 1, "error": 2}
        out: dict[str, str] = {}
        for entry in reversed(self.alerts):  # sorted by step
            a = entry.alert
            if a.step < since:
                break
            if rank.get(a.level, 0) >= rank.get(out.get(a.metric, "info"), 0):
                out[a.metric] = a.level
        return out

    @property
    def garbage_total(self) -> int:
        """Lines of the run's files that could not be read as records."""
        return sum(self.garbage.values())


class RunReader:
    """Reads one run directory incrementally; `poll()` returns True when anything changed."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        tail_bytes: int = TAIL_BYTES,
        sync_history_bytes: int = SYNC_HISTORY_BYTES,
        history_chunk_bytes: int | None = None,
        replay: Any = None,
    ):
        """`replay`: an analysis/alert_replay.AlertReplay that raises the run's own alerts from the records
        read (the dashboard's); None shows alerts.jsonl alone."""
        self.run_dir = Path(run_dir)
        self.state = RunView(self.run_dir)
        self._chunk_bytes = history_chunk_bytes
        # A little history is cheaper to read at once than to hand to a process.
        self._metrics = JsonlTail(RunPaths(self.run_dir).metrics, initial_tail_bytes=tail_bytes,
                                  min_skip_bytes=sync_history_bytes)
        self._samples = JsonlTail(RunPaths(self.run_dir).samples, initial_tail_bytes=SAMPLES_TAIL_BYTES)
        self._alerts = JsonlTail(RunPaths(self.run_dir).alerts, initial_tail_bytes=ALERTS_TAIL_BYTES)
        self._run_json_key: tuple | None = None
        self._history: HistoryLoader | None = None
        self._rejected = 0
        self._replay = replay
        self._file_alert_keys: set[tuple[str, str, int]] = set()

    # ------------------------------------------------------------------ polling
    def poll(self) -> bool:
        """Read what the run wrote since the last poll; True when anything changed."""
        st = self.state
        st.exists = self.run_dir.is_dir()
        if not st.exists:
            return False
        changed = self._poll_run_json()
        ended = st.info is not None and st.info.ended
        changed |= self._poll_metrics(final=ended)
        changed |= self._poll_samples(final=ended)
        changed |= self._poll_alerts(final=ended)
        for tail in (self._metrics, self._samples, self._alerts):
            if tail.error is not None and tail.error not in st.notes:
                st.notes.append(tail.error)
        st.garbage = {
            METRICS: (self._metrics.garbage_lines + self._rejected
                      + (self._history.garbage_lines if self._history else 0)),
            SAMPLES: self._samples.garbage_lines,
            ALERTS: self._alerts.garbage_lines,
        }
        return changed

    def close(self) -> None:
        """Stop reading (a background history load included)."""
        if self._history is not None:
            self._history.cancel()
            self._history = None

    def _poll_run_json(self) -> bool:
        path = RunPaths(self.run_dir).run_json
        try:
            s = path.stat()
        except OSError:  # missing, or a symlink loop
            return False
        key = (s.st_ino, s.st_size, s.st_mtime_ns)
        if key == self._run_json_key:
            return False
        info = read_json_object(path, display=True)
        if info is None:
            # Written non-atomically and caught mid-write (keep the last good copy, retry next poll), or not
            # a JSON object, or not a regular file (a FIFO, /dev/zero, a directory): said once.
            note = f"{path}: not a readable JSON object, ignored"
            if not stat.S_ISREG(s.st_mode) and note not in self.state.notes:
                self.state.notes.append(note)
            return False
        self._run_json_key = key
        self.state.info = RunInfo.from_dict(info)
        return True

    def _poll_metrics(self, final: bool) -> bool:
        st = self.state
        result = self._metrics.poll(final=final)
        changed = False
        if result.reset:
            self._restart_metrics()
            changed = True
        if result.skipped_to:
            self._start_history(result.skipped_to)
        if result.records:
            newer, rejected = table_from_records(result.records)
            self._rejected += rejected
            st.table.append_table(newer)
            self._replayed(result.records)
            changed = True
        if self._history is not None:
            for chunk in self._history.ready_tables():
                st.table.prepend_table(chunk.table)
                changed = True
            if self._history.error and self._history.error not in st.notes:
                st.notes.append(self._history.error)
            st.history_progress = None if self._history.done else self._history.progress
            if self._history.done:
                self._history = None
        return changed

    def _restart_metrics(self) -> None:
        """metrics.jsonl was truncated or replaced: forget everything derived from it."""
        self.close()
        self.state.table.clear()
        self.state.history_progress = None
        self._rejected = 0
        if self._replay is not None:
            self._replay.restart()
        self.state.alerts = [e for e in self.state.alerts if e.source == "run"]

    def _start_history(self, end: int) -> None:
        st = self.state
        # Alert rules need a run from its first record (baselines, windows): when
        # the start is skipped, alerts.jsonl alone is shown for this run.
        if self._replay is not None:
            self._replay.give_up()
        kwargs = {"chunk_bytes": self._chunk_bytes} if self._chunk_bytes else {}
        self._history = HistoryLoader(self._metrics.path, end, **kwargs)
        st.history_progress = 0.0

    # ------------------------------------------------------------------ alerts
    def _replayed(self, records: list[dict]) -> None:
        if self._replay is None:
            return
        fired, note = self._replay.check(self.state.info.config if self.state.info else {}, records)
        if note is not None:
            self.state.notes.append(note)
        for alert in fired:
            if (alert.rule, alert.metric, alert.step) not in self._file_alert_keys:
                self.state.alerts.append(AlertEntry(alert, "dashboard"))
        if fired:
            self._sort_and_trim_alerts()

    def _poll_alerts(self, final: bool) -> bool:
        result = self._alerts.poll(final=final)
        st = self.state
        if result.reset:
            st.alerts = [e for e in st.alerts if e.source == "dashboard"]
            self._file_alert_keys.clear()
        if not result.records:
            return result.reset
        for rec in result.records:
            alert = Alert.from_dict(rec)
            key = (alert.rule, alert.metric, alert.step)
            self._file_alert_keys.add(key)
            st.alerts.append(AlertEntry(alert, "run"))
        # The trainer's copy wins over the one evaluated here.
        st.alerts = [
            e for e in st.alerts
            if e.source == "run" or (e.alert.rule, e.alert.metric, e.alert.step) not in self._file_alert_keys
        ]
        self._sort_and_trim_alerts()
        return True

    def _sort_and_trim_alerts(self) -> None:
        self.state.alerts.sort(key=lambda e: (e.alert.step, e.alert.time or 0.0))
        if len(self.state.alerts) > MAX_ALERTS:
            del self.state.alerts[: len(self.state.alerts) - MAX_ALERTS]

    def _poll_samples(self, final: bool) -> bool:
        result = self._samples.poll(final=final)
        st = self.state
        if result.reset:
            st.samples.clear()
            st.samples_resets += 1
        new = [r for r in result.records if isinstance(r.get("step"), int)]
        st.samples.extend(new)
        st.samples_received += len(new)
        return bool(result.records) or result.reset


# ---------------------------------------------------------------------- finding runs

def is_run_dir(path: Path) -> bool:
    """True when the folder holds a run.json or a metrics.jsonl."""
    return RunPaths(path).is_run()


def _started(path: Path) -> float:
    info = read_run_info(path, display=True)
    if info is not None and info.start_time is not None:
        return float(info.start_time)
    return path.stat().st_mtime


def newest_run(root: Path) -> Path | None:
    """The most recently started run directory directly under `root`."""
    if not root.is_dir():
        return None
    runs = [p for p in root.iterdir() if p.is_dir() and is_run_dir(p)]
    return max(runs, key=_started) if runs else None


def resolve_run_dirs(paths: list[str], default_root: str = "runs") -> list[Path]:
    """Run directories to watch.

    No path: the newest run under `default_root`. A path holding runs rather than
    being one: its newest run. A path that does not exist yet is kept (the
    dashboard waits for it to appear).
    """
    if not paths:
        newest = newest_run(Path(default_root))
        if newest is None:
            raise UserError(f"no run directory given and no runs under ./{default_root}/; "
                            f"pass RUN_DIR (it may not exist yet; the dashboard waits for it)")
        return [newest]
    out = []
    for raw in paths:
        path = Path(raw)
        if os.path.lexists(path) and not path.is_dir():  # a file, a FIFO, a device, a broken or looping link
            raise UserError(f"{raw}: is not a directory; pass a run directory (the one holding run.json)")
        if path.is_dir() and not is_run_dir(path):
            newest = newest_run(path)
            if newest is not None:
                path = newest
        out.append(path)
    return out

