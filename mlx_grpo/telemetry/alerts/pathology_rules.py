"""A rule judged with robust statistics over a metric's recent history (analysis/robust.py): a quantity spent
down toward nothing (entropy, the gradient norm).

It keeps at most `max_points` points per metric and does its O(n^2) statistics only once a cheap test says
the answer may be yes, so a healthy run replayed by the dashboard costs little. Imports no mlx.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import ClassVar

import numpy as np

from ..metrics.robust import mann_kendall, theil_sen
from .alert import LEVELS, Alert
from .detector_rules import _heldout_rose, keep_progress
from .rules import Rule
from .state import _fmt, state


def _recent_median(points: deque, count: int) -> float:
    n = len(points)
    return median(points[i][1] for i in range(max(0, n - count), n))


def _rising(points: deque, since: float, alpha: float = 0.05, min_points: int = 6) -> bool | None:
    """Whether the points from step `since` on rise significantly (Mann-Kendall, one-sided: the question is
    whether they rise, and a two-sided test needs twice the evidence; the tool recipe's train accuracy 31, 25,
    31, 38, 69, 56% at step 6 is p = 0.045 one-sided, 0.09 two-sided); None: too few to say."""
    values = [v for s, v in points if s >= since]
    if len(values) < min_points:
        return None
    p, tau = mann_kendall(np.asarray(values))
    return p / 2 < alpha and tau > 0


def _steps_to(points: list[tuple[float, float]], target: float) -> float | None:
    """Steps from the last point until a straight line, or an exponential decay, fitted (Theil-Sen) through
    `points` reaches `target`: the sooner of the two (None when neither heads there)."""
    x = np.array([s for s, _ in points], float)
    y = np.array([v for _, v in points], float)
    etas = []
    slope, intercept = theil_sen(x, y)
    now = intercept + slope * x[-1]
    if slope < 0 and now > target:
        etas.append((target - now) / slope)
    if target > 0 and (y > 0).all():
        slope, intercept = theil_sen(x, np.log(y))
        now = intercept + slope * x[-1]
        if slope < 0 and now > math.log(target):
            etas.append((math.log(target) - now) / slope)
    return min(etas) if etas else None


@dataclass(frozen=True, kw_only=True)
class ExhaustionRule(Rule):
    """A positive quantity spent down toward nothing: policy entropy (sampling turns greedy, groups repeat one
    completion, advantages vanish) or the gradient norm (updates stop moving the policy).

    The start is the median of the first `baseline_steps` values, now the median of the last `recent`.
    Fires when now <= `floor` x start, or (with `horizon` > 0) when the metric is falling significantly over
    the recent half of its points (Mann-Kendall) and a fit projects it to reach `project_to` x start (default:
    the floor) within `horizon` x the steps logged so far. Conditional: when a metric of `progress` rises
    significantly over the same steps, the fall is the policy converging on what it learned, not a collapse: the
    alert is `converging_level`, says so, and carries no action.
    """

    kind: ClassVar[str] = "exhaustion"
    floor: float
    project_to: float = 0.0  # the fraction of the start a projection aims at (0: `floor`)
    baseline_steps: int = 5
    recent: int = 3
    horizon: float = 0.0
    min_points: int = 6
    watch_below: float = 0.7  # statistics are computed only once now <= watch_below x start (a straight fall
    # from the start projects to 10% within the steps so far only below ~55% of it)
    progress: tuple[str, ...] = ()
    converging_level: str = "info"
    max_points: int = 128
    points: dict[str, deque] = state()
    start_values: dict[str, list] = state()
    first_step: dict[str, int] = state()
    progress_points: dict[str, deque] = state()
    progress_samples: dict[str, float] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.floor < 1 or not 0 <= self.project_to < 1:
            raise ValueError("keys 'floor' and 'project_to' must be between 0 and 1 (fractions of the start)")
        if self.baseline_steps < 1 or self.recent < 1:
            raise ValueError("keys 'baseline_steps' and 'recent' must be at least 1")
        if self.horizon < 0:
            raise ValueError("key 'horizon' must not be negative")
        if not 4 <= self.min_points <= self.max_points:
            raise ValueError("key 'min_points' must be between 4 and 'max_points'")
        if self.converging_level not in LEVELS:
            raise ValueError(f"key 'converging_level' must be one of {', '.join(LEVELS)}")

    def plan(self, keys):
        names = self.metrics_in(keys)
        if names or any(p in keys for p in self.progress):
            return names
        return None

    def update(self, step, time, record, names, out):
        """Keep the progress metrics' points, then judge each watched metric against its start."""
        keep_progress(self.progress, record, self.progress_points, self.progress_samples, self.max_points, step)
        for name, value in self.values(record, names):
            points = self.points.setdefault(name, deque(maxlen=self.max_points))
            points.append((step, value))
            start_values = self.start_values.setdefault(name, [])
            self.first_step.setdefault(name, step)
            if len(start_values) < self.baseline_steps:
                start_values.append(value)
                continue
            start = median(start_values)
            if start <= 0:
                continue
            now = _recent_median(points, self.recent)
            collapsed, eta = now <= self.floor * start, None
            half = list(points)[-max(self.min_points, len(points) // 2):]
            if not collapsed and self.horizon > 0 and now <= self.watch_below * start and \
                    len(points) >= self.min_points:
                p, tau = mann_kendall(np.array([v for _, v in half]))
                if p < 0.05 and tau < 0:
                    eta = _steps_to(half, (self.project_to or self.floor) * start)
                    if eta is not None and eta > self.horizon * max(step - self.first_step[name], 1):
                        eta = None
            due = collapsed or eta is not None
            # progress over the recent half, or over all the steps kept: either rising is learning
            rising = [n for n, pts in self.progress_points.items()
                      if any(_rising(pts, since) for since in (half[0][0], -math.inf))
                      or _heldout_rose([v for _, v in pts], self.progress_samples.get(n))] if due else []
            if self.fire(due and not rising, name, step):
                out.append(self._alert(step, time, name, value, start, now, eta, rising=[]))
            if self.fire(due and bool(rising), name + " (converging)", step):
                out.append(self._alert(step, time, name, value, start, now, eta, rising=rising))

    def _alert(self, step, time, name, value, start, now, eta, rising: list[str]) -> Alert:
        where = (f"{_fmt(now)}, {now / start:.0%} of its start {_fmt(start)}")
        if eta is None:
            what = f"{name} is down to {where} (floor {self.floor:.0%})"
        else:
            what = (f"{name} is falling: {where}, and at this pace reaches {self.project_to or self.floor:.0%} of "
                    f"its start in about {eta:.0f} steps")
        if rising:
            text = (f"{what}; {', '.join(rising)} still rising, so this is the policy converging on what it learned, "
                    "not a collapse: watch that it keeps rising")
            return Alert(step=step, time=time, level=self.converging_level, rule=self.name, metric=name,
                         value=value, message=text)
        progress = f"; {' and '.join(self.progress)} not rising" if self.progress else ""
        return self.alert(step, time, name, value, what + progress)
