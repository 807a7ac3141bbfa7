"""Robust statistics of a metric's series: which way it went, whether that is more than noise, and where it
jumped. Shared by the alert rules, `mlx-grpo report`, the run's last line and the dashboard.

Training curves are short, noisy and have a few wild steps (a batch of degenerate rollouts, a collapse), so
everything here is rank- or median-based: the Theil-Sen slope (median of the pairwise slopes), the
Mann-Kendall test (does a later value tend to sit above an earlier one more often than chance allows?) and a
mean-shift change point scaled by the noise of successive differences. Pure functions over numpy arrays;
no mlx, no scipy (the normal tail is math.erfc).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Series longer than this are thinned to evenly spaced points before the O(n^2) pairwise statistics: the
# verdict of a 100k-step run is the same from 600 of its points, at a bounded cost.
MAX_POINTS = 600


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(y) <= MAX_POINTS:
        return x, y
    keep = np.linspace(0, len(y) - 1, MAX_POINTS).round().astype(int)
    return x[keep], y[keep]


def theil_sen(x, y) -> tuple[float, float]:
    """(slope, intercept) of the Theil-Sen line: the median of all pairwise slopes, so up to ~29% of wild
    points cannot turn it. (0, median) when x does not vary."""
    x, y = _thin(np.asarray(x, float), np.asarray(y, float))
    if len(y) < 2:
        return 0.0, float(y[0]) if len(y) else 0.0
    i, j = np.triu_indices(len(y), k=1)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        return 0.0, float(np.median(y))
    slope = float(np.median((y[j][ok] - y[i][ok]) / dx[ok]))
    return slope, float(np.median(y - slope * x))


def mann_kendall(y) -> tuple[float, float]:
    """(two-sided p-value, Kendall's tau) of the Mann-Kendall trend test, with the variance corrected for
    tied values. p is 1 below 4 points or for a constant series."""
    y = _thin(np.arange(len(y), dtype=float), np.asarray(y, float))[1]
    n = len(y)
    if n < 4:
        return 1.0, 0.0
    i, j = np.triu_indices(n, k=1)
    s = float(np.sign(y[j] - y[i]).sum())
    _, ties = np.unique(y, return_counts=True)
    variance = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18.0
    if variance <= 0:
        return 1.0, 0.0
    z = (s - math.copysign(1.0, s)) / math.sqrt(variance) if s else 0.0  # continuity correction
    return float(math.erfc(abs(z) / math.sqrt(2.0))), s / (n * (n - 1) / 2)


def halves_shift(y) -> tuple[float, float]:
    """(two-sided p-value, share of pairs where the later value is higher, ties half) of the rank-sum
    (Mann-Whitney) test of the later half of `y` against its earlier half (the middle point of an odd series
    left out); normal approximation, variance corrected for ties. A rise that then levels off, or that ends on
    one bad step, is a shift between halves even when it is no longer a monotone trend. p is 1 below 4 points
    a half or for a constant series."""
    y = np.asarray(y, float)
    half = len(y) // 2
    if half < 4:
        return 1.0, 0.5
    earlier, later = y[:half], y[len(y) - half:]
    wins = float((later[:, None] > earlier[None, :]).sum() + 0.5 * (later[:, None] == earlier[None, :]).sum())
    n = 2 * half
    _, ties = np.unique(np.concatenate([earlier, later]), return_counts=True)
    variance = half * half / 12.0 * ((n + 1) - float((ties ** 3 - ties).sum()) / (n * (n - 1)))
    if variance <= 0:
        return 1.0, 0.5
    centred = wins - half * half / 2.0
    z = (centred - math.copysign(0.5, centred)) / math.sqrt(variance) if centred else 0.0  # continuity correction
    return float(math.erfc(abs(z) / math.sqrt(2.0))), wins / (half * half)


HELDOUT_Z = 2.0  # standard errors between the first and the latest evaluation that count as a held-out move


def proportion_z(first: float, n_first: float, last: float, n_last: float) -> float:
    """How many standard errors `last` (a share of n_last rows) lies above `first` (of n_first rows): the pooled
    two-proportion z. Two or three held-out evaluations are too few for a trend, but their scores are shares
    of known counts, so the first and the latest can be compared directly."""
    pooled = (first * n_first + last * n_last) / (n_first + n_last)
    return (last - first) / max((pooled * (1 - pooled) * (1 / n_first + 1 / n_last)) ** 0.5, 1e-12)


def noise_scale(y) -> float:
    """The step-to-step noise of a series: the median absolute successive difference, scaled to a standard
    deviation (for independent noise a difference has sqrt(2) times its spread). A trend or a level shift
    barely moves it, unlike the series' own spread."""
    y = np.asarray(y, float)
    if len(y) < 3:
        return 0.0
    d = np.diff(y)
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2.0))


@dataclass(frozen=True)
class ChangePoint:
    """A level shift: the series' median before index `index` and from it on, and the shift in noise units."""

    index: int
    before: float
    after: float
    strength: float  # |after - before| / (noise x sqrt(1/n_before + 1/n_after))


def change_point(y, min_side: int = 2, min_strength: float = 6.0) -> ChangePoint | None:
    """The single most likely level shift of `y`, if it stands `min_strength` noise units clear; each side
    keeps at least `min_side` points. Medians, not means, name the levels, so one wild step is not a shift."""
    y = np.asarray(y, float)
    n = len(y)
    if n < 2 * min_side + 1:
        return None
    noise = noise_scale(y)
    if noise <= 0:
        noise = float(np.std(y)) or 0.0
    best: ChangePoint | None = None
    for k in range(min_side, n - min_side + 1):
        before, after = float(np.median(y[:k])), float(np.median(y[k:]))
        spread = noise * math.sqrt(1.0 / k + 1.0 / (n - k))
        strength = math.inf if spread == 0 and after != before else (abs(after - before) / spread if spread else 0.0)
        if best is None or strength > best.strength:
            best = ChangePoint(k, before, after, strength)
    return best if best is not None and best.strength >= min_strength else None


# The fewest points a quarter needs before "the last quarter lies entirely beyond the first" may decide a
# direction: by chance alone that happens 2/C(2k, k) of the time (k = 2: 33%, 3: 10%, 5: 0.8%), so with
# short quarters it is left to the Mann-Kendall test and the change point, whose false rates are bounded.
QUARTER_MIN = 5
# A level shift decides a direction only from this many points and at this many noise units (the best of a
# series' split points clears 6 by chance in 3% of pure-noise 8-step series and 1% of 20-step ones, on top of
# the Mann-Kendall test's own 5%); below 12 points a real shift is a significant Mann-Kendall trend anyway
# (4 points at one level, then 4 at another: p < 0.03).
SHIFT_MIN_POINTS = 12
SHIFT_STRENGTH = 8.0


@dataclass(frozen=True)
class Verdict:
    """Which way a series went, and the numbers behind the word.

    direction: "rising" / "falling" (a significant Mann-Kendall trend, the last quarter entirely beyond the
    first quarter's range (quarters of QUARTER_MIN points or more), or a strong level shift (SHIFT_MIN_POINTS
    or more), each moving at least `floor`), "flat" (none of those, and
    the first quarter's mean and the last's within 10% of the start) or "unclear" (moved more than that, but
    not clearly one way: noise).
    """

    direction: str
    start: float  # mean of the first quarter
    end: float  # mean of the last quarter
    slope: float  # Theil-Sen, per step
    p_value: float  # Mann-Kendall, two-sided
    points: int
    shift: ChangePoint | None = None  # the level shift behind a verdict, when that is what decided it
    shift_step: float | None = None

    @property
    def change(self) -> float:
        return self.end - self.start

    @property
    def relative_change(self) -> float | None:
        """The change as a fraction of the start: -1.0 is a fall to zero; None from a start of 0."""
        return self.change / abs(self.start) if abs(self.start) > 1e-12 else None


def verdict(steps, values, floor: float = 0.02, scale_floor: float = 1e-9, alpha: float = 0.05) -> Verdict | None:
    """The direction of a series (see Verdict); None below 4 points. A move counts when it is at least
    `floor` x max(|start|, `scale_floor`): relative to the level, with `scale_floor` keeping a level near 0
    from turning noise into large percentages."""
    x, y = np.asarray(steps, float), np.asarray(values, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(y)
    if n < 4:
        return None
    quarter = max(2, n // 4)
    first, last = y[:quarter], y[-quarter:]
    start, end = float(first.mean()), float(last.mean())
    slope, _ = theil_sen(x, y)
    p, _ = mann_kendall(y)
    needed = floor * max(abs(start), scale_floor)
    moved = end - start
    direction, shift, shift_step = "flat", None, None
    if p < alpha and abs(slope * (x[-1] - x[0])) >= needed and slope * moved > 0:
        direction = "rising" if slope > 0 else "falling"
    elif quarter >= QUARTER_MIN and last.min() >= first.max() and moved >= needed:
        direction = "rising"
    elif quarter >= QUARTER_MIN and last.max() <= first.min() and -moved >= needed:
        direction = "falling"
    elif n >= SHIFT_MIN_POINTS and (cp := change_point(y, min_strength=SHIFT_STRENGTH)) is not None and \
            abs(cp.after - cp.before) >= needed and \
            (cp.after - cp.before) * moved > 0:
        direction, shift, shift_step = ("rising" if cp.after > cp.before else "falling"), cp, float(x[cp.index])
    elif abs(moved) >= max(needed, 0.1 * max(abs(start), scale_floor)):
        direction = "unclear"
    return Verdict(direction, start, end, slope, p, n, shift, shift_step)


def percent_change(new: float, old: float, scale_floor: float = 1e-9) -> str:
    """The change from `old` to `new` as the signed percentage it is (a fall to zero reads -100%), or as an
    absolute difference when `old` is within `scale_floor` of zero, where a percentage means nothing."""
    if abs(old) < scale_floor:
        return f"{new - old:+.3g}"
    return f"{(new - old) / abs(old) * 100:+.0f}%"
