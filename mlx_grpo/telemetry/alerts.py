"""The alert engine: rules evaluated over metric records, one record at a time.

A metric record is a mapping `{"step": int, "time": float, "<metric>": number, ...}`
with the canonical names of docs/RUN_DIRECTORY.md. The trainer feeds each step's
record to `AlertEngine.check` as it is logged; the dashboard and `mlx-grpo report`
replay a whole metrics.jsonl through the same engine. Rule syntax, the built-in
GRPO rules and the reason for each threshold are in docs/ALERTS.md.

Cost per record is kept flat (the dashboard replays 100k records): the rules that
apply to a record's set of keys are worked out once per distinct key set, rolling
windows keep running sums instead of re-scanning, and the non-finite check sums the
record's values in C before looking at any value one by one.

Rules come from YAML through alert_config.py. This module imports no mlx.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any, ClassVar, Iterable, Iterator, Mapping, Sequence

from ..errors import UserError
from .rundir import scrub_text
from .names import ACCURACY_TRAIN, EVAL_ACCURACY

LEVELS = ("info", "warning", "error")
# What the trainer does when a rule fires: "none" (report it) or "stop" (checkpoint, close the logs, exit 3).
ACTIONS = ("none", "stop")
# Keys of a record that are coordinates, not metrics: never matched by a rule.
_NOT_METRICS = frozenset({"step", "time"})


@dataclass(frozen=True)
class Alert:
    """One fired alert, as written to alerts.jsonl (one JSON object per alert)."""

    step: int
    time: float | None
    level: str
    rule: str
    metric: str
    value: float | None
    message: str
    action: str = "none"  # "stop": the rule stops the run (written to alerts.jsonl only then)

    def __post_init__(self) -> None:
        # Messages carry text from outside (a judge's error body, a reward function's exception): every
        # place an alert goes (alerts.jsonl, TensorBoard, W&B, the report, the console) gets it scrubbed.
        object.__setattr__(self, "message", scrub_text(self.message))

    def to_dict(self) -> dict[str, Any]:
        """The alerts.jsonl object: finite numbers or null (the message keeps "NaN"/"Inf"); the action only
        when there is one."""
        value = self.value if self.value is not None and math.isfinite(self.value) else None
        out = {"step": self.step, "time": self.time, "level": self.level, "rule": self.rule,
               "metric": self.metric, "value": value, "message": self.message}
        if self.action != "none":
            out["action"] = self.action
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Alert":
        """Read back one alerts.jsonl object (the dashboard and the report do)."""
        value, step, time = data.get("value"), data.get("step"), data.get("time")
        finite = isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step)
        return cls(step=int(step) if finite else 0,
                   time=float(time) if isinstance(time, (int, float)) and math.isfinite(time) else None,
                   level=str(data.get("level", "info")),
                   rule=str(data.get("rule", "")), metric=str(data.get("metric", "")),
                   value=float(value) if isinstance(value, (int, float)) else None,
                   message=str(data.get("message", "")),
                   action="stop" if data.get("action") == "stop" else "none")


# --------------------------------------------------------------------------- patterns

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


# --------------------------------------------------------------------------- evaluation helpers

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
    # Left out of repr, which matches saved rule state on resume: stopping does not change what a rule measures.
    action: str = field(default="none", repr=False)
    latches: dict[str, _Latch] = state()

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"key 'action' must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        if not self.name:
            raise ValueError("key 'name' must not be empty")
        if not self.metric:
            raise ValueError("key 'metric' must not be empty")
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
        """The alert this rule raises on `name`, with the hint after the text."""
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
    """Fires when `metric op value` holds for `for_steps` records in a row."""

    kind: ClassVar[str] = "threshold"
    op: str
    value: float

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.op not in _OPS:
            raise ValueError(f"key 'op' must be one of {' '.join(_OPS)}, got {self.op!r}")

    def update(self, step, time, record, names, out):
        """Fire on each watched value that passes the threshold for `for_steps` records."""
        compare, words = _OPS[self.op]
        for name, value in self.values(record, names):
            if self.fire(compare(value, self.value), name, step):
                out.append(self.alert(step, time, name, value,
                                      f"{name} is {_fmt(value)}, {words} {_fmt(self.value)}{_in_a_row(self.for_steps)}"))


def _check_min_points(rule) -> None:
    """`min_points` 0 means the whole window; otherwise at least 3 and at most the window."""
    if rule.min_points == 0:
        object.__setattr__(rule, "min_points", rule.window)
    elif not 3 <= rule.min_points <= rule.window:
        raise ValueError("key 'min_points' must be between 3 and 'window'")


_TREND_DIRECTIONS = ("rising", "falling", "flat")


@dataclass(frozen=True, kw_only=True)
class TrendRule(Rule):
    """Fires on the least-squares change of `metric` over its last `window` records.

    The change is slope x (steps spanned by the window). With `relative`, it is
    divided by max(|window mean|, min_scale), so 0.5 means "grew by half".
    rising: change >= `change`; falling: change <= -`change`; flat: |change| <= `change`.
    Evaluated from `min_points` records on (default: once the window is full), so a
    fast rise early in a run is caught before the window has filled.
    """

    kind: ClassVar[str] = "trend"
    window: int
    direction: str
    change: float
    relative: bool = False
    min_scale: float = 1e-9
    min_points: int = 0  # 0: the whole window
    windows: dict[str, _Window] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 3:
            raise ValueError("key 'window' must be at least 3")
        _check_min_points(self)
        if self.direction not in _TREND_DIRECTIONS:
            raise ValueError(f"key 'direction' must be one of {', '.join(_TREND_DIRECTIONS)}, got {self.direction!r}")
        if self.change < 0:
            raise ValueError("key 'change' must not be negative (the direction gives the sign)")
        if self.min_scale <= 0:
            raise ValueError("key 'min_scale' must be positive")

    def update(self, step, time, record, names, out):
        """Push each value into its window and fire when the window's change goes the rule's way."""
        for name, value in self.values(record, names):
            window = _windowed(self.windows, name, self.window)
            window.push(step, value)
            if len(window) < self.min_points:
                continue
            change = window.change()
            if change is None:
                continue
            change /= max(abs(window.mean()), self.min_scale) if self.relative else 1.0
            if self.direction == "rising":
                condition = change >= self.change
            elif self.direction == "falling":
                condition = change <= -self.change
            else:
                condition = abs(change) <= self.change
            if self.fire(condition, name, step):
                amount = f"{change * 100:+.0f}%" if self.relative else f"{change:+.4g}"
                verb = {"rising": "rose", "falling": "fell", "flat": "barely moved"}[self.direction]
                out.append(self.alert(step, time, name, value,
                                      f"{name} {verb} ({amount}) over the last {len(window)} logged steps, "
                                      f"now {_fmt(value)}"))


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
            raise ValueError(f"key 'direction' must be one of {', '.join(_BASELINE_DIRECTIONS)}, got {self.direction!r}")
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


@dataclass(frozen=True, kw_only=True)
class HackingRule(Rule):
    """A reward going up while correctness does not.

    Fires when `metric` (a reward mean, or a contribution share) changed by at least
    `rise` over its last `window` records (relative as in TrendRule when `relative`)
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
        if self.window < 3:
            raise ValueError("key 'window' must be at least 3")
        _check_min_points(self)
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
                rise = change / (max(abs(window.mean()), self.min_scale) if self.relative else 1.0)
                condition = rise >= self.rise
            if self.fire(condition, name, step):
                amount = f"{rise * 100:+.0f}%" if self.relative else f"{rise:+.4g}"
                acc = ", ".join(f"{a} changed {c:+.3f}" for a, c in accuracy or ())
                out.append(self.alert(step, time, name, value,
                                      f"{name} rose ({amount}) over the last {len(window.points)} logged steps "
                                      f"while {acc}: the policy may be gaming the reward instead of "
                                      f"getting answers right"))


_DROP_DIRECTIONS = ("down", "up")


@dataclass(frozen=True, kw_only=True)
class DropRule(Rule):
    """A sudden fall (or rise) of a metric away from the median of its previous `window` values.

    down: median - value >= `fall`; up: value - median >= `fall`. With `relative`, the difference is
    divided by max(|median|, min_scale), so 1.0 means "lost its whole level". The median, not the mean,
    so the first collapsed values do not drag the reference down and `for_steps` > 1 still compares
    with the level before the collapse. Evaluated once `min_points` previous values are known.
    """

    kind: ClassVar[str] = "drop"
    window: int
    fall: float
    direction: str = "down"
    relative: bool = False
    min_scale: float = 1e-9
    min_points: int = 0  # 0: the whole window
    previous: dict[str, deque] = state()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 3:
            raise ValueError("key 'window' must be at least 3")
        _check_min_points(self)
        if self.fall <= 0:
            raise ValueError("key 'fall' must be positive (the direction gives the sign)")
        if self.direction not in _DROP_DIRECTIONS:
            raise ValueError(f"key 'direction' must be one of {', '.join(_DROP_DIRECTIONS)}, got {self.direction!r}")
        if self.min_scale <= 0:
            raise ValueError("key 'min_scale' must be positive")

    def update(self, step, time, record, names, out):
        """Fire when a value moved `fall` away from the median of the previous values, then keep it."""
        for name, value in self.values(record, names):
            previous = self.previous.get(name)
            if previous is None:
                previous = self.previous[name] = deque(maxlen=self.window)
            if len(previous) >= self.min_points:
                level = median(previous)
                moved = level - value if self.direction == "down" else value - level
                scale = max(abs(level), self.min_scale) if self.relative else 1.0
                if self.fire(moved / scale >= self.fall, name, step):
                    verb = "fell" if self.direction == "down" else "jumped"
                    # signed like the move itself: a fall reads -45%, a jump +45%
                    amount = (f"{(value - level) / scale * 100:+.0f}%" if self.relative else f"{value - level:+.4g}")
                    out.append(self.alert(step, time, name, value,
                                          f"{name} {verb} to {_fmt(value)} from its recent median {_fmt(level)} "
                                          f"({amount}, last {len(previous)} logged steps){_in_a_row(self.for_steps)}"))
            previous.append(value)


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


def _nonfinite(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return False
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True)
class NonFiniteRule(Rule):
    """A NaN or an infinity in any matching metric: one alert per record, however many metrics it breaks.

    A NaN loss turns a dozen policy metrics NaN at once; they are one problem, so the rule has a single
    latch that re-arms when a record is finite again.
    """

    kind: ClassVar[str] = "nonfinite"
    metric: str = "**"
    level: str = "error"

    def update(self, step, time, record, names, out):
        """One alert for a record holding NaN or infinity in a watched metric."""
        if self.metric == "**":
            # Fast path: a NaN or Inf anywhere makes the sum non-finite. filter(None, ...)
            # drops nulls and zeros, which cannot change that.
            try:
                finite = math.isfinite(sum(filter(None, record.values())))
            except TypeError:
                finite = False  # text in a record: look at every value
            if finite:
                self.fire(False, "*", step)
                return
        bad = [name for name in names if _nonfinite(record[name])]
        if self.fire(bool(bad), "*", step):
            value = float(record[bad[0]])
            listed = ", ".join(f"{name}={_fmt(float(record[name]))}" for name in bad[:5])
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            out.append(self.alert(step, time, bad[0], value, f"non-finite values at step {step}: {listed}{more}"))


RULE_KINDS: dict[str, type[Rule]] = {
    cls.kind: cls for cls in (ThresholdRule, TrendRule, SpikeRule, BaselineRule, HackingRule, DropRule,
                              PlateauRule, NonFiniteRule)
}


# --------------------------------------------------------------------------- engine

_MAX_PLANS = 1024  # distinct record key sets remembered (a run has a handful)


class AlertEngine:
    """Evaluates rules over metric records in step order and returns the alerts that fire."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self._rules: list[Rule] = []
        self._plans: dict[tuple[str, ...], list[tuple[Rule, tuple[str, ...]]]] = {}
        self._records = 0
        for rule in rules:
            self.add_rule(rule)

    @property
    def rules(self) -> list[Rule]:
        """The rules evaluated, each holding its state of this run."""
        return list(self._rules)

    def add_rule(self, rule: Rule) -> None:
        """Evaluate one more rule, with fresh state (the rule given is left untouched)."""
        if any(r.name == rule.name for r in self._rules):
            raise UserError(f"alert rule '{rule.name}' is defined twice")
        self._rules.append(rule.fresh())
        self._plans.clear()

    def check(self, record: Mapping[str, Any]) -> list[Alert]:
        """Feed one metric record; returns the alerts it fires (usually none)."""
        self._records += 1
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = self._records
        time = record.get("time")
        keys = tuple(record)
        plan = self._plans.get(keys)
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()  # a stream whose key sets keep changing: stay bounded
            plan = []
            for rule in self._rules:
                names = rule.plan(keys)
                if names is not None:
                    plan.append((rule, names))
            self._plans[keys] = plan
        out: list[Alert] = []
        for rule, names in plan:
            rule.update(step, time, record, names, out)
        return out

    def check_all(self, records: Iterable[Mapping[str, Any]]) -> list[Alert]:
        """Feed every record in order; returns all the alerts fired."""
        out: list[Alert] = []
        for record in records:
            out.extend(self.check(record))
        return out

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Every rule's cooldowns, windows and baselines as plain JSON, matched back by the rule's definition.

        A rule's state is its `state()` fields, made of plain data and the small types of STATE_TYPES; they
        are walked rather than saved by a method per kind, so a new kind of the same data needs no code here.
        """
        return {"records": self._records,
                "rules": [{"rule": repr(rule), "fields": {name: _encode(getattr(rule, name))
                                                          for name in rule.state_fields()}}
                          for rule in self._rules]}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Restore `state_dict`'s output; a rule added or changed since starts fresh."""
        by_rule = {item["rule"]: item["fields"] for item in saved["rules"]}
        self._records = int(saved["records"])
        for rule in self._rules:
            fields = by_rule.get(repr(rule))
            if fields is not None:
                for name in rule.state_fields():
                    if name in fields:
                        object.__setattr__(rule, name, _decode(fields[name]))


def _slots(obj: Any) -> list[str]:
    return [name for cls in type(obj).__mro__ for name in cls.__dict__.get("__slots__", ())]


def _encode(value: Any) -> Any:
    """JSON for plain data. Every JSON object in the output is tagged with what it stands for."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, deque):
        return {"deque": [_encode(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    cls = type(value)
    if STATE_TYPES.get(cls.__name__) is cls:
        return {"object": cls.__name__, "fields": {name: _encode(getattr(value, name)) for name in _slots(value)}}
    raise TypeError(f"alert engine state holds a {cls.__module__}.{cls.__name__}, which a checkpoint cannot store")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "float" in value:
        return float(value["float"])
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "deque" in value:
        return deque((_decode(v) for v in value["deque"]), maxlen=value["maxlen"])
    if "dict" in value:
        return {_decode(k): _decode(v) for k, v in value["dict"]}
    # Only a type of STATE_TYPES, made without running its __init__: no code is named by data.
    cls = STATE_TYPES.get(value["object"])
    if cls is None:
        raise ValueError(f"checkpoint names an unknown alert state type {value['object']!r}")
    obj = cls.__new__(cls)
    for field_name, field_value in value["fields"].items():
        setattr(obj, field_name, _decode(field_value))
    return obj


__all__ = [
    "LEVELS", "Alert", "AlertEngine", "Rule", "ThresholdRule", "TrendRule", "SpikeRule", "BaselineRule",
    "HackingRule", "DropRule", "PlateauRule", "NonFiniteRule", "RULE_KINDS", "ACTIONS", "metric_pattern",
]
