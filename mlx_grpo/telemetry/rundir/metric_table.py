"""Metric records of one run held as compact columns.

One float64 array of steps, one of times, and one float64 array per metric, all
the same length; a metric missing from a record (or null, or not a finite
number) is NaN in its column. 100,000 steps of ~100 metrics take ~80 MB and a
column can be handed to numpy without copying.

Steps are kept strictly increasing. A record whose step is not greater than the
last one means the writer went back (a run resumed from an earlier checkpoint
logs those steps again): rows from that step on are dropped and the new ones
take their place, so every chart shows one value per step, the latest written.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from ..metrics.other_names import canonical_record

STEP = "step"
TIME = "time"
# Steps are stored as float64, exact up to 2**53.
_MAX_STEP = 2**53


class MetricTable:
    """A run's metrics as columns: steps, times and one float array per name (NaN where missing)."""

    def __init__(self) -> None:
        self._n = 0
        self._cap = 0
        self._steps = np.empty(0)
        self._times = np.empty(0)
        self._cols: dict[str, np.ndarray] = {}
        # Bumped on every change; charts cache their drawing per version.
        self.version = 0
        # Bumped when rows are removed or inserted before existing ones, so
        # incremental caches (running smoothing) know to start over.
        self.epoch = 0
        self._ranges: dict[str, tuple[int, int, float, float]] = {}

    @classmethod
    def from_columns(cls, steps: np.ndarray, times: np.ndarray, columns: dict[str, np.ndarray]) -> "MetricTable":
        """A table over existing arrays (strictly increasing steps), without copying them."""
        table = cls()
        table._n = table._cap = len(steps)
        table._steps = np.asarray(steps, dtype=np.float64)
        table._times = np.asarray(times, dtype=np.float64)
        table._cols = {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}
        table.version = 1
        return table

    def __len__(self) -> int:
        return self._n

    @property
    def steps(self) -> np.ndarray:
        """The step of each row."""
        return self._steps[: self._n]

    @property
    def times(self) -> np.ndarray:
        """The wall-clock time of each row."""
        return self._times[: self._n]

    @property
    def names(self) -> list[str]:
        """The metric names, in first-seen order."""
        return list(self._cols)

    def column(self, name: str) -> np.ndarray | None:
        """The values of one metric, a row each (None when no row has it)."""
        col = self._cols.get(name)
        return None if col is None else col[: self._n]

    def last_step(self) -> float | None:
        """The step of the last row, or None for an empty table."""
        return float(self._steps[self._n - 1]) if self._n else None

    def last_value(self, name: str) -> float | None:
        """The most recent finite value of a metric (not just of the last row)."""
        col = self.column(name)
        if col is None:
            return None
        # Most metrics are present in the last row; sparse ones (eval) need a scan back.
        for i in range(self._n - 1, -1, -1):
            v = col[i]
            if v == v:
                return float(v)
        return None

    def column_range(self, name: str) -> tuple[float, float] | None:
        """(min, max) of a metric's values, updated from the rows added since the last call."""
        col = self.column(name)
        if col is None:
            return None
        epoch, done, lo, hi = self._ranges.get(name, (self.epoch, 0, np.inf, -np.inf))
        if epoch != self.epoch:
            done, lo, hi = 0, np.inf, -np.inf
        new = col[done:]
        if len(new):
            finite = new[np.isfinite(new)]
            if len(finite):
                lo, hi = min(lo, float(finite.min())), max(hi, float(finite.max()))
        self._ranges[name] = (self.epoch, self._n, lo, hi)
        return (lo, hi) if lo <= hi else None

    def clear(self) -> None:
        """Drop every row (the file was replaced)."""
        # Counters keep counting up, so caches keyed on them see the change.
        version, epoch = self.version + 1, self.epoch + 1
        self.__init__()
        self.version, self.epoch = version, epoch

    def append_table(self, newer: "MetricTable") -> None:
        """Add rows logged after ours (rewinding first if `newer` starts at or before our end)."""
        if not len(newer):
            return
        first = newer.steps[0]
        if self._n and first <= self._steps[self._n - 1]:
            self._n = int(np.searchsorted(self.steps, first, side="left"))
            self.epoch += 1
        start = self._n
        self._reserve(start + len(newer))
        self._steps[start : start + len(newer)] = newer.steps
        self._times[start : start + len(newer)] = newer.times
        for name in newer._cols:
            if name not in self._cols:
                self._cols[name] = np.full(self._cap, np.nan)
        for name, col in self._cols.items():
            other = newer.column(name)
            col[start : start + len(newer)] = np.nan if other is None else other
        self._n = start + len(newer)
        self.version += 1

    def prepend_table(self, older: "MetricTable") -> None:
        """Add rows logged before ours (history loaded after the recent tail)."""
        if not len(older):
            return
        if self._n:
            keep = int(np.searchsorted(older.steps, self._steps[0], side="left"))
        else:
            keep = len(older)
        n = keep + self._n
        names = list(self._cols) + [k for k in older._cols if k not in self._cols]
        cap = max(n, 1024)

        def joined(head: np.ndarray | None, tail: np.ndarray | None) -> np.ndarray:
            out = np.full(cap, np.nan)
            if head is not None:
                out[:keep] = head[:keep]
            if tail is not None:
                out[keep:n] = tail
            return out

        self._steps = joined(older.steps, self.steps)
        self._times = joined(older.times, self.times)
        self._cols = {k: joined(older.column(k), self.column(k)) for k in names}
        self._n, self._cap = n, cap
        self.version += 1
        self.epoch += 1

    def _reserve(self, n: int) -> None:
        if n <= self._cap:
            return
        cap = max(n, 2 * self._cap, 1024)

        def grown(a: np.ndarray) -> np.ndarray:
            out = np.full(cap, np.nan)
            out[: self._n] = a[: self._n]
            return out

        self._steps = grown(self._steps)
        self._times = grown(self._times)
        self._cols = {k: grown(v) for k, v in self._cols.items()}
        self._cap = cap


def table_from_records(records: Iterable[dict]) -> tuple[MetricTable, int]:
    """Build a table from parsed metric records; returns (table, records rejected).

    Old metric names are read as today's (catalogue.ALIASES).
    A record needs an integral `step`; other fields that are not finite numbers
    become NaN. Records going back in steps rewind, as described above.
    """
    kept: list[dict] = []
    rejected = 0
    for rec in records:
        rec = canonical_record(rec)  # a run written before a metric was renamed charts under today's name
        step = rec.get(STEP)
        if type(step) is float and step.is_integer():
            step = int(step)
        if type(step) is not int or abs(step) > _MAX_STEP:
            rejected += 1
            continue
        while kept and kept[-1][STEP] >= step:
            kept.pop()
        if type(rec.get(STEP)) is not int:
            rec = {**rec, STEP: step}
        kept.append(rec)
    table = MetricTable()
    n = len(kept)
    if not n:
        return table, rejected
    names: dict[str, None] = {}
    for rec in kept:
        names.update(dict.fromkeys(rec))
    names.pop(STEP, None)
    names.pop(TIME, None)
    table._reserve(n)
    table._steps[:n] = [rec[STEP] for rec in kept]
    table._times[:n] = _floats([rec.get(TIME) for rec in kept])
    for name in names:
        col = np.full(table._cap, np.nan)
        col[:n] = _floats([rec.get(name) for rec in kept])
        table._cols[name] = col
    table._n = n
    table.version = 1
    return table, rejected


def _floats(values: list) -> np.ndarray:
    """Numbers as float64; null, containers and inf/nan become NaN.

    numpy coerces bools and numeric strings on its own; both break the contract
    and are rare, so they are accepted as the numbers they spell.
    """
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        arr = None
    if arr is None or arr.shape != (len(values),):  # lists of one shape convert without error: [[]] is (1, 0)
        arr = np.array([_number_or_nan(v) for v in values], dtype=np.float64)
    arr[~np.isfinite(arr)] = np.nan
    return arr


def _number_or_nan(v) -> float:
    if type(v) in (int, float):
        try:
            return float(v)  # inf/nan are masked by the caller
        except OverflowError:
            pass
    return math.nan
