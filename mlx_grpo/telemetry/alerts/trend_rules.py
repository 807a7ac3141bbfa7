"""Rules over a window of records: a trend, a reward rising while accuracy does not, nothing moving."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from ..metrics.names import ACCURACY_TRAIN, EVAL_ACCURACY
from .detector_rules import _progressing, keep_progress
from .rules import Rule
from .state import _check_window, _fmt, _num, _Window, _windowed, metric_pattern, state

_TREND_DIRECTIONS = ("rising", "falling", "flat")


def _robust_change(window: _Window, sign: float, scale: float) -> float | None:
    """The window's median-to-median change (state._Window.robust_change) divided by `scale`, when Mann-Kendall
    finds a significant trend (p < 0.05) in the direction of `sign`; else None."""
    robust = window.robust_change()
    if robust is None:
        return None
    change, p, tau = robust
    return change / scale if p < 0.05 and tau * sign > 0 else None


@dataclass(frozen=True, kw_only=True)
class TrendRule(Rule):
    """Fires on the change of `metric` over its last `window` records.

    The change is slope x (steps spanned by the window). With `relative`, it is
    divided by max(|window mean|, min_scale), so 0.5 means "grew by half".
    rising: change >= `change`; falling: change <= -`change`; flat: |change| <= `change`.
    Rising and falling are judged robustly too: the median of the last 3 values against the median of the
    window's first half must also pass, and the Mann-Kendall test must find the trend significant (p < 0.05),
    so one wild step is not a trend; the cheap least-squares change is computed first, the rest only once it
    passes.
    Evaluated from `min_points` records on (default: once the window is full), so a
    fast rise early in a run is caught before the window has filled.
    With `progress`, a rise or fall while one of those metrics (accuracy) rises significantly over the last
    `window` records (a trend, or its later half above its earlier half) is learning and stays silent:
    answers that grow as a policy learns to think, or to call a tool and read its result, are not rambling.
    """

    kind: ClassVar[str] = "trend"
    window: int
    direction: str
    change: float
    relative: bool = False
    min_scale: float = 1e-9
    min_points: int = 0  # 0: the whole window
    progress: tuple[str, ...] = ()
    windows: dict[str, _Window] = state()
    progress_points: dict[str, deque] = state()
    progress_samples: dict[str, float] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_window(self)
        if self.direction not in _TREND_DIRECTIONS:
            raise ValueError(f"key 'direction' must be one of {', '.join(_TREND_DIRECTIONS)}, got {self.direction!r}")
        if self.change < 0:
            raise ValueError("key 'change' must not be negative (the direction gives the sign)")
        if self.min_scale <= 0:
            raise ValueError("key 'min_scale' must be positive")

    def plan(self, keys: tuple[str, ...]) -> tuple[str, ...] | None:
        """The watched metrics; a record holding only progress (an evaluation's) still counts: it is kept."""
        names = self.metrics_in(keys)
        if names or any(p in keys for p in self.progress):
            return names
        return None

    def update(self, step, time, record, names, out):
        """Push each value into its window and fire when the window's change goes the rule's way (and, with
        `progress`, no progress metric is rising)."""
        keep_progress(self.progress, record, self.progress_points, self.progress_samples, self.window)
        for name, value in self.values(record, names):
            window = _windowed(self.windows, name, self.window)
            window.push(step, value)
            if len(window) < self.min_points:
                continue
            change = window.change()
            if change is None:
                continue
            scale = max(abs(window.mean()), self.min_scale) if self.relative else 1.0
            change /= scale
            if self.direction == "flat":
                condition = abs(change) <= self.change
            else:
                sign = 1.0 if self.direction == "rising" else -1.0
                condition = sign * change >= self.change
                if condition:
                    change = _robust_change(window, sign, scale)
                    condition = change is not None and sign * change >= self.change
                    condition = condition and not any(_progressing(p, samples=self.progress_samples.get(n))
                                                      for n, p in self.progress_points.items())
            if self.fire(condition, name, step):
                amount = f"{change * 100:+.0f}%" if self.relative else f"{change:+.4g}"
                verb = {"rising": "rose", "falling": "fell", "flat": "barely moved"}[self.direction]
                out.append(self.alert(step, time, name, value,
                                      f"{name} {verb} ({amount}) over the last {len(window)} logged steps, "
                                      f"now {_fmt(value)}"))


@dataclass(frozen=True, kw_only=True)
class HackingRule(Rule):
    """A reward going up while correctness does not.

    Fires when `metric` (a reward mean, or a contribution share) changed by at least
    `rise` over its last `window` records (by least squares and median to median, with a significant
    Mann-Kendall trend) (relative as in TrendRule when `relative`)
    while every metric in `accuracy` that has at least `min_accuracy_points` values in
    the same steps changed by at most `accuracy_change` (0: flat or falling; a
    negative value demands a fall). Without any accuracy metric it stays silent.
    `min_points` as in TrendRule.
    """

    kind: ClassVar[str] = "hacking"
    window: int
    rise: float
    accuracy: tuple[str, ...] = (ACCURACY_TRAIN, EVAL_ACCURACY)
    accuracy_change: float = 0.0
    relative: bool = False
    min_scale: float = 1e-9
    min_points: int = 0  # 0: the whole window
    min_accuracy_points: int = 3
    windows: dict[str, _Window] = state()  # the reward metrics'
    # Accuracy points are trimmed to the reward window's span when it is evaluated; the bound (accuracy
    # logged at most twice per reward record) caps memory when no reward metric ever arrives.
    accuracy_windows: dict[str, _Window] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_window(self)
        if self.rise <= 0:
            raise ValueError("key 'rise' must be positive")
        if not self.accuracy:
            raise ValueError("key 'accuracy' must name at least one metric")
        if self.min_scale <= 0:
            raise ValueError("key 'min_scale' must be positive")
        if self.min_accuracy_points < 2:
            raise ValueError("key 'min_accuracy_points' must be at least 2")

    def plan(self, keys: tuple[str, ...]) -> tuple[str, ...] | None:
        """The reward metrics of the record; accuracy may arrive in a record of its own (an evaluation
        step), which still counts: its points are kept."""
        names = tuple(n for n in self.metrics_in(keys) if n not in self.accuracy)
        if names or any(a in keys for a in self.accuracy):
            return names
        return None

    def _accuracy_changes(self, start: float) -> list[tuple[str, float]] | None:
        changes = []
        for name, window in self.accuracy_windows.items():
            window.drop_before(start)
            if len(window) >= self.min_accuracy_points:
                change = window.change()
                if change is not None:
                    changes.append((name, change))
        return changes or None

    def update(self, step, time, record, names, out):
        """Keep accuracy's points, then fire on a reward that rose while accuracy stood still or fell."""
        for name, value in self.values(record, tuple(a for a in self.accuracy if a in record)):
            _windowed(self.accuracy_windows, name, 2 * self.window).push(step, value)
        accuracy: list[tuple[str, float]] | None = None
        stalled: bool | None = None  # accuracy flat or falling; None: not measured yet / unknown
        measured = False
        for name, value in self.values(record, names):
            window = _windowed(self.windows, name, self.window)
            window.push(step, value)
            if len(window.points) < self.min_points:
                continue
            if not measured:
                # All reward metrics of one record normally share their history: measure
                # accuracy once, over the steps of the first full window.
                measured = True
                accuracy = self._accuracy_changes(window.points[0][0])
                if accuracy is not None:
                    # The tolerance keeps rounding in the running sums from reading flat as rising.
                    stalled = all(c <= self.accuracy_change + 1e-9 for _, c in accuracy)
            if stalled is None:
                continue  # no accuracy to compare with: neither fire nor re-arm
            condition = False
            if stalled:
                change = window.change()
                if change is None:
                    continue
                scale = max(abs(window.mean()), self.min_scale) if self.relative else 1.0
                rise = change / scale
                condition = rise >= self.rise
                if condition:  # robustly: medians and a significant trend, not one wild step
                    robust = _robust_change(window, 1.0, scale)
                    condition = robust is not None and robust >= self.rise
                    rise = robust if robust is not None else rise
            if self.fire(condition, name, step):
                amount = f"{rise * 100:+.0f}%" if self.relative else f"{rise:+.4g}"
                acc = ", ".join(f"{a} changed {c:+.3f}" for a, c in accuracy or ())
                out.append(self.alert(step, time, name, value,
                                      f"{name} rose ({amount}) over the last {len(window.points)} logged steps "
                                      f"while {acc}: the policy may be gaming the reward instead of "
                                      f"getting answers right"))


@dataclass(frozen=True, kw_only=True)
class PlateauRule(Rule):
    """Nothing moving: `metric` and every metric in `together` flat over the last `window` records and
    no different from the run's start.

    A metric has moved by the larger of its least-squares change over the window and the difference
    between the window's mean and the mean of its first `baseline_steps` values. Flat: at most `change`
    for `metric` (relative as in TrendRule when `relative`) and at most `together_change` (absolute) for
    each metric of `together`. Comparing with the start keeps a run that learned and then levelled off
    quiet; only a run that is where it began, and stays there, fires. A metric of `together` that a run
    does not log is left out; `metric` itself must be logged.
    """

    kind: ClassVar[str] = "plateau"
    window: int
    change: float
    baseline_steps: int = 20
    together: tuple[str, ...] = ()
    together_change: float = 0.0
    relative: bool = False
    min_scale: float = 1e-9
    windows: dict[str, _Window] = state()
    start: dict[str, list[float]] = state()  # each metric's first `baseline_steps` values

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 3:
            raise ValueError("key 'window' must be at least 3")
        if not 1 <= self.baseline_steps <= self.window:
            raise ValueError("key 'baseline_steps' must be between 1 and 'window'")
        if self.change < 0 or self.together_change < 0:
            raise ValueError("keys 'change' and 'together_change' must not be negative")
        if self.min_scale <= 0:
            raise ValueError("key 'min_scale' must be positive")
        if metric_pattern(self.metric) is not None or any(metric_pattern(m) is not None for m in self.together):
            raise ValueError("a plateau rule takes plain metric names, not patterns")

    def _moved(self, name: str) -> float | None:
        """How far `name` moved: max(|change over the window|, |window mean - start mean|); None: unknown."""
        window, start = self.windows.get(name), self.start.get(name, [])
        change = window.change() if window is not None else None
        if change is None or len(start) < self.baseline_steps:
            return None
        return max(abs(change), abs(window.mean() - sum(start) / len(start)))

    def update(self, step, time, record, names, out):
        """Keep every plateau metric's points; fire when none moved over the window nor since the start."""
        for name in (self.metric, *self.together):
            value = _num(record.get(name))
            if value is not None:
                _windowed(self.windows, name, self.window).push(step, value)
                start = self.start.setdefault(name, [])
                if len(start) < self.baseline_steps:
                    start.append(value)
        value = _num(record.get(self.metric))
        if value is None or len(self.windows[self.metric]) < self.window:
            return
        moved = self._moved(self.metric)
        if moved is None:
            return
        level = self.windows[self.metric].mean()
        scale = max(abs(level), self.min_scale) if self.relative else 1.0
        moves = [(self.metric, moved / scale, self.change)]
        for name in self.together:
            # Only a metric logged over most of the window counts; one never logged is left out.
            window = self.windows.get(name)
            if window is not None and len(window) >= self.window // 2 and (other := self._moved(name)) is not None:
                moves.append((name, other, self.together_change))
        if self.fire(all(m <= limit for _, m, limit in moves), self.metric, step):
            named = [n for n, _, _ in moves]
            listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
            amounts = ", ".join(f"{m * 100:.1f}%" if n == self.metric and self.relative else f"{m:.3g}"
                                for n, m, _ in moves)
            out.append(self.alert(step, time, self.metric, value,
                                  f"{listed} have not moved over the last {len(self.windows[self.metric])} logged "
                                  f"steps nor since the start (by at most {amounts})"))
