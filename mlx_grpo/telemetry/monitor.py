"""Reward monitoring for people who drive their own training loop.

`RewardMonitor` turns each step's per-function rewards (plus KL, entropy and which
completions were correct, when known) into the same metric records the trainer
writes, runs the alert engine on them, and answers questions about the run so far:
summaries, recent trends, one function's statistics, reward quality and function
importance, reward hacking. It records through the trainer's own `RunRecorder`
(its trackers and alert engine, without sinks), and the analysis is telemetry/analysis/'s,
so a hand-written loop and `mlx-grpo train` report the same numbers. Example:
docs/ALERTS.md. Imports no mlx.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any, Mapping, Sequence

import numpy as np
from rich.console import Console

from .alerts.alert import Alert
from .alerts.config import default_rules
from .alerts.console import print_alerts
from .alerts.engine import AlertEngine
from .alerts.rules import Rule, ThresholdRule
from .alerts.trend_rules import TrendRule
from .analysis.reward_quality import QualityReport
from .analysis.reward_report import (
    FunctionImportance,
    HackingReport,
    RewardReport,
    Trend,
    analyze_run,
    detect_reward_hacking,
    function_importance,
    trend_of,
)
from .analysis.run_data import series
from .metrics.names import ACCURACY_TRAIN, ENTROPY, KL, LENGTH_MEAN, REWARD_MEAN, SIGNAL_TO_NOISE, ZERO_STD_GROUP_FRAC
from .metrics.reward_stats import reward_metrics
from .recorder import RunRecorder

_CONDITIONS = {"above": ">", "below": "<", "at_least": ">=", "at_most": "<="}


class RewardMonitor:
    """Track a GRPO loop's rewards step by step, raise alerts, analyse the run so far.

    `reward_names` fixes the functions (default: the keys of the first `track_step`);
    `weights` maps function name to its weight in the total (default 1 each);
    `group_size` is G when the N completions of a step are B prompt groups of G
    (default: the whole step is one group). `rules` defaults to the built-in GRPO
    rules; pass [] to start with none. Samples kept for the analysis are capped at
    `max_samples` (the oldest go first).
    """

    def __init__(self, reward_names: Sequence[str] | None = None, *, weights: Mapping[str, float] | None = None,
                 group_size: int | None = None, rules: Sequence[Rule] | None = None, print_alerts: bool = False,
                 console: Console | None = None, max_samples: int = 20_000) -> None:
        self.reward_names = list(reward_names) if reward_names is not None else None
        self.weights = dict(weights or {})
        self.group_size = group_size
        self.engine = AlertEngine(default_rules() if rules is None else rules)
        self.print_alerts = print_alerts
        self.console = console
        self.records: list[dict[str, Any]] = []
        self.samples: deque[dict[str, Any]] = deque(maxlen=max_samples)
        self.alerts: list[Alert] = []
        self._recorder: RunRecorder | None = None

    # ------------------------------------------------------------------ tracking

    def track_step(self, step: int, rewards: Mapping[str, Sequence[float | None]], *, kl: float | None = None,
                   entropy: float | None = None, correct: Sequence[bool] | None = None,
                   lengths: Sequence[float] | None = None, extra: Mapping[str, float] | None = None) -> dict[str, Any]:
        """Record one step; returns its metric record (canonical names). Alerts land in `self.alerts`.

        `rewards` maps each function to its scores for the step's N completions (None: no
        score). `correct` and `lengths` are per completion too; `extra` adds any other
        metrics (canonical names) to the record.
        """
        names = self._names(rewards)
        sizes = {len(rewards[name]) for name in names}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError("rewards must give every function the same, non-zero number of scores")
        scores = np.array([[np.nan if v is None else float(v) for v in rewards[name]] for name in names], dtype=float)
        n = scores.shape[1]
        weights = [float(self.weights.get(name, 1.0)) for name in names]
        total = np.nansum(np.asarray(weights)[:, None] * scores, axis=0)
        group = self.group_size or n
        if n % group:
            raise ValueError(f"{n} completions do not split into groups of {group}")
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        record.update(reward_metrics(scores, names, weights, total, group))
        if kl is not None:
            record[KL] = float(kl)
        if entropy is not None:
            record[ENTROPY] = float(entropy)
        if correct is not None:
            if len(correct) != n:
                raise ValueError(f"correct has {len(correct)} entries for {n} completions")
            record[ACCURACY_TRAIN] = float(np.mean(np.asarray(correct, dtype=bool)))
        if lengths is not None:
            if len(lengths) != n:
                raise ValueError(f"lengths has {len(lengths)} entries for {n} completions")
            record[LENGTH_MEAN] = float(np.mean(lengths))
        record.update(extra or {})
        self.records.append(record)
        for i in range(n):
            self.samples.append({
                "step": int(step), "rewards": {name: (None if np.isnan(scores[k, i]) else float(scores[k, i]))
                                               for k, name in enumerate(names)},
                "total": float(total[i]),
                "correct": bool(correct[i]) if correct is not None else None,
                "length": float(lengths[i]) if lengths is not None else None,
            })
        self._raise(self._recorder.observe(step, record, scores, total))  # type: ignore[union-attr]
        return record

    def _names(self, rewards: Mapping[str, Sequence]) -> list[str]:
        if self.reward_names is None:
            self.reward_names = list(rewards)
        if self._recorder is None:
            self._recorder = RunRecorder(self.reward_names, (), engine=self.engine)  # rules may be added until now
        missing = [name for name in self.reward_names if name not in rewards]
        unknown = [name for name in rewards if name not in self.reward_names]
        if missing or unknown:
            raise ValueError(f"reward functions must be {self.reward_names}; missing {missing}, unknown {unknown}")
        return self.reward_names

    # ------------------------------------------------------------------ alerts

    def add_rule(self, rule: Rule) -> None:
        """Watch one more alert rule."""
        self.engine.add_rule(rule)

    def add_threshold_alert(self, metric: str, threshold: float, condition: str = "above", *,
                            level: str = "warning", for_steps: int = 1, name: str | None = None,
                            hint: str = "") -> Rule:
        """Alert when `metric` is above/below (or at_least/at_most) `threshold` for `for_steps` steps."""
        if condition not in _CONDITIONS:
            raise ValueError(f"condition must be one of {', '.join(_CONDITIONS)}, got {condition!r}")
        rule = ThresholdRule(name=name or f"{metric} {condition} {threshold:g}", metric=metric,
                             op=_CONDITIONS[condition], value=float(threshold), level=level, for_steps=for_steps,
                             hint=hint)
        self.add_rule(rule)
        return rule

    def add_trend_alert(self, metric: str, change: float, direction: str = "falling", *, window: int = 10,
                        relative: bool = False, level: str = "warning", name: str | None = None,
                        hint: str = "") -> Rule:
        """Alert when `metric` rose/fell by at least `change` (or stayed within it: "flat") over `window` steps."""
        rule = TrendRule(name=name or f"{metric} {direction} over {window}", metric=metric, window=window,
                         direction=direction, change=float(change), relative=relative, level=level, hint=hint)
        self.add_rule(rule)
        return rule

    def check_metrics(self, step: int, metrics: Mapping[str, Any]) -> list[Alert]:
        """Run the alert rules on metrics of your own (canonical names); returns the alerts fired."""
        fired = self.engine.check({"step": int(step), "time": time.time(), **metrics})
        self._raise(fired)
        return fired

    def _raise(self, fired: list[Alert]) -> None:
        self.alerts.extend(fired)
        if fired and self.print_alerts:
            print_alerts(fired, self.console)

    def alert_summary(self) -> dict[str, Any]:
        """How many alerts fired, by level and by rule."""
        return {"total": len(self.alerts), "by_level": dict(Counter(a.level for a in self.alerts)),
                "by_rule": dict(Counter(a.rule for a in self.alerts)),
                "latest": [a.to_dict() for a in self.alerts[-5:]]}

    # ------------------------------------------------------------------ questions

    def summary(self) -> dict[str, Any]:
        """Steps tracked, whole-run statistics per function and of the total, the latest step's means."""
        latest = self.records[-1] if self.records else {}
        means = {k: v for k, v in latest.items()
                 if k.startswith("rewards/") and (k.endswith("/mean") or k in (SIGNAL_TO_NOISE,
                                                                                 ZERO_STD_GROUP_FRAC))}
        for key in (KL, ENTROPY, ACCURACY_TRAIN):
            if key in latest:
                means[key] = latest[key]
        return {"steps": len(self.records), "last_step": latest.get("step"),
                "run": self._recorder.rewards.final_metrics() if self._recorder else {}, "latest": means,
                "alerts": dict(Counter(a.level for a in self.alerts))}

    def recent_trends(self, num_steps: int = 50) -> dict[str, Trend]:
        """Trends over the last `num_steps` tracked steps (first quarter against last quarter)."""
        recent = self.records[-num_steps:]
        names = [REWARD_MEAN, *(f"rewards/{fn}/mean" for fn in self.reward_names or ()),
                 SIGNAL_TO_NOISE, KL, ENTROPY, ACCURACY_TRAIN]
        return {name: t for name in names if (t := trend_of(recent, name)) is not None}

    def function_stats(self, name: str) -> dict[str, Any]:
        """One function: whole-run mean/std/min/max over every score, latest and recent mean, share, trend."""
        if not self.reward_names or name not in self.reward_names:
            raise KeyError(f"no reward function named {name!r}; tracked: {self.reward_names}")
        final = self._recorder.rewards.final_metrics() if self._recorder else {}
        stats: dict[str, Any] = {key.rsplit("/", 1)[1]: value for key, value in final.items()
                                 if key.startswith(f"final/{name}/")}
        latest = self.records[-1] if self.records else {}
        stats["latest_mean"] = latest.get(f"rewards/{name}/mean")
        stats["recent_mean"] = latest.get(f"rewards/{name}/recent_mean")
        _, share = series(self.records, f"rewards/{name}/contribution_pct")
        stats["contribution_pct"] = float(share.mean()) if len(share) else None
        stats["trend"] = trend_of(self.records, f"rewards/{name}/mean")
        return stats

    def report(self) -> RewardReport:
        """The full reward report of the steps so far (as `mlx-grpo report` writes for a run)."""
        return analyze_run(self.records, list(self.samples), self.alerts)

    def analyze_quality(self) -> QualityReport:
        """Quality score out of 100 with its four parts, issues and recommendations."""
        return self.report().quality

    def function_importance(self) -> dict[str, FunctionImportance]:
        """Each reward function's importance over the steps observed so far."""
        return function_importance(self.records, list(self.samples))

    def detect_hacking(self) -> HackingReport:
        """Whether reward rose while accuracy did not, over the steps observed so far."""
        return detect_reward_hacking(self.records, list(self.samples))
