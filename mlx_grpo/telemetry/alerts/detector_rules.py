"""Rules for pathologies that show in how a metric moved since the run's start: a reward component that climbed
to its ceiling and stays pinned while the rest of the reward and accuracy stall (format gaming), and a quantity
that climbed from low to high (the repetition rate, the rewards' bimodality).

Robust statistics only (medians, Mann-Kendall), so one wild step neither fires nor hides a problem. Imports no mlx.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import ClassVar

import numpy as np

from ..metrics.names import ACCURACY_TRAIN, EVAL_ACCURACY, EVAL_NUM_SAMPLES, REWARD_MEAN
from ..metrics.robust import HELDOUT_Z, halves_shift, mann_kendall, proportion_z
from .rules import Rule
from .state import _fmt, _num, state


def _rising(values, alpha: float = 0.05) -> bool:
    """Whether `values` rise significantly (Mann-Kendall, two-sided p < alpha, tau > 0)."""
    if len(values) < 4:
        return False
    p, tau = mann_kendall(np.asarray(values, float))
    return p < alpha and tau > 0


def _heldout_rose(values, samples: float | None) -> bool:
    """Whether the latest of `values` (shares of `samples` rows each: held-out evaluations) lies HELDOUT_Z standard
    errors above the first. A short run evaluates two or three times, too few for a trend: the thinking recipe's
    held-out accuracy went 38% -> 62% of 32 sums at step 6 of 12, while its entropy fell as it settled."""
    return bool(samples) and len(values) >= 2 and \
        proportion_z(values[0], samples, values[-1], samples) >= HELDOUT_Z


def _progressing(values, alpha: float = 0.05, samples: float | None = None) -> bool:
    """Whether a progress metric (an accuracy) went up: a significant trend, or its later half significantly
    above its earlier half, or (with `samples`, a held-out evaluation's row count) its latest value well above its
    first. Sampled accuracy on a small batch is noisy, so a run that learnt in its first steps and then levelled
    off, or whose last batch was a bad one, has no monotone trend left and is still learning (Qwen2.5-Coder's
    thinking recipe on three numbers: accuracy 19-50% over steps 1-5, 69-75% over steps 6-9, 31% at step 10)."""
    if _rising(values, alpha) or _heldout_rose(list(values), samples):
        return True
    p, later_higher = halves_shift(values)
    return p < alpha and later_higher > 0.5


def keep_progress(names, record, points: dict, samples: dict, maxlen: int, step: float | None = None) -> None:
    """Append each progress metric's value in `record` to its deque in `points` (as (step, value) when `step` is
    given), and remember the row count of a held-out accuracy (the same record's eval/num_samples)."""
    for name in names:
        if (value := _num(record.get(name))) is not None:
            points.setdefault(name, deque(maxlen=maxlen)).append(value if step is None else (step, value))
            if name == EVAL_ACCURACY and (rows := _num(record.get(EVAL_NUM_SAMPLES))):
                samples[name] = rows


@dataclass(frozen=True, kw_only=True)
class RiseRule(Rule):
    """A quantity that started low and climbed high: fires when the median of the last `recent` values is at
    least `above`, the median of the first `baseline_steps` was at most `start_below`, and the last `window`
    values rise significantly (Mann-Kendall, p < 0.05). A run that is high from its start is its normal, not a
    pathology, and stays silent; so is a climb while a metric of `progress` (e.g. accuracy) rises significantly
    over the same steps: rewards that split into right and wrong answers as the policy learns are learning."""

    kind: ClassVar[str] = "rise"
    above: float
    start_below: float
    baseline_steps: int = 5
    recent: int = 5
    window: int = 30
    progress: tuple[str, ...] = ()
    points: dict[str, deque] = state()
    start_values: dict[str, list] = state()
    progress_points: dict[str, deque] = state()
    progress_samples: dict[str, float] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.start_below > self.above:
            raise ValueError("key 'start_below' must be at most 'above'")
        if self.baseline_steps < 1 or self.recent < 1:
            raise ValueError("keys 'baseline_steps' and 'recent' must be at least 1")
        if self.window < max(4, self.recent):
            raise ValueError("key 'window' must be at least 4 and at least 'recent'")

    def plan(self, keys):
        names = self.metrics_in(keys)
        if names or any(p in keys for p in self.progress):
            return names
        return None

    def update(self, step, time, record, names, out):
        keep_progress(self.progress, record, self.progress_points, self.progress_samples, self.window)
        for name, value in self.values(record, names):
            points = self.points.setdefault(name, deque(maxlen=self.window))
            points.append(value)
            start = self.start_values.setdefault(name, [])
            if len(start) < self.baseline_steps:
                start.append(value)
                continue
            begun, now = median(start), median(list(points)[-self.recent:])
            due = now >= self.above and begun <= self.start_below and _rising(points)
            learning = due and any(_progressing(p, samples=self.progress_samples.get(n))
                                   for n, p in self.progress_points.items())
            if self.fire(due and not learning, name, step):
                out.append(self.alert(step, time, name, value,
                                      f"{name} climbed from {_fmt(begun)} (median of its first {len(start)} logged "
                                      f"values) to {_fmt(now)} (median of the last {self.recent}), rising "
                                      f"significantly over the last {len(points)}"))


@dataclass(frozen=True, kw_only=True)
class SaturationRule(Rule):
    """Format gaming: one reward function's mean climbed to its ceiling (the highest it has reached) and stays
    pinned there, while every other reward function and the sampled accuracy stall. No accuracy fall is
    needed: the policy farms the easy term and stops learning the task.

    A function counts as having climbed when its ceiling is at least `min_rise` above the median of its first
    `baseline_steps` means, and that is at least `rise_share` of its span (so a function at its ceiling from the
    start, a format the model already writes, is left alone); pinned when each of its last `pinned_steps` means
    lies within `ceiling_tol` of its span from the ceiling; the others stall when none of them rises
    significantly (Mann-Kendall) since it reached its ceiling, nor `accuracy` over those steps or over the
    `window` steps kept (a policy that keeps getting more answers right is learning the task).
    `rewards/total/mean` is not a function and is never judged. With a single reward function there is nothing
    to compare and it stays silent.
    """

    kind: ClassVar[str] = "saturation"
    metric: str = "rewards/*/mean"
    accuracy: str = ACCURACY_TRAIN
    min_rise: float = 0.2
    rise_share: float = 0.5
    ceiling_tol: float = 0.05
    pinned_steps: int = 8
    baseline_steps: int = 5
    window: int = 60
    points: deque = state(lambda: deque(maxlen=256))  # per record: ({function: mean}, accuracy or None)
    start_values: dict[str, list] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_rise <= 0 or not 0 < self.rise_share <= 1 or not 0 < self.ceiling_tol < 1:
            raise ValueError("keys 'min_rise' (> 0), 'rise_share' and 'ceiling_tol' (between 0 and 1) out of range")
        if self.pinned_steps < 4 or self.window < 2 * self.pinned_steps:
            raise ValueError("key 'pinned_steps' must be at least 4 and 'window' at least twice it")

    def update(self, step, time, record, names, out):
        means = {name: value for name, value in self.values(record, names) if name != REWARD_MEAN}
        if len(means) < 2:
            return
        self.points.append((means, _num(record.get(self.accuracy))))
        while len(self.points) > self.window:
            self.points.popleft()
        for name, value in means.items():
            start = self.start_values.setdefault(name, [])
            if len(start) < self.baseline_steps:
                start.append(value)
                continue
            self._judge(step, time, name, value, median(start), out)

    def _judge(self, step, time, name, value, begun, out) -> None:
        rows = [(m, a) for m, a in self.points if name in m]
        means = [m[name] for m, _ in rows]
        ceiling, floor = max(means), min(means)
        span = ceiling - floor
        climbed = span > 0 and ceiling - begun >= max(self.min_rise, self.rise_share * span)
        pinned = len(means) >= self.pinned_steps and \
            all(m >= ceiling - self.ceiling_tol * span for m in means[-self.pinned_steps:])
        rising: list[str] = []
        if climbed and pinned:
            # the others over the steps since this function reached its ceiling's band (they may have climbed
            # alongside it: two format rewards learnt together), accuracy over those and over every step kept
            band = ceiling - self.ceiling_tol * span
            reached = next(i for i, m in enumerate(means) if m >= band)
            tail = rows[min(reached, len(rows) - self.pinned_steps):]
            others = {other for m, _ in tail for other in m if other != name}
            rising = [other for other in sorted(others) if _rising([m[other] for m, _ in tail if other in m])]
            accuracies = ([a for _, a in part if a is not None] for part in (tail, rows))
            if any(_progressing(accuracy) for accuracy in accuracies):
                rising.append(self.accuracy)
        if self.fire(climbed and pinned and not rising, name, step):
            out.append(self.alert(step, time, name, value,
                                  f"{name} climbed from {_fmt(begun)} to its ceiling {_fmt(ceiling)} and has stayed "
                                  f"there for at least {self.pinned_steps} logged steps, while no other reward "
                                  f"function nor {self.accuracy} has risen since: the policy may be farming the easy "
                                  f"reward instead of learning the task"))
