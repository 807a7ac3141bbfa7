"""Series math for charts: min/max bucketing (the smoothing is telemetry/smoothing.py).

A vectorised numpy pass, so a chart of a 100,000-step run costs a
millisecond or two and what gets drawn is always one bucket per screen column,
whatever the run length. No mlx.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Buckets:
    """One entry per non-empty screen column."""

    columns: np.ndarray  # column index, increasing
    lo: np.ndarray       # smallest value in the column
    hi: np.ndarray       # largest value in the column
    first: np.ndarray    # value of the column's first point (to join from the previous column)
    last: np.ndarray     # value of the column's last point


def bucketize(xs: np.ndarray, ys: np.ndarray, x0: float, x1: float, ncols: int) -> Buckets:
    """Split points with increasing `xs` over [x0, x1] into `ncols` equal columns.

    Cost is O(len(xs)) in numpy with O(ncols) Python-free output, so drawing
    stays the same size for any run length while a single spike still shows
    (its column's `hi`).
    """
    if len(xs) == 0 or ncols <= 0:
        empty = np.empty(0)
        return Buckets(np.empty(0, dtype=np.int64), empty, empty, empty, empty)
    span = x1 - x0
    if span <= 0:
        starts = np.array([0])
        columns = np.array([0])
    else:
        edges = x0 + span * np.arange(1, ncols, dtype=np.float64) / ncols
        bounds = np.searchsorted(xs, edges, side="left")
        all_starts = np.concatenate(([0], bounds))
        all_ends = np.concatenate((bounds, [len(xs)]))
        nonempty = all_ends > all_starts
        columns = np.flatnonzero(nonempty)
        starts = all_starts[nonempty]
    ends = np.concatenate((starts[1:], [len(xs)]))
    return Buckets(
        columns=columns,
        lo=np.minimum.reduceat(ys, starts),
        hi=np.maximum.reduceat(ys, starts),
        first=ys[starts],
        last=ys[ends - 1],
    )


def finite_points(steps: np.ndarray, column: np.ndarray, lo_step: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (step, value) pairs of a column that hold a value, optionally from `lo_step` on."""
    if lo_step is not None:
        start = int(np.searchsorted(steps, lo_step, side="left"))
        steps, column = steps[start:], column[start:]
    mask = np.isfinite(column)
    if mask.all():
        return steps, column
    return steps[mask], column[mask]
