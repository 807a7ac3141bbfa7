"""What a rule's evaluation is made of: metric patterns, record values, latches, windows, state fields."""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import field
from typing import Any

import numpy as np

from ..metrics.robust import mann_kendall

# Keys of a record that are coordinates, not metrics: never matched by a rule.
_NOT_METRICS = frozenset({"step", "time"})


def metric_pattern(pattern: str) -> re.Pattern | None:
    """A metric-name glob as a regex: `*` matches within one path segment, `**` across segments,
    `?` one character. Alert rules and the dashboard's chart specs use it.

    Returns None for a plain name (matched by equality, which is cheaper).
    """
    if not any(ch in pattern for ch in "*?"):
        return None
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    table = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(table.get(part, re.escape(part)) for part in parts) + r"\Z")


def _num(value: Any) -> float | None:
    """A record value as a finite float, or None (null, text, NaN/Inf)."""
    if type(value) is float:  # the common case, checked first: x - x is 0 only for finite x
        return value if value - value == 0.0 else None
    if value is None or isinstance(value, str):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _fmt(value: float | None) -> str:
    if value is None:
        return "null"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.4g}"


class _Latch:
    """Dedup and cooldown for one (rule, metric): one alert per episode of a condition.

    An episode starts when the condition has held for `for_steps` records in a row and
    ends (re-arms) the first time it does not hold. A new episode inside `cooldown`
    steps of the last alert stays silent until the cooldown has passed.
    """

    __slots__ = ("count", "active", "last_step")

    def __init__(self) -> None:
        self.count = 0
        self.active = False
        self.last_step: int | None = None

    def update(self, condition: bool, step: int, for_steps: int, cooldown: int) -> bool:
        """True when this record starts an episode that is not inside the cooldown."""
        if not condition:
            self.count = 0
            self.active = False
            return False
        self.count += 1
        if self.active or self.count < for_steps:
            return False
        if self.last_step is not None and step - self.last_step < cooldown:
            return False
        self.active = True
        self.last_step = step
        return True


class _Window:
    """Last `size` (x, y) points with O(1) mean, standard deviation and slope.

    Sums are kept relative to an origin x0 and recomputed from scratch every `size`
    pushes (amortised O(1)), so rounding error cannot build up over a long run.
    `drop_before` removes points older than a given x.
    """

    __slots__ = ("size", "recompute_every", "points", "x0", "sx", "sy", "sxx", "sxy", "syy", "pushes")

    def __init__(self, size: int) -> None:
        self.size = size
        self.recompute_every = max(size, 64)
        self.points: deque[tuple[float, float]] = deque()
        self.x0 = 0.0
        self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0
        self.pushes = 0

    def __len__(self) -> int:
        return len(self.points)

    def _add(self, x: float, y: float, sign: float) -> None:
        dx = x - self.x0
        self.sx += sign * dx
        self.sy += sign * y
        self.sxx += sign * dx * dx
        self.sxy += sign * dx * y
        self.syy += sign * y * y

    def _recompute(self) -> None:
        self.x0 = self.points[0][0] if self.points else 0.0
        self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0
        for x, y in self.points:
            self._add(x, y, 1.0)
        self.pushes = 0

    def push(self, x: float, y: float) -> None:
        """Add a point, dropping the oldest once the window is full."""
        # _add inlined: this runs for every watched metric of every record.
        points = self.points
        x0 = self.x0
        if len(points) == self.size:
            ox, oy = points.popleft()
            dx = ox - x0
            self.sx -= dx
            self.sy -= oy
            self.sxx -= dx * dx
            self.sxy -= dx * oy
            self.syy -= oy * oy
        points.append((x, y))
        dx = x - x0
        self.sx += dx
        self.sy += y
        self.sxx += dx * dx
        self.sxy += dx * y
        self.syy += y * y
        self.pushes += 1
        if self.pushes >= self.recompute_every:
            self._recompute()

    def drop_before(self, x: float) -> None:
        """Remove the points older than `x`."""
        points = self.points
        while points and points[0][0] < x:
            old = points.popleft()
            self._add(old[0], old[1], -1.0)

    def mean(self) -> float:
        """The mean of the y values."""
        return self.sy / len(self.points)

    def std(self) -> float:
        """The sample standard deviation of the y values (0 below two points)."""
        n = len(self.points)
        if n < 2:
            return 0.0
        return math.sqrt(max(0.0, (self.syy - self.sy * self.sy / n) / (n - 1)))

    def change(self) -> float | None:
        """Fitted change over the window: least-squares slope x span of x; None if undefined."""
        n = len(self.points)
        if n < 2:
            return None
        denom = n * self.sxx - self.sx * self.sx
        span = self.points[-1][0] - self.points[0][0]
        if denom <= 0 or span <= 0:
            return None
        return (n * self.sxy - self.sx * self.sy) / denom * span


    def robust_change(self, recent: int = 3) -> tuple[float, float, float] | None:
        """(median of the last `recent` values - median of the window's first half, Mann-Kendall two-sided p,
        Kendall's tau): medians, so one wild step moves neither level. O(n^2) (the test): for a condition the
        least-squares `change` already passed."""
        n = len(self.points)
        if n < max(4, 2 * recent):
            return None
        y = np.array([p[1] for p in self.points])
        p, tau = mann_kendall(y)
        return float(np.median(y[-recent:]) - np.median(y[:n // 2])), p, tau


# The plain-data types a rule's state is made of: the checkpoint codec rebuilds only these.
STATE_TYPES = {cls.__name__: cls for cls in (_Latch, _Window)}


def state(factory: Any = dict) -> Any:
    """A field of a rule's evaluation state: made empty for each engine, not configuration (left out of
    repr, which matches saved state to its rule on resume, and of comparison), saved in checkpoints."""
    return field(default_factory=factory, init=False, repr=False, compare=False, metadata={"state": True})


def _in_a_row(n: int) -> str:
    return "" if n <= 1 else f" for {n} steps in a row"


def _windowed(windows: dict[str, _Window], name: str, size: int) -> _Window:
    """The window kept for `name`, made on first use."""
    window = windows.get(name)
    if window is None:
        window = windows[name] = _Window(size)
    return window


def _check_window(rule, least: int = 3) -> None:
    """`window` at least 3; `min_points` 0 means the whole window, otherwise at least `least` (3: a median needs
    them) and at most the window."""
    if rule.window < 3:
        raise ValueError("key 'window' must be at least 3")
    if rule.min_points == 0:
        object.__setattr__(rule, "min_points", rule.window)
    elif not least <= rule.min_points <= rule.window:
        raise ValueError(f"key 'min_points' must be between {least} and 'window'")
