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

import math
import operator
import re
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any, ClassVar, Iterable, Mapping, Sequence

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
        # alerts.jsonl holds only finite numbers or null; the message keeps "NaN"/"Inf".
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


# --------------------------------------------------------------------------- rules

@dataclass(frozen=True, kw_only=True)
class Rule:
    """Fields every rule has. `for_steps` and windows count logged records."""

    kind: ClassVar[str] = ""
    name: str
    metric: str
    level: str = "warning"
    for_steps: int = 1
    cooldown: int = 50
    hint: str = ""
    # Left out of repr, which matches saved rule state on resume: stopping does not change what a rule measures.
    action: str = field(default="none", repr=False)

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

    def make_state(self) -> "_RuleState":
        raise NotImplementedError

    def _message(self, text: str) -> str:
        return f"{text}. {self.hint}" if self.hint else text


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

    def make_state(self) -> "_RuleState":
        return _ThresholdState(self)


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

    def make_state(self) -> "_RuleState":
        return _TrendState(self)


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

    def make_state(self) -> "_RuleState":
        return _SpikeState(self)


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

    def make_state(self) -> "_RuleState":
        return _BaselineState(self)


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
        # Accuracy may arrive in a record of its own (an evaluation step): keep it.
        names = tuple(n for n in self.metrics_in(keys) if n not in self.accuracy)
        if names or any(a in keys for a in self.accuracy):
            return names
        return None

    def make_state(self) -> "_RuleState":
        return _HackingState(self)


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

    def make_state(self) -> "_RuleState":
        return _DropState(self)


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

    def make_state(self) -> "_RuleState":
        return _PlateauState(self)


@dataclass(frozen=True, kw_only=True)
class NonFiniteRule(Rule):
    """A NaN or an infinity in any matching metric."""

    kind: ClassVar[str] = "nonfinite"
    metric: str = "**"
    level: str = "error"

    def make_state(self) -> "_RuleState":
        return _NonFiniteState(self)


RULE_KINDS: dict[str, type[Rule]] = {
    cls.kind: cls for cls in (ThresholdRule, TrendRule, SpikeRule, BaselineRule, HackingRule, DropRule,
                              PlateauRule, NonFiniteRule)
}


# --------------------------------------------------------------------------- evaluation state

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
        points = self.points
        while points and points[0][0] < x:
            old = points.popleft()
            self._add(old[0], old[1], -1.0)

    def mean(self) -> float:
        return self.sy / len(self.points)

    def std(self) -> float:
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


class _RuleState:
    """Per-rule evaluation state; `update` appends fired alerts to `out`."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.latches: dict[str, _Latch] = {}

    def fire(self, condition: bool, name: str, step: int) -> bool:
        latch = self.latches.get(name)
        if latch is None:
            latch = self.latches[name] = _Latch()
        if not condition:
            # Re-arm inline: most evaluations are "all is well".
            latch.count = 0
            latch.active = False
            return False
        return latch.update(True, step, self.rule.for_steps, self.rule.cooldown)

    def alert(self, step: int, time: float | None, name: str, value: float | None, text: str) -> Alert:
        rule = self.rule
        return Alert(step=step, time=time, level=rule.level, rule=rule.name, metric=name, value=value,
                     message=rule._message(text), action=rule.action)

    def update(self, step: int, time: float | None, record: Mapping, names: tuple[str, ...], out: list) -> None:
        raise NotImplementedError


def _in_a_row(n: int) -> str:
    return "" if n <= 1 else f" for {n} steps in a row"


class _ThresholdState(_RuleState):
    def update(self, step, time, record, names, out):
        rule: ThresholdRule = self.rule  # type: ignore[assignment]
        compare, words = _OPS[rule.op]
        for name in names:
            value = _num(record[name])
            if value is None:
                continue
            if self.fire(compare(value, rule.value), name, step):
                out.append(self.alert(step, time, name, value,
                                      f"{name} is {_fmt(value)}, {words} {_fmt(rule.value)}{_in_a_row(rule.for_steps)}"))


class _WindowedState(_RuleState):
    """A rule state keeping one window of recent points per metric it watches."""

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.windows: dict[str, _Window] = {}

    def window(self, name: str) -> _Window:
        window = self.windows.get(name)
        if window is None:
            window = self.windows[name] = _Window(self.rule.window)  # type: ignore[attr-defined]
        return window


class _TrendState(_WindowedState):
    def update(self, step, time, record, names, out):
        rule: TrendRule = self.rule  # type: ignore[assignment]
        for name in names:
            value = _num(record[name])
            if value is None:
                continue
            window = self.window(name)
            window.push(step, value)
            if len(window) < rule.min_points:
                continue
            change = window.change()
            if change is None:
                continue
            scale = max(abs(window.mean()), rule.min_scale) if rule.relative else 1.0
            change /= scale
            if rule.direction == "rising":
                condition = change >= rule.change
            elif rule.direction == "falling":
                condition = change <= -rule.change
            else:
                condition = abs(change) <= rule.change
            if self.fire(condition, name, step):
                amount = f"{change * 100:+.0f}%" if rule.relative else f"{change:+.4g}"
                verb = {"rising": "rose", "falling": "fell", "flat": "barely moved"}[rule.direction]
                out.append(self.alert(step, time, name, value,
                                      f"{name} {verb} ({amount}) over the last {len(window)} logged steps, "
                                      f"now {_fmt(value)}"))


class _SpikeState(_WindowedState):
    def update(self, step, time, record, names, out):
        rule: SpikeRule = self.rule  # type: ignore[assignment]
        for name in names:
            value = _num(record[name])
            if value is None:
                continue
            if rule.log:
                if value <= 0:
                    continue
                y = math.log(value)
            else:
                y = value
            window = self.window(name)
            if len(window) >= rule.min_points:
                mean = window.mean()
                std = max(window.std(), rule.min_std)
                if std > 0:
                    z = (y - mean) / std
                else:
                    z = 0.0 if y == mean else math.copysign(math.inf, y - mean)
                if rule.direction == "up":
                    condition = z >= rule.z
                elif rule.direction == "down":
                    condition = z <= -rule.z
                else:
                    condition = abs(z) >= rule.z
                if self.fire(condition, name, step):
                    typical = math.exp(mean) if rule.log else mean
                    side = "above" if z > 0 else "below"
                    out.append(self.alert(step, time, name, value,
                                          f"{name} jumped to {_fmt(value)}, {abs(z):.1f} standard deviations "
                                          f"{side} its recent level {_fmt(typical)} (last {len(window)} logged steps)"))
            window.push(step, y)


class _BaselineState(_RuleState):
    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.seen: dict[str, int] = {}
        self.early: dict[str, list[float]] = {}
        self.baseline: dict[str, float] = {}

    def update(self, step, time, record, names, out):
        rule: BaselineRule = self.rule  # type: ignore[assignment]
        for name in names:
            value = _num(record[name])
            if value is None:
                continue
            base = self.baseline.get(name)
            if base is None:
                seen = self.seen.get(name, 0) + 1
                self.seen[name] = seen
                if seen > rule.skip:
                    early = self.early.setdefault(name, [])
                    early.append(value)
                    if len(early) >= rule.baseline_steps:
                        self.baseline[name] = median(early)
                        del self.early[name]
                continue
            if rule.direction == "above":
                condition = value >= rule.factor * base and value - base >= rule.min_change
            else:
                condition = value <= rule.factor * base and base - value >= rule.min_change
            if self.fire(condition, name, step):
                if base > 0:
                    ratio = f"{value / base:.3g}x"
                    relation = f"{ratio} its early median {_fmt(base)}"
                else:
                    relation = f"its early median was {_fmt(base)}"
                words = "far above" if rule.direction == "above" else "far below"
                out.append(self.alert(step, time, name, value,
                                      f"{name} is {_fmt(value)}, {words} its start: {relation}"
                                      f"{_in_a_row(rule.for_steps)}"))


class _HackingState(_WindowedState):
    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        # Accuracy points are trimmed to the reward window's span when it is evaluated;
        # the bound (accuracy logged at most twice per reward record) caps memory when
        # no reward metric ever arrives.
        self.accuracy = {name: _Window(2 * rule.window) for name in rule.accuracy}  # type: ignore[attr-defined]

    def _accuracy_changes(self, start: float) -> list[tuple[str, float]] | None:
        rule: HackingRule = self.rule  # type: ignore[assignment]
        changes = []
        for name, window in self.accuracy.items():
            window.drop_before(start)
            if len(window) >= rule.min_accuracy_points:
                change = window.change()
                if change is not None:
                    changes.append((name, change))
        return changes or None

    def update(self, step, time, record, names, out):
        rule: HackingRule = self.rule  # type: ignore[assignment]
        for name, window in self.accuracy.items():
            value = _num(record.get(name))
            if value is not None:
                window.push(step, value)
        accuracy: list[tuple[str, float]] | None = None
        stalled: bool | None = None  # accuracy flat or falling; None: not measured yet / unknown
        measured = False
        for name in names:
            value = _num(record[name])
            if value is None:
                continue
            window = self.window(name)
            window.push(step, value)
            if len(window.points) < rule.min_points:
                continue
            if not measured:
                # All reward metrics of one record normally share their history: measure
                # accuracy once, over the steps of the first full window.
                measured = True
                accuracy = self._accuracy_changes(window.points[0][0])
                if accuracy is not None:
                    # The tolerance keeps rounding in the running sums from reading flat as rising.
                    stalled = all(c <= rule.accuracy_change + 1e-9 for _, c in accuracy)
            if stalled is None:
                continue  # no accuracy to compare with: neither fire nor re-arm
            condition = False
            if stalled:
                change = window.change()
                if change is None:
                    continue
                scale = max(abs(window.mean()), rule.min_scale) if rule.relative else 1.0
                rise = change / scale
                condition = rise >= rule.rise
            if self.fire(condition, name, step):
                amount = f"{rise * 100:+.0f}%" if rule.relative else f"{rise:+.4g}"
                acc = ", ".join(f"{a} changed {c:+.3f}" for a, c in accuracy or ())
                out.append(self.alert(step, time, name, value,
                                      f"{name} rose ({amount}) over the last {len(window.points)} logged steps "
                                      f"while {acc}: the policy may be gaming the reward instead of "
                                      f"getting answers right"))


class _DropState(_RuleState):
    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.previous: dict[str, deque] = {}

    def update(self, step, time, record, names, out):
        rule: DropRule = self.rule  # type: ignore[assignment]
        for name in names:
            value = _num(record[name])
            if value is None:
                continue
            previous = self.previous.get(name)
            if previous is None:
                previous = self.previous[name] = deque(maxlen=rule.window)
            if len(previous) >= rule.min_points:
                level = median(previous)
                moved = level - value if rule.direction == "down" else value - level
                scale = max(abs(level), rule.min_scale) if rule.relative else 1.0
                if self.fire(moved / scale >= rule.fall, name, step):
                    verb = "fell" if rule.direction == "down" else "jumped"
                    # signed like the move itself: a fall reads -45%, a jump +45%
                    amount = (f"{(value - level) / scale * 100:+.0f}%" if rule.relative else f"{value - level:+.4g}")
                    out.append(self.alert(step, time, name, value,
                                          f"{name} {verb} to {_fmt(value)} from its recent median {_fmt(level)} "
                                          f"({amount}, last {len(previous)} logged steps){_in_a_row(rule.for_steps)}"))
            previous.append(value)


class _PlateauState(_RuleState):
    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        names = (rule.metric, *rule.together)  # type: ignore[attr-defined]
        self.windows = {name: _Window(rule.window) for name in names}  # type: ignore[attr-defined]
        self.start: dict[str, list[float]] = {name: [] for name in names}

    def _moved(self, name: str) -> float | None:
        """How far `name` moved: max(|change over the window|, |window mean - start mean|); None: unknown."""
        window, start = self.windows[name], self.start[name]
        change = window.change()
        if change is None or len(start) < self.rule.baseline_steps:  # type: ignore[attr-defined]
            return None
        return max(abs(change), abs(window.mean() - sum(start) / len(start)))

    def update(self, step, time, record, names, out):
        rule: PlateauRule = self.rule  # type: ignore[assignment]
        for name, window in self.windows.items():
            value = _num(record.get(name))
            if value is not None:
                window.push(step, value)
                if len(self.start[name]) < rule.baseline_steps:
                    self.start[name].append(value)
        value = _num(record.get(rule.metric))
        if value is None or len(self.windows[rule.metric]) < rule.window:
            return
        moved = self._moved(rule.metric)
        if moved is None:
            return
        level = self.windows[rule.metric].mean()
        scale = max(abs(level), rule.min_scale) if rule.relative else 1.0
        moves = [(rule.metric, moved / scale, rule.change)]
        for name in rule.together:
            # Only a metric logged over most of the window counts; one never logged is left out.
            if len(self.windows[name]) >= rule.window // 2 and (other := self._moved(name)) is not None:
                moves.append((name, other, rule.together_change))
        if self.fire(all(m <= limit for _, m, limit in moves), rule.metric, step):
            named = [n for n, _, _ in moves]
            listed = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
            amounts = ", ".join(f"{m * 100:.1f}%" if n == rule.metric and rule.relative else f"{m:.3g}"
                                for n, m, _ in moves)
            out.append(self.alert(step, time, rule.metric, value,
                                  f"{listed} have not moved over the last {len(self.windows[rule.metric])} logged "
                                  f"steps nor since the start (by at most {amounts})"))


def _nonfinite(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return False
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class _NonFiniteState(_RuleState):
    """One alert per record that has NaN/Inf, however many metrics it breaks.

    A NaN loss turns a dozen policy metrics NaN at once; they are one problem, so the
    rule has a single latch that re-arms when a record is finite again.
    """

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.everything = rule.metric == "**"

    def update(self, step, time, record, names, out):
        if self.everything:
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


# --------------------------------------------------------------------------- engine

_MAX_PLANS = 1024  # distinct record key sets remembered (a run has a handful)


class AlertEngine:
    """Evaluates rules over metric records in step order and returns the alerts that fire."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self._states: list[_RuleState] = []
        self._plans: dict[tuple[str, ...], list[tuple[_RuleState, tuple[str, ...]]]] = {}
        self._records = 0
        for rule in rules:
            self.add_rule(rule)

    def add_rule(self, rule: Rule) -> None:
        if any(state.rule.name == rule.name for state in self._states):
            raise UserError(f"alert rule '{rule.name}' is defined twice")
        self._states.append(rule.make_state())
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
            for state in self._states:
                names = state.rule.plan(keys)
                if names is not None:
                    plan.append((state, names))
            self._plans[keys] = plan
        out: list[Alert] = []
        for state, names in plan:
            state.update(step, time, record, names, out)
        return out

    def check_all(self, records: Iterable[Mapping[str, Any]]) -> list[Alert]:
        out: list[Alert] = []
        for record in records:
            out.extend(self.check(record))
        return out

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Every rule's cooldowns, windows and baselines as plain JSON, matched back by the rule's definition.

        Rule states are small objects of plain data (latches, windows of points, baseline lists), one
        class per rule kind; their fields are walked rather than saved by a pair of methods per class,
        so a new rule kind made of the same plain data is covered without code here.
        """
        return {"records": self._records,
                "rules": [{"rule": repr(state.rule), "fields": _encode_fields(state)} for state in self._states]}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Restore `state_dict`'s output; a rule added or changed since starts fresh."""
        by_rule = {item["rule"]: item["fields"] for item in saved["rules"]}
        self._records = int(saved["records"])
        for state in self._states:
            fields = by_rule.get(repr(state.rule))
            if fields is not None:
                for name, value in fields.items():
                    setattr(state, name, _decode(value))


# Fields of a rule state that are not state: the rule itself comes from the (re)loaded configuration.
_NOT_STATE = ("rule",)


def _field_names(obj: Any) -> list[str]:
    names = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [n for n in dict.fromkeys(names) if n not in _NOT_STATE and hasattr(obj, n)]


def _encode_fields(obj: Any) -> dict[str, Any]:
    return {name: _encode(getattr(obj, name)) for name in _field_names(obj)}


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
    if cls.__module__ == __name__ and not isinstance(value, Rule):
        return {"object": cls.__name__, "fields": _encode_fields(value)}
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
    return _decode_object(value["object"], value["fields"])


def _decode_object(name: str, fields: Mapping[str, Any]) -> Any:
    # Only a state class of this module, made without running its __init__: no code is named by data.
    cls = globals().get(name)
    if not (isinstance(cls, type) and cls.__module__ == __name__) or issubclass(cls, Rule):
        raise ValueError(f"checkpoint names an unknown alert state type {name!r}")
    obj = cls.__new__(cls)
    for field_name, value in fields.items():
        setattr(obj, field_name, _decode(value))
    return obj


__all__ = [
    "LEVELS", "Alert", "AlertEngine", "Rule", "ThresholdRule", "TrendRule", "SpikeRule", "BaselineRule",
    "HackingRule", "DropRule", "PlateauRule", "NonFiniteRule", "RULE_KINDS", "ACTIONS", "metric_pattern",
]
