"""The dashboard's model: the runs being watched, their standing alerts and smoothed series.

Widgets read from one `Board` (the app owns it and sets its smoothing); nothing here draws.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..telemetry.alerts.alert import LEVELS
from ..telemetry.rundir.reader import RunReader, RunView, pid_alive
from ..telemetry.smoothing import ema
from .downsample import finite_points
from .palette import run_color


def level_rank(level: str) -> int:
    """info < warning < error; a level this version does not know ranks as info."""
    return LEVELS.index(level) if level in LEVELS else 0


class _Smoothed:
    """A metric's finite points and their EMA, extended in place as rows arrive."""

    def __init__(self, stamp: tuple):
        self.stamp = stamp  # (table identity, table epoch, smoothing weight)
        self.rows = 0       # table rows consumed
        self.n = 0          # points kept
        self.buf = np.empty((3, 0))

    def extend(self, steps: np.ndarray, col: np.ndarray, weight: float) -> None:
        if self.rows == len(steps):
            return
        xs, ys = finite_points(steps[self.rows :], col[self.rows :])
        self.rows = len(steps)
        if not len(xs):
            return
        start = float(self.buf[2, self.n - 1]) if self.n else None
        sm = ema(ys, weight, start)
        need = self.n + len(xs)
        if need > self.buf.shape[1]:
            grown = np.empty((3, max(need, 2 * self.buf.shape[1], 1024)))
            grown[:, : self.n] = self.buf[:, : self.n]
            self.buf = grown
        self.buf[0, self.n : need] = xs
        self.buf[1, self.n : need] = ys
        self.buf[2, self.n : need] = sm
        self.n = need

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.buf[0, : self.n], self.buf[1, : self.n], self.buf[2, : self.n]


@dataclass
class Board:
    """The watched runs as the views see them: their tables, alerts, colours and smoothed series."""

    readers: list[RunReader]
    clock: Callable[[], float] = time.time
    alive: Callable[[int], bool] = pid_alive
    smoothing: float = 0.6
    log_scale: bool = False  # charts' y axes in log10 where every value is positive
    # metric -> (level, indices of the runs where an alert on it stands)
    standing: dict[str, tuple[str, set[int]]] = field(default_factory=dict)
    # Bumped whenever any run's data changed; views skip work when it did not.
    generation: int = 0
    # Bumped when the set of runs changes (the run browser): views drop what they kept per run.
    runs_version: int = 0
    # (run index, metric) -> its points and their smoothing: smoothing a 100k-step
    # series costs milliseconds, extending it by one step costs nothing.
    _smooth_cache: dict = field(default_factory=dict)

    @property
    def runs(self) -> list[RunView]:
        """Each watched run's current state."""
        return [r.state for r in self.readers]

    def color(self, index: int) -> str:
        """The colour of run number `index`."""
        return run_color(index)

    def poll(self) -> bool:
        """Read new data from every run; True when something changed."""
        changed = False
        for reader in self.readers:
            changed |= reader.poll()
        if changed:
            self.generation += 1
            self._update_standing()
        return changed

    def replace_readers(self, readers: list[RunReader]) -> None:
        """Watch these runs from now on; readers no longer in the list are closed."""
        for old in self.readers:
            if not any(old is new for new in readers):
                old.close()
        self.readers = readers
        self._smooth_cache.clear()
        self.runs_version += 1
        self.generation += 1
        self._update_standing()

    def _update_standing(self) -> None:
        standing: dict[str, tuple[str, set[int]]] = {}
        for i, run in enumerate(self.runs):
            for metric, level in run.standing_alerts().items():
                old_level, idx = standing.get(metric, ("info", set()))
                idx.add(i)
                best = level if level_rank(level) >= level_rank(old_level) else old_level
                standing[metric] = (best, idx)
        self.standing = standing

    def alert_level(self, metrics: list[str] | tuple[str, ...]) -> str | None:
        """Highest level of a standing alert on any of these metrics, or None."""
        best = None
        for m in metrics:
            hit = self.standing.get(m)
            if hit and (best is None or level_rank(hit[0]) > level_rank(best)):
                best = hit[0]
        return best

    def series(self, run_index: int, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(steps, values, smoothed values) of a metric's logged points, smoothing as set."""
        table = self.runs[run_index].table
        col = table.column(metric)
        if col is None:
            return None
        key = (run_index, metric)
        cached = self._smooth_cache.get(key)
        stamp = (id(table), table.epoch, self.smoothing)
        if cached is None or cached.stamp != stamp or cached.rows > len(table):
            cached = self._smooth_cache[key] = _Smoothed(stamp)
        cached.extend(table.steps, col, self.smoothing)
        return cached.view()

    def available_metrics(self) -> list[str]:
        """Every metric name any run has, in first-seen order."""
        names: dict[str, None] = {}
        for run in self.runs:
            names.update(dict.fromkeys(run.table.names))
        return list(names)

    def close(self) -> None:
        """Close every run reader."""
        for reader in self.readers:
            reader.close()
