"""Reward analysis of a run: how good was the reward signal, and which function did what.

Input is what a run directory holds: metric records (metrics.jsonl) and sampled
completions (samples.jsonl, with per-function rewards and `correct`). Output is a
`RewardReport`: the quality score of reward_quality.py, issues and recommendations,
each reward function's importance, trends, correlations between functions, and a
reward-hacking verdict. report.py renders and writes it;
monitor.py runs the same functions on a live loop's history.

This module imports no mlx.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..alerts.alert import Alert
from ..alerts.config import default_rules
from ..alerts.engine import AlertEngine
from ..alerts.rules import Rule
from ..metrics.names import ACCURACY_TRAIN, EVAL_ACCURACY, EVAL_NUM_SAMPLES, LENGTH_MEAN, REWARD_MEAN, TRUNCATED_FRAC
from ..metrics.robust import HELDOUT_Z, proportion_z, verdict
from ..rundir.layout import ALERTS
from ..rundir.writer import json_safe
from .reward_quality import QualityReport, analyze_quality, discriminability
from .run_data import Records, RunData, _corr, _data, series

ACCURACY_METRICS = (EVAL_ACCURACY, ACCURACY_TRAIN)


# --------------------------------------------------------------------------- trends

@dataclass
class Trend:
    """How a metric moved over a run: first-quarter and last-quarter means, the change between them, the
    robust slope and the direction robust.verdict gives (rising, falling, flat or unclear)."""

    metric: str
    start: float  # mean over the first quarter of the run
    end: float  # mean over the last quarter
    change: float
    relative_change: float | None
    slope_per_step: float  # Theil-Sen
    direction: str  # rising | falling | flat | unclear (moved, but not clearly one way: noise)
    points: int
    p_value: float = 1.0  # Mann-Kendall, two-sided
    shift_step: float | None = None  # the step of the level shift that decided the direction, if one did

    @property
    def percent(self) -> str:
        """The change as a percentage of the start, or "" when the start is too close to zero for one to mean
        anything (under a quarter of the change: 0.04 -> -0.26 is -0.3, not -750%)."""
        if self.relative_change is None or abs(self.start) < 0.25 * abs(self.change):
            return ""
        return f"{self.relative_change:+.0%}"

    @property
    def label(self) -> str:
        """The direction in words: 'unclear' says why."""
        if self.direction == "unclear":
            return "noisy, no clear trend"
        if self.shift_step is not None:
            return f"{self.direction}: a jump at step {self.shift_step:.0f}"
        return self.direction


def trend_of(metrics: "Records | RunData", name: str) -> Trend | None:
    """First quarter against last quarter, judged by robust statistics (robust.verdict); None below 8 points."""
    steps, values = metrics.series(name) if isinstance(metrics, RunData) else series(metrics, name)
    if len(values) < 8:
        return None
    v = verdict(steps, values)
    if v is None:
        return None
    return Trend(name, v.start, v.end, v.change, v.relative_change, v.slope, v.direction, v.points, v.p_value,
                 v.shift_step)


def heldout_move(data: RunData) -> Trend | None:
    """Held-out accuracy, first evaluation against last, for runs with too few evaluations for a trend: rising or
    falling when the two proportions (eval/num_samples rows each) differ by HELDOUT_Z standard errors, else flat.
    A 12-step run's train accuracy on 16 samples a step can be noise while held-out went 34% -> 84% on 32."""
    steps, accuracy = data.series(EVAL_ACCURACY)
    rows = dict(zip(*(column.tolist() for column in data.series(EVAL_NUM_SAMPLES))))
    if len(accuracy) < 2 or steps[0] not in rows or steps[-1] not in rows:
        return None
    first, last, n_first, n_last = float(accuracy[0]), float(accuracy[-1]), rows[steps[0]], rows[steps[-1]]
    z = proportion_z(first, n_first, last, n_last)
    direction = "rising" if z >= HELDOUT_Z else "falling" if z <= -HELDOUT_Z else "flat"
    return Trend(EVAL_ACCURACY, first, last, last - first, (last - first) / first if first else None,
                 (last - first) / (float(steps[-1] - steps[0]) or 1.0), direction, len(accuracy))


def reward_trends(metrics: "Records | RunData") -> dict[str, Trend]:
    """Trends of the total and each function's mean reward, accuracy, and completion length."""
    data = _data(metrics)
    names = [REWARD_MEAN, *(f"rewards/{fn}/mean" for fn in data.functions), *ACCURACY_METRICS,
             LENGTH_MEAN]
    out = {}
    for name in names:
        trend = trend_of(data, name)
        if trend is not None:
            out[name] = trend
    return out


# --------------------------------------------------------------------------- importance and correlations

@dataclass
class FunctionImportance:
    """What one reward function adds: its share of the reward, spread, and correlations."""

    name: str
    contribution_pct: float | None  # average share of the absolute weighted reward
    mean: float | None
    std: float | None  # average within-batch std
    constant: bool  # never varied within a batch: adds no signal
    correct_corr: float | None  # correlation of its score with `correct` over samples
    total_corr: float | None  # correlation with the total reward over samples
    length_corr: float | None  # correlation with completion length over samples


def function_importance(metrics: "Records | RunData", samples: Records = ()) -> dict[str, FunctionImportance]:
    """Each reward function's importance, from the metrics and, where given, the samples."""
    data = _data(metrics, samples)
    cols = data.cols
    shares: dict[str, float | None] = {}
    for fn in data.functions:
        _, pct = data.series(f"rewards/{fn}/contribution_pct")
        shares[fn] = float(pct.mean()) if len(pct) else None
    if all(share is None for share in shares.values()) and data.samples:
        # No contribution metric: fall back to the unweighted absolute share in the samples.
        sums = {fn: float(np.nansum(np.abs(cols[fn]))) for fn in data.functions}
        total = sum(sums.values())
        if total > 0:
            shares = {fn: 100.0 * s / total for fn, s in sums.items()}
    out = {}
    for fn in data.functions:
        _, means = data.series(f"rewards/{fn}/mean")
        _, stds = data.series(f"rewards/{fn}/std")
        column = cols[fn]
        known = column[~np.isnan(column)]
        if len(stds):
            constant = bool(np.all(stds == 0))
        else:
            constant = len(known) >= 2 and bool(np.all(known == known[0]))
        mean = float(means.mean()) if len(means) else (float(known.mean()) if len(known) else None)
        out[fn] = FunctionImportance(
            name=fn, contribution_pct=shares.get(fn), mean=mean,
            std=float(stds.mean()) if len(stds) else (float(known.std()) if len(known) else None),
            constant=constant, correct_corr=_corr(column, cols["_correct"]),
            total_corr=_corr(column, cols["_total"]), length_corr=_corr(column, cols["_length"]))
    return out


@dataclass
class Correlation:
    """The correlation of two quantities, over samples or over per-step means."""

    a: str
    b: str
    corr: float
    source: str  # "samples" (per completion) or "metrics" (per-step means)
    note: str


def function_correlations(metrics: "Records | RunData", samples: Records = ()) -> list[Correlation]:
    """Pairwise correlation of reward functions: per completion when samples allow, else per step."""
    data = _data(metrics, samples)
    fns, cols = data.functions, data.cols
    out = []
    for i, a in enumerate(fns):
        for b in fns[i + 1:]:
            corr, source = _corr(cols[a], cols[b], min_n=10), "samples"
            if corr is None:
                steps_a, values_a = data.series(f"rewards/{a}/mean")
                steps_b, values_b = data.series(f"rewards/{b}/mean")
                _, ia, ib = np.intersect1d(steps_a, steps_b, return_indices=True)
                corr, source = _corr(values_a[ia], values_b[ib], min_n=10), "metrics"
            if corr is None:
                continue
            note = ("nearly the same signal: one of them may be redundant" if corr > 0.9 else
                    "they pull in opposite directions" if corr < -0.5 else "")
            out.append(Correlation(a, b, corr, source, note))
    return out


# --------------------------------------------------------------------------- reward hacking

@dataclass
class HackingReport:
    """Whether reward rose while accuracy did not, with the trends and findings behind the verdict."""

    suspected: bool
    verdict: str
    accuracy: dict[str, Trend] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)


def _pct_text(trend: Trend) -> str:
    if trend.percent:
        return f"{trend.percent} ({trend.start:.3g} to {trend.end:.3g})"
    return f"{trend.change:+.3g} ({trend.start:.3g} to {trend.end:.3g})"


def _hacking_rules() -> list[Rule]:
    return [rule for rule in default_rules() if rule.kind == "hacking"]


def detect_reward_hacking(metrics: "Records | RunData", samples: Records = (),
                          importance: Mapping[str, FunctionImportance] | None = None,
                          hacking_alerts: Sequence[Alert] | None = None) -> HackingReport:
    """Whole-run check that reward gains came with correctness gains, plus the built-in hacking rules'
    alerts (replayed over the metrics unless given)."""
    data = _data(metrics, samples)
    fns = data.functions
    importance = function_importance(data) if importance is None else importance
    accuracy = {name: t for name in ACCURACY_METRICS if (t := trend_of(data, name)) is not None}
    if EVAL_ACCURACY not in accuracy and (held_out := heldout_move(data)) is not None:
        accuracy = {EVAL_ACCURACY: held_out, **accuracy}
    findings: list[str] = []
    acc_words = ", ".join(f"{name} {t.direction} {t.change:+.3f}" for name, t in accuracy.items())
    accuracy_not_rising = bool(accuracy) and all(t.direction != "rising" for t in accuracy.values())

    total = trend_of(data, REWARD_MEAN)
    total_rising = total is not None and total.direction == "rising"
    for name in [REWARD_MEAN, *(f"rewards/{fn}/mean" for fn in fns)]:
        trend = trend_of(data, name)
        if trend is None or trend.direction != "rising" or not accuracy_not_rising:
            continue
        fn = name.split("/")[1]
        if name != REWARD_MEAN and (not total_rising or (
                fn in importance and (importance[fn].correct_corr or 0) >= 0.5)):
            # One function up while the total is not: the rewards traded places, nothing was gained to hack
            # with. And a function that scores right answers far above wrong ones is the correctness reward:
            # its partial credit rising with exact accuracy flat is progress toward right answers.
            continue
        if trend.relative_change is None or trend.relative_change >= 0.1:
            findings.append(f"{name} rose {_pct_text(trend)} while accuracy did not improve ({acc_words})")
    if accuracy_not_rising:
        for fn in fns:
            share = trend_of(data, f"rewards/{fn}/contribution_pct")
            if share is not None and share.change >= 15:
                findings.append(f"{fn}'s share of the reward grew from {share.start:.0f}% to {share.end:.0f}% "
                                f"while accuracy did not improve ({acc_words})")
    length = trend_of(data, LENGTH_MEAN)
    # Longer answers while every accuracy measured rises are thinking or tool use that pays off, not a reward
    # bought by length.
    length_grew = (length is not None and length.direction == "rising" and (length.relative_change or 0) >= 0.2
                   and not (accuracy and all(t.direction == "rising" for t in accuracy.values())))
    for fn, info in importance.items():
        mean_trend = trend_of(data, f"rewards/{fn}/mean")
        rising = mean_trend is not None and mean_trend.direction == "rising"
        if length_grew and info.length_corr is not None and info.length_corr >= 0.5:
            findings.append(f"{fn} pays for length (correlation {info.length_corr:.2f} with completion length) "
                            f"and completions grew {_pct_text(length)}")  # type: ignore[arg-type]
        if rising and info.correct_corr is not None and info.correct_corr < -0.2:
            findings.append(f"{fn} is rising but scores wrong answers higher than right ones "
                            f"(correlation {info.correct_corr:.2f} with correctness)")
    if hacking_alerts is None:
        hacking_alerts = AlertEngine(_hacking_rules()).check_all(data.records)
    alerts = list(hacking_alerts)
    suspected = bool(findings or alerts)
    verdict = _hacking_verdict(suspected, total, accuracy, importance)
    return HackingReport(suspected, verdict, accuracy, findings, alerts)


def _hacking_verdict(suspected: bool, reward: Trend | None, accuracy: dict[str, Trend],
                     importance: Mapping[str, FunctionImportance]) -> str:
    """The hacking check's one-line verdict, from what it found and how the reward and accuracy moved."""
    if suspected:
        verdict = "possible reward hacking: reward went up without correctness going up with it"
    elif reward is None:
        verdict = "cannot tell: the total reward was logged over too few steps (8) to have a trend"
    elif reward.direction != "rising":
        # Nothing gained, nothing to explain: saying gains "came with correctness gains" would be false.
        verdict = (f"no reward gains to explain: the total reward was {reward.label} "
                   f"({reward.start:.3g} -> {reward.end:.3g})")
    elif not accuracy and not any(i.correct_corr is not None for i in importance.values()):
        verdict = ("cannot tell: the reward rose, but accuracy was not measured over enough logged steps (8) "
                   "and no samples are marked correct or not")
    elif accuracy and any(t.direction == "rising" for t in accuracy.values()):
        verdict = "no sign of reward hacking: reward gains came with correctness gains (" + ", ".join(
            f"{name} {t.start:.3g} -> {t.end:.3g}" for name, t in accuracy.items()) + ")"
    else:
        verdict = ("no sign of reward hacking: the reward rose and the reward functions score correct "
                   "completions above incorrect ones")
    return verdict


# --------------------------------------------------------------------------- whole report

@dataclass
class RunOutcome:
    """What happened to the task, before any judgement of the reward functions."""

    eval_first: float | None  # held-out accuracy at the first and the last evaluation
    eval_last: float | None
    train_accuracy: Trend | None  # accuracy/train, first quarter against last quarter
    reward: Trend | None  # rewards/total/mean, likewise
    alerts: dict[str, int]  # fired alerts by level
    accuracy_measured: bool = True  # False: the run logged no accuracy at all (its task has no correctness check)
    evaluations: int = 0  # held-out evaluations logged
    eval_first_step: int | None = None
    # the best evaluation, (step, value), when it was neither the first nor the last and the last fell from it
    # by at least BEST_MARGIN: a run can end far below what it reached (the checkpoint of that step is the one
    # to keep), and first -> last alone hides it
    eval_best: tuple[int, float] | None = None
    # accuracy/train at its first and last logged step, (step, value) each, for a run too short for a trend
    train_ends: tuple[tuple[int, float], tuple[int, float]] | None = None

    def improved(self) -> bool | None:
        """Whether the task got better: held-out accuracy up between the first and last evaluation, else
        training accuracy rising, else (no correctness check) the reward rising; None: cannot tell."""
        if self.evaluations >= 2 and self.eval_first is not None and self.eval_last is not None:
            return self.eval_last > self.eval_first
        if self.train_accuracy is not None:
            return self.train_accuracy.direction == "rising"
        if not self.accuracy_measured and self.reward is not None:
            return self.reward.direction == "rising"
        return None

    def headline(self) -> str:
        """One line: held-out accuracy from -> to, the reward's trend, the alerts raised."""
        parts = []
        if self.evaluations >= 2 and self.eval_first is not None and self.eval_last is not None:
            change = 100 * (self.eval_last - self.eval_first)
            best = f"; best {self.eval_best[1]:.1%} at step {self.eval_best[0]}" if self.eval_best else ""
            parts.append(f"held-out accuracy {self.eval_first:.1%} -> {self.eval_last:.1%} "
                         f"({change:+.1f} points{best})")
        elif self.evaluations == 1 and self.eval_first is not None:
            # one evaluation says where the run was, not how it moved
            parts.append(f"held-out accuracy {self.eval_first:.1%} at step {self.eval_first_step} "
                         "(its only evaluation)")
        if self.evaluations < 2 and self.train_accuracy is not None:
            t = self.train_accuracy
            parts.append(f"training accuracy {t.start:.0%} -> {t.end:.0%} ({t.label})")
        elif self.evaluations < 2 and self.train_ends is not None:
            (s0, a0), (s1, a1) = self.train_ends
            parts.append(f"training accuracy {a0:.0%} at step {s0} -> {a1:.0%} at step {s1}")
        elif not self.accuracy_measured:
            parts.append("accuracy n/a (no correctness check)")
        if self.reward is not None:
            parts.append(f"reward {self.reward.start:+.3g} -> {self.reward.end:+.3g} ({self.reward.label})")
        raised = [f"{self.alerts[level]} {level}{'s' if self.alerts[level] != 1 else ''}"
                  for level in ("error", "warning") if self.alerts.get(level)]
        parts.append(f"alerts: {', '.join(raised)}" if raised else "no warnings or errors")
        return ", ".join(parts)


# How far (accuracy, absolute) the last evaluation must sit below the best for the headline to name the best:
# a fact, not a verdict (heldout_accuracy_drop judges the fall); 5 points leaves out a question or two of a
# 100-row evaluation.
BEST_MARGIN = 0.05


def run_outcome(data: RunData, alerts: Sequence[Alert]) -> RunOutcome:
    """Where accuracy and reward started and ended, and the alerts raised, from a run's data."""
    eval_steps, accuracy = data.series(EVAL_ACCURACY)
    best = int(accuracy.argmax()) if len(accuracy) >= 3 else None
    eval_best = ((int(eval_steps[best]), float(accuracy[best]))
                 if best is not None and 0 < best < len(accuracy) - 1 and accuracy[best] - accuracy[-1] >= BEST_MARGIN
                 else None)
    train_steps, train = data.series(ACCURACY_TRAIN)
    counts: dict[str, int] = {}
    for alert in alerts:
        counts[alert.level] = counts.get(alert.level, 0) + 1
    return RunOutcome(float(accuracy[0]) if len(accuracy) else None, float(accuracy[-1]) if len(accuracy) else None,
                      trend_of(data, ACCURACY_TRAIN), trend_of(data, REWARD_MEAN), counts,
                      accuracy_measured=any(data.table.column(name) is not None for name in ACCURACY_METRICS),
                      evaluations=len(accuracy), eval_first_step=int(eval_steps[0]) if len(eval_steps) else None,
                      eval_best=eval_best,
                      train_ends=(((int(train_steps[0]), float(train[0])), (int(train_steps[-1]), float(train[-1])))
                                  if len(train) >= 2 else None))


@dataclass
class RewardReport:
    """Everything `mlx-grpo report` says about a run's rewards."""

    steps: int
    first_step: int | None
    last_step: int | None
    num_samples: int
    functions: list[str]
    quality: QualityReport
    importance: dict[str, FunctionImportance]
    trends: dict[str, Trend]
    correlations: list[Correlation]
    hacking: HackingReport
    alerts: list[Alert]
    alerts_source: str  # "alerts.jsonl" or "replayed built-in rules"
    outcome: RunOutcome  # what happened to the task (the quality score judges the reward functions only)

    def last_line(self) -> str:
        """What happened, then the reward functions' quality, then (when it applies) why that score is no
        praise of this run: the rewards look gamed, or the task did not improve. The trainer ends a run with it."""
        line = f"{self.outcome.headline()}; reward functions' {self.quality.headline()}"
        if self.hacking.suspected:
            why = self.hacking.findings[0] if self.hacking.findings else self.hacking.alerts[0].message
            return f"{line}, but possible reward hacking: {why}"
        if self.outcome.improved() is False:
            return f"{line}, but the task did not improve"
        return line

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-safe data (report.json)."""
        data = asdict(self)
        data["hacking"]["alerts"] = [alert.to_dict() for alert in self.hacking.alerts]
        data["alerts"] = [alert.to_dict() for alert in self.alerts]
        return json_safe(data)


def _issues(report: RewardReport, nonzero: float | None, auc: float | None,
            data: RunData) -> tuple[list[str], list[str]]:
    issues: list[str] = []
    recs: list[str] = []
    parts = {p.name: p for p in report.quality.parts}

    def add(issue: str, rec: str) -> None:
        issues.append(issue)
        if rec not in recs:
            recs.append(rec)

    outcome = report.outcome
    if outcome.eval_first is not None and outcome.eval_last is not None and \
            outcome.eval_last < outcome.eval_first - 0.05:
        add(f"held-out accuracy fell from {outcome.eval_first:.0%} to {outcome.eval_last:.0%}: the policy got worse "
            "at the task, whatever the rewards say",
            "resume from an earlier checkpoint with a lower learning rate or a larger beta, and check the reward "
            "functions for something the policy learned to game")
    if (p := parts["consistency"]).score is not None and p.score < 50:
        add("the mean reward jumps a lot from step to step",
            "use more prompts per step (batch_size) to average out noise, or lower the learning rate")
    if nonzero is not None and nonzero < 0.5:
        add(f"{1 - nonzero:.0%} of groups gave all their completions the same reward without all being right, "
            "and taught nothing",
            "use more generations per prompt, prompts of fitting difficulty, or a reward with partial credit")
    if auc is not None and auc < 0.6:
        add(f"the total reward barely separates correct from incorrect completions (AUC {auc:.2f})",
            "check each reward function on a few known-good and known-bad answers")
    if (p := parts["stability"]).score is not None and p.score < 50:
        add("the spread of rewards within a batch changes a lot between steps",
            "look for steps where one function's scale jumps; normalise or clip its scores")
    if (p := parts["coverage"]).score is not None and p.score < 30:
        add("batches use only a narrow slice of the reward range",
            "add graded (partial-credit) rewards so near-misses score between failure and success")
    # a function at weight 0 (charted, never paid) has no share of the total by design: it is not drowned
    multi = sum(1 for info in report.importance.values() if info.contribution_pct) > 1
    for fn, info in report.importance.items():
        if info.constant:
            add(f"{fn} gave every completion of a batch the same score: it adds no learning signal",
                f"drop {fn} or fix it so it tells completions apart")
        if info.correct_corr is not None and info.correct_corr < -0.1:
            add(f"{fn} pays more to wrong answers than to right ones (correlation {info.correct_corr:.2f})",
                f"check {fn}: it rewards something other than correctness")
        if multi and info.contribution_pct is not None and info.contribution_pct > 80:
            add(f"{fn} makes up {info.contribution_pct:.0f}% of the total reward and drowns the others",
                "rebalance the reward weights so every function can move the total")
    for corr in report.correlations:
        if corr.corr > 0.95:
            add(f"{corr.a} and {corr.b} are almost the same signal (correlation {corr.corr:.2f})",
                f"keep one of {corr.a} and {corr.b}, or lower one weight")
    _, clip = data.series(TRUNCATED_FRAC)
    if len(clip) and clip.mean() > 0.3:
        add(f"{clip.mean():.0%} of completions were cut off at the generation limit",
            "raise max_generation_steps, or penalise overly long completions")
    if report.hacking.suspected:
        add(report.hacking.verdict, "read recent completions in samples.jsonl and tighten the reward that is rising")
    return issues, recs


def analyze_run(metrics: Records, samples: Records = (), alerts: Sequence[Alert] | None = None) -> RewardReport:
    """The full reward report. Without `alerts`, the built-in alert rules are replayed over the metrics."""
    data = RunData(metrics, samples)
    quality = analyze_quality(data)
    _, nonzero, auc = discriminability(data)
    importance = function_importance(data)
    hacking_alerts = None
    if alerts is None:
        alerts, source = AlertEngine(default_rules()).check_all(data.records), "replayed built-in rules"
        names = {rule.name for rule in _hacking_rules()}
        hacking_alerts = [alert for alert in alerts if alert.rule in names]  # no second replay
    else:
        alerts, source = list(alerts), ALERTS
    steps = data.table.steps
    report = RewardReport(
        steps=len(steps), first_step=int(steps[0]) if len(steps) else None,
        last_step=int(steps[-1]) if len(steps) else None, num_samples=len(data.samples),
        functions=data.functions, quality=quality, importance=importance, trends=reward_trends(data),
        correlations=function_correlations(data),
        hacking=detect_reward_hacking(data, importance=importance, hacking_alerts=hacking_alerts),
        alerts=list(alerts), alerts_source=source, outcome=run_outcome(data, alerts))
    quality.issues, quality.recommendations = _issues(report, nonzero, auc, data)
    return report
