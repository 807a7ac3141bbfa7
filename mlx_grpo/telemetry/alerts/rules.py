"""Alert rules: each kind says when it fires and holds the state of its evaluation (docs/ALERTS.md).

Imports no mlx.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import ClassVar, Iterable, Iterator, Mapping

from ..metrics.robust import percent_change
from .alert import ACTIONS, LEVELS, Alert
from .remedy import Remedy
from .state import _NOT_METRICS, _check_window, _fmt, _in_a_row, _Latch, _num, _Window, _windowed, metric_pattern, state

# How many of `solved_metric`'s last values a rule judges "solved" on (their median), and the fewest it needs.
SOLVED_RECENT = 5
SOLVED_MIN_POINTS = 3


# --------------------------------------------------------------------------- rules

@dataclass(frozen=True, kw_only=True)
class Rule:
    """A rule: what it watches and when it fires (its fields, from YAML) and the state of its evaluation
    (`state()` fields, mutated in place as records arrive). `for_steps` and windows count logged records.
    Each kind says how it judges one record in `update`; the engine gives each run a fresh copy."""

    kind: ClassVar[str] = ""
    name: str
    metric: str
    level: str = "warning"
    for_steps: int = 1
    cooldown: int = 50
    hint: str = ""
    # Left out of repr, which matches saved rule state on resume: what the trainer does when a rule fires does
    # not change what the rule measures.
    action: str = field(default="none", repr=False)
    # With action rollback: the factors applied on each rollback, e.g. {learning_rate: 0.5, beta: 2}.
    remedy: Remedy = field(default=Remedy(), repr=False)
    # Flat groups, a zero gradient and low entropy are also what a policy that has solved its prompts looks
    # like. With `solved_metric` (e.g. accuracy/solved_group_frac), when the median of its last values is at
    # least `solved_at` the rule reports that as info with no action, not as a fault with remedies.
    solved_metric: str = ""
    solved_at: float = 0.5
    # With `flat_metric` (rewards/zero_std_group_frac), "solved" also needs the solved groups to be most of the
    # flat ones (the medians' ratio at least `solved_share`): groups flat because the reward broke, half of
    # them mixing right and wrong answers, are a fault even on a half-solved task.
    flat_metric: str = ""
    solved_share: float = 0.6
    latches: dict[str, _Latch] = state()
    solved_values: deque = state(lambda: deque(maxlen=SOLVED_RECENT))
    flat_values: deque = state(lambda: deque(maxlen=SOLVED_RECENT))

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"key 'action' must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        self.remedy.check()
        if not self.name:
            raise ValueError("key 'name' must not be empty")
        if not self.metric:
            raise ValueError("key 'metric' must not be empty")
        if not 0 < self.solved_at <= 1 or not 0 < self.solved_share <= 1:
            raise ValueError("keys 'solved_at' and 'solved_share' must be above 0 and at most 1")
        if self.level not in LEVELS:
            raise ValueError(f"key 'level' must be one of {', '.join(LEVELS)}, got {self.level!r}")
        if self.for_steps < 1:
            raise ValueError("key 'for_steps' must be at least 1")
        if self.cooldown < 0:
            raise ValueError("key 'cooldown' must not be negative")
        regex = metric_pattern(self.metric)
        object.__setattr__(self, "_regex", regex)

    def metrics_in(self, keys: Iterable[str]) -> tuple[str, ...]:
        """The record keys this rule watches, in record order."""
        regex = self._regex  # type: ignore[attr-defined]
        if regex is None:
            return (self.metric,) if self.metric in keys else ()
        return tuple(k for k in keys if k not in _NOT_METRICS and regex.match(k))

    def plan(self, keys: tuple[str, ...]) -> tuple[str, ...] | None:
        """Names to evaluate for a record with these keys; None: skip the rule."""
        names = self.metrics_in(keys)
        return names or None

    def fresh(self) -> "Rule":
        """The same rule with empty state (what an engine evaluates)."""
        return dataclasses.replace(self)

    def state_fields(self) -> list[str]:
        """The names of the fields that hold evaluation state."""
        return [f.name for f in dataclasses.fields(self) if f.metadata.get("state")]

    @staticmethod
    def values(record: Mapping, names: tuple[str, ...]) -> Iterator[tuple[str, float]]:
        """(name, value) of the watched metrics that hold a finite number in this record."""
        for name in names:
            value = _num(record[name])
            if value is not None:
                yield name, value

    def observe(self, record: Mapping) -> None:
        """Keep `solved_metric`'s (and `flat_metric`'s) value from a record the rule is evaluated on."""
        if self.solved_metric:
            value = _num(record.get(self.solved_metric))
            if value is not None:
                self.solved_values.append(value)
            flat = _num(record.get(self.flat_metric)) if self.flat_metric else None
            if flat is not None:
                self.flat_values.append(flat)

    def solved(self) -> float | None:
        """The median of `solved_metric`'s last values when it reaches `solved_at`, else None."""
        if len(self.solved_values) < SOLVED_MIN_POINTS:
            return None
        value = median(self.solved_values)
        if value < self.solved_at:
            return None
        flat = median(self.flat_values) if self.flat_values else None
        return value if flat is None or value >= self.solved_share * flat else None

    def fire(self, condition: bool, name: str, step: int) -> bool:
        """Feed the condition to the latch of `name`; True when an alert is due."""
        latch = self.latches.get(name)
        if latch is None:
            latch = self.latches[name] = _Latch()
        if not condition:
            # Re-arm inline: most evaluations are "all is well".
            latch.count = 0
            latch.active = False
            return False
        return latch.update(True, step, self.for_steps, self.cooldown)

    def alert(self, step: int, time: float | None, name: str, value: float | None, text: str) -> Alert:
        """The alert this rule raises on `name`, with the hint after the text; info without the hint or the
        action when the policy has solved its prompts (`solved_metric`)."""
        solved = self.solved()
        if solved is not None:
            return Alert(step=step, time=time, level="info", rule=self.name, metric=name, value=value, action="none",
                         message=f"{text}; but {self.solved_metric} is {_fmt(solved)} (median of its last "
                                 f"{len(self.solved_values)} logged values): most groups are answered right by every "
                                 f"completion, so this is the task learnt, not a fault. These prompts have little left "
                                 f"to teach: keep the checkpoint and stop, or give harder prompts")
        return Alert(step=step, time=time, level=self.level, rule=self.name, metric=name, value=value,
                     message=f"{text}. {self.hint}" if self.hint else text, action=self.action)

    def update(self, step: int, time: float | None, record: Mapping, names: tuple[str, ...], out: list) -> None:
        """Judge one record on the watched `names`, appending the alerts that fire to `out`."""
        raise NotImplementedError


_OPS = {
    ">": (operator.gt, "above"),
    ">=": (operator.ge, "at or above"),
    "<": (operator.lt, "below"),
    "<=": (operator.le, "at or below"),
    "==": (operator.eq, "equal to"),
    "!=": (operator.ne, "not equal to"),
}


@dataclass(frozen=True, kw_only=True)
class ThresholdRule(Rule):
    """Fires when `metric op value` holds for `for_steps` records in a row.

    With `recent` > 1, a record's condition is that at least `share` of the metric's last `recent` values
    (all of them before there are that many) pass: `recent: 5, share: 0.5` judges the median of the last
    five, so one wild step neither fires nor hides a problem, and a run bad from its first step fires at it.
    """

    kind: ClassVar[str] = "threshold"
    op: str
    value: float
    recent: int = 1
    share: float = 1.0
    passed: dict[str, deque] = state()  # with recent > 1: whether each of the last values passed

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.op not in _OPS:
            raise ValueError(f"key 'op' must be one of {' '.join(_OPS)}, got {self.op!r}")
        if self.recent < 1:
            raise ValueError("key 'recent' must be at least 1")
        if not 0 < self.share <= 1:
            raise ValueError("key 'share' must be above 0 and at most 1")

    def update(self, step, time, record, names, out):
        """Fire on each watched value that passes the threshold for `for_steps` records."""
        compare, words = _OPS[self.op]
        for name, value in self.values(record, names):
            condition = compare(value, self.value)
            if self.recent > 1:
                passed = self.passed.get(name)
                if passed is None:
                    passed = self.passed[name] = deque(maxlen=self.recent)
                passed.append(condition)
                condition = sum(passed) >= self.share * len(passed) - 1e-9
            if self.fire(condition, name, step):
                if self.recent > 1:
                    count = sum(self.passed[name])
                    text = (f"{name} is {_fmt(value)}; {count} of its last {len(self.passed[name])} logged values "
                            f"were {words} {_fmt(self.value)}")
                else:
                    text = f"{name} is {_fmt(value)}, {words} {_fmt(self.value)}"
                out.append(self.alert(step, time, name, value, text + _in_a_row(self.for_steps)))


_SPIKE_DIRECTIONS = ("up", "down", "both")


@dataclass(frozen=True, kw_only=True)
class SpikeRule(Rule):
    """Fires when a value lies `z` standard deviations from the mean of the previous `window`.

    With `log`, the z-score is taken on log(value) (for positive quantities such as a
    gradient norm that vary by factors); `min_std` floors the standard deviation so a
    metric that has been nearly constant does not flag tiny moves.
    """

    kind: ClassVar[str] = "spike"
    window: int
    z: float
    direction: str = "up"
    log: bool = False
    min_std: float = 0.0
    min_points: int = 10
    windows: dict[str, _Window] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 3:
            raise ValueError("key 'window' must be at least 3")
        if self.z <= 0:
            raise ValueError("key 'z' must be positive")
        if self.direction not in _SPIKE_DIRECTIONS:
            raise ValueError(f"key 'direction' must be one of {', '.join(_SPIKE_DIRECTIONS)}, got {self.direction!r}")
        if self.min_std < 0:
            raise ValueError("key 'min_std' must not be negative")
        if not 2 <= self.min_points <= self.window:
            raise ValueError("key 'min_points' must be between 2 and 'window'")

    def update(self, step, time, record, names, out):
        """Fire when a value's z-score against its window passes `z`, then push it."""
        for name, value in self.values(record, names):
            if self.log:
                if value <= 0:
                    continue
                y = math.log(value)
            else:
                y = value
            window = _windowed(self.windows, name, self.window)
            if len(window) >= self.min_points:
                mean = window.mean()
                std = max(window.std(), self.min_std)
                if std > 0:
                    z = (y - mean) / std
                else:
                    z = 0.0 if y == mean else math.copysign(math.inf, y - mean)
                if self.direction == "up":
                    condition = z >= self.z
                elif self.direction == "down":
                    condition = z <= -self.z
                else:
                    condition = abs(z) >= self.z
                if self.fire(condition, name, step):
                    typical = math.exp(mean) if self.log else mean
                    side = "above" if z > 0 else "below"
                    out.append(self.alert(step, time, name, value,
                                          f"{name} jumped to {_fmt(value)}, {abs(z):.1f} standard deviations "
                                          f"{side} its recent level {_fmt(typical)} (last {len(window)} logged steps)"))
            window.push(step, y)


_BASELINE_DIRECTIONS = ("above", "below")


@dataclass(frozen=True, kw_only=True)
class BaselineRule(Rule):
    """Compares a metric with the median of its own first values.

    The baseline is the median of the `baseline_steps` values after the first `skip`.
    above: value >= factor x baseline and value - baseline >= min_change;
    below: value <= factor x baseline and baseline - value >= min_change.
    `min_change` is the absolute floor that keeps noise around a tiny baseline quiet.
    """

    kind: ClassVar[str] = "baseline"
    direction: str
    factor: float
    baseline_steps: int = 10
    skip: int = 0
    min_change: float = 0.0
    seen: dict[str, int] = state()  # values seen per metric before its baseline was set
    early: dict[str, list[float]] = state()  # the values the baseline is the median of
    baseline: dict[str, float] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.direction not in _BASELINE_DIRECTIONS:
            raise ValueError(f"key 'direction' must be one of {', '.join(_BASELINE_DIRECTIONS)}, "
                             f"got {self.direction!r}")
        if self.factor <= 0:
            raise ValueError("key 'factor' must be positive")
        if self.direction == "above" and self.factor < 1:
            raise ValueError("key 'factor' must be at least 1 for direction 'above'")
        if self.direction == "below" and self.factor > 1:
            raise ValueError("key 'factor' must be at most 1 for direction 'below'")
        if self.baseline_steps < 1:
            raise ValueError("key 'baseline_steps' must be at least 1")
        if self.skip < 0:
            raise ValueError("key 'skip' must not be negative")
        if self.min_change < 0:
            raise ValueError("key 'min_change' must not be negative")

    def update(self, step, time, record, names, out):
        """Collect each metric's early values until its baseline is set, then compare with it."""
        for name, value in self.values(record, names):
            base = self.baseline.get(name)
            if base is None:
                seen = self.seen[name] = self.seen.get(name, 0) + 1
                if seen > self.skip:
                    early = self.early.setdefault(name, [])
                    early.append(value)
                    if len(early) >= self.baseline_steps:
                        self.baseline[name] = median(early)
                        del self.early[name]
                continue
            if self.direction == "above":
                condition = value >= self.factor * base and value - base >= self.min_change
            else:
                condition = value <= self.factor * base and base - value >= self.min_change
            if self.fire(condition, name, step):
                relation = (f"{value / base:.3g}x its early median {_fmt(base)}" if base > 0
                            else f"its early median was {_fmt(base)}")
                words = "far above" if self.direction == "above" else "far below"
                out.append(self.alert(step, time, name, value,
                                      f"{name} is {_fmt(value)}, {words} its start: {relation}"
                                      f"{_in_a_row(self.for_steps)}"))


_DROP_DIRECTIONS = ("down", "up")


@dataclass(frozen=True, kw_only=True)
class DropRule(Rule):
    """A sudden fall (or rise) of a metric away from the median of its previous `window` values.

    down: median - value >= `fall`; up: value - median >= `fall`. With `relative`, the difference is
    divided by max(|median|, min_scale), so 1.0 means "lost its whole level". The median, not the mean,
    so the first collapsed values do not drag the reference down and `for_steps` > 1 still compares
    with the level before the collapse. Evaluated once `min_points` previous values are known; with
    `baseline` (a metric name), from the first value on, the reference being the start until then: the
    baseline metric's first value (the held-out evaluation made before the first update), or the metric's
    own first value when that is the more modest (lower for down, higher for up): a greedy held-out
    accuracy can sit far above accuracy sampled at temperature 1. A policy broken by its first updates is
    caught at once (the median of a run that collapsed at step 2 is the collapse itself). Against the start,
    one sampled value, `early_fall` (when set) replaces `fall`: a batch of a few completions moves its mean by
    a third between steps with no harm done. With `noise` (the name of a metric of the same record giving the
    standard error of the watched value, e.g. rewards/total/mean_stderr), a fall must also be at least
    `noise_z` of them: a policy that answers each of 4 prompts the same way every time moves its batch mean
    by a whole prompt between steps, which is which prompts were drawn, not a collapse. A fall of twice the
    threshold (or more) needs no such test: the collapsed step's own standard error can be large. With `reference: best`
    the level is the best of the previous values (the highest for down), not their median: for held-out
    evaluations, few and each precise, where the median of three is the untrained one and a run that reached
    88% and ended at 48% fell from 88%, not from its median.
    """

    kind: ClassVar[str] = "drop"
    window: int
    fall: float
    direction: str = "down"
    relative: bool = False
    min_scale: float = 1e-9
    min_points: int = 0  # 0: the whole window
    baseline: str = ""  # before min_points values, compare with this metric's first value
    early_fall: float = 0.0  # the fall that counts against the start (0: `fall`)
    noise: str = ""  # a metric holding the watched value's standard error in the same record
    noise_z: float = 3.0  # the fewest standard errors a fall must span
    reference: str = "median"  # or "best": of the previous values, what a fall is measured from
    previous: dict[str, deque] = state()
    baseline_first: dict[str, tuple[float, int]] = state()  # the baseline metric's first (value, step)
    first: dict[str, tuple[float, int]] = state()  # each metric's own first (value, step)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_window(self, least=1 if self.reference == "best" else 3)  # the best of one value is that value
        if self.fall <= 0:
            raise ValueError("key 'fall' must be positive (the direction gives the sign)")
        if self.direction not in _DROP_DIRECTIONS:
            raise ValueError(f"key 'direction' must be one of {', '.join(_DROP_DIRECTIONS)}, got {self.direction!r}")
        if self.min_scale <= 0:
            raise ValueError("key 'min_scale' must be positive")
        if metric_pattern(self.baseline) is not None:
            raise ValueError("key 'baseline' takes a plain metric name, not a pattern")
        if metric_pattern(self.noise) is not None:
            raise ValueError("key 'noise' takes a plain metric name, not a pattern")
        if self.noise_z <= 0:
            raise ValueError("key 'noise_z' must be positive")
        if self.reference not in ("median", "best"):
            raise ValueError(f"key 'reference' must be median or best, got {self.reference!r}")

    def plan(self, keys: tuple[str, ...]) -> tuple[str, ...] | None:
        """The watched metrics of the record; the baseline may arrive in a record of its own (the evaluation
        before the first update), which still counts."""
        names = self.metrics_in(keys)
        if names or (self.baseline and self.baseline in keys):
            return names
        return None

    def update(self, step, time, record, names, out):
        """Fire when a value moved `fall` away from the median of the previous values (or, before there are
        enough, from the start: the baseline metric's first value or its own, the more modest), then keep it."""
        if self.baseline and not self.baseline_first and (first := _num(record.get(self.baseline))) is not None:
            self.baseline_first[self.baseline] = (first, step)
        start = self.baseline_first.get(self.baseline)
        noise = _num(record.get(self.noise)) if self.noise else None
        for name, value in self.values(record, names):
            previous = self.previous.get(name)
            if previous is None:
                previous = self.previous[name] = deque(maxlen=self.window)
            level, source, span = None, "its recent median", f", last {len(previous)} logged steps"
            fall = self.fall
            if len(previous) >= self.min_points and self.reference == "best":
                level = max(previous) if self.direction == "down" else min(previous)
                source = "its best"
            elif len(previous) >= self.min_points:
                level = median(previous)
            elif start is not None:
                level, source, span = start[0], f"the start's {self.baseline}", f", step {start[1]}"
                fall = self.early_fall or self.fall
                own, own_step = self.first.setdefault(name, (value, step))
                if (own < level) if self.direction == "down" else (own > level):
                    level, source, span = own, "its first value", f", step {own_step}"
            if level is not None:
                moved = level - value if self.direction == "down" else value - level
                scale = max(abs(level), self.min_scale) if self.relative else 1.0
                # a fall of twice the threshold needs no noise test: a broken policy whose rewards differ a lot
                # between prompts has a large standard error of its own (review 4, V5)
                beyond_noise = noise is None or moved >= self.noise_z * noise or moved / scale >= 2 * fall
                if self.fire(moved / scale >= fall and beyond_noise, name, step):
                    verb = "fell" if self.direction == "down" else "jumped"
                    # the change it is, signed like the move: a fall to zero reads -100%, whatever min_scale asked
                    amount = percent_change(value, level) if self.relative else f"{value - level:+.4g}"
                    errors = f", {moved / noise:.0f} standard errors of the step's {name}" if noise else ""
                    out.append(self.alert(step, time, name, value,
                                          f"{name} {verb} to {_fmt(value)} from {source} {_fmt(level)} "
                                          f"({amount}{span}{errors}){_in_a_row(self.for_steps)}"))
            previous.append(value)
