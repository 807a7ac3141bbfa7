"""The quality of a run's reward signal: a score out of 100 from four parts, each explained in words
(weights as reward-monitoring dashboards use them):
- consistency 25%: the step-to-step jitter of the mean reward against the spread of
  rewards within a batch (a jumpy mean is noise or instability);
- discriminability 35%: the share of groups whose completions got different rewards
  (GRPO learns only from those) and, when samples say which completions were correct,
  how often a correct completion outscores an incorrect one (AUC);
- stability 25%: how steady the within-batch spread of rewards stays over the run
  (coefficient of variation of rewards/total/std);
- coverage 15%: how much of the run's reward range a typical batch spans.

reward_report.py adds the issues and recommendations. This module imports no mlx.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..metrics.names import REWARD_MEAN, REWARD_STD, SOLVED_GROUP_FRAC, ZERO_STD_GROUP_FRAC
from .run_data import Records, RunData, _auc, _clip01, _data

QUALITY_WEIGHTS = {"consistency": 0.25, "discriminability": 0.35, "stability": 0.25, "coverage": 0.15}
MIN_POINTS = 5  # fewer logged steps than this and a part is not scored


@dataclass
class QualityPart:
    """One part of the reward-quality score: its weight, its 0-100 score and why."""

    name: str
    weight: float
    score: float | None  # 0-100; None when the run lacks the data
    explanation: str


@dataclass
class QualityReport:
    """The reward functions' quality: the weighted score of its parts, the issues found and what to do."""

    score: float | None  # the weighted mean of the parts that could be scored; None when none could
    parts: list[QualityPart]
    issues: list[str] = field(default_factory=list)
    recommendations: list[str] = field(default_factory=list)

    @property
    def parts_scored(self) -> int:
        """How many parts the run had the data to score."""
        return sum(part.score is not None for part in self.parts)

    def headline(self) -> str:
        """'quality 72/100', with how many parts it rests on when some could not be scored."""
        if self.score is None:
            return f"quality n/a (none of its {len(self.parts)} parts could be scored)"
        if 2 * self.parts_scored < len(self.parts):  # a score resting on one part of four reads as a verdict
            return (f"quality not judged yet ({self.parts_scored} of {len(self.parts)} parts have the "
                    f"{MIN_POINTS} logged steps they need)")
        note = "" if self.parts_scored == len(self.parts) else f" (from {self.parts_scored} of {len(self.parts)} parts)"
        return f"quality {self.score:.0f}/100{note}"


def _consistency(data: RunData) -> QualityPart:
    weight = QUALITY_WEIGHTS["consistency"]
    _, mean = data.series(REWARD_MEAN)
    _, std = data.series(REWARD_STD)
    if len(mean) < MIN_POINTS or len(std) == 0:
        return QualityPart("consistency", weight, None,
                           f"needs rewards/total/mean and /std over at least {MIN_POINTS} logged steps")
    jitter = float(np.median(np.abs(np.diff(mean))))
    spread = float(np.median(std))
    if spread <= 0:
        score = 100.0 if jitter == 0 else 0.0
        return QualityPart("consistency", weight, score,
                           "every completion in a batch got the same reward, so there is no spread to compare "
                           f"the step-to-step movement ({jitter:.3g}) with")
    ratio = jitter / spread
    score = 100.0 * _clip01(1.0 - ratio)
    verdict = ("steady" if score >= 70 else
               "somewhat jumpy" if score >= 40 else "jumpy: the batch mean is mostly noise or training is unstable")
    return QualityPart("consistency", weight, score,
                       f"from one step to the next the mean reward moves by {jitter:.3g} (median), "
                       f"{ratio:.0%} of the typical spread within a batch ({spread:.3g}): {verdict}")


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and \
        np.isfinite(value) else None


def discriminability(data: RunData) -> tuple[QualityPart, float | None, float | None]:
    """The discriminability part, with the share of groups that taught something and the AUC it rests on."""
    weight = QUALITY_WEIGHTS["discriminability"]
    # Groups answered right by every completion are flat too, and are the task learnt, not a reward that
    # cannot tell completions apart (the alert rules judge them the same way): only the other flat groups count.
    flat = [_num(r.get(ZERO_STD_GROUP_FRAC)) for r in data.records]
    solved = [_num(r.get(SOLVED_GROUP_FRAC)) or 0.0 for r in data.records]
    unsolved_flat = [max(0.0, f - s) for f, s in zip(flat, solved) if f is not None]
    nonzero = float(1.0 - np.mean(unsolved_flat)) if unsolved_flat else None
    auc = None
    total, correct = data.cols["_total"], data.cols["_correct"]
    known = ~(np.isnan(total) | np.isnan(correct))
    positive, negative = total[known & (correct == 1)], total[known & (correct == 0)]
    if len(positive) >= 3 and len(negative) >= 3:
        auc = _auc(positive, negative)
    measures, words = [], []
    if nonzero is not None:
        measures.append(nonzero)
        words.append(f"in {nonzero:.0%} of groups the completions got different rewards (GRPO learns only from "
                     f"those) or were all right (the task learnt)")
    if auc is not None:
        measures.append(_clip01(2.0 * auc - 1.0))
        words.append(f"a correct completion outscored an incorrect one {auc:.0%} of the time (AUC {auc:.2f}; "
                     "0.5 is chance)")
    if not measures:
        return (QualityPart("discriminability", weight, None,
                            "needs rewards/zero_std_group_frac, "
                            "or samples with both correct and incorrect completions"),
                nonzero, auc)
    return QualityPart("discriminability", weight, 100.0 * float(np.mean(measures)), "; ".join(words)), nonzero, auc


def _stability(data: RunData) -> QualityPart:
    weight = QUALITY_WEIGHTS["stability"]
    _, std = data.series(REWARD_STD)
    if len(std) < MIN_POINTS:
        return QualityPart("stability", weight, None,
                           f"needs rewards/total/std over at least {MIN_POINTS} logged steps")
    mean_std = float(std.mean())
    if mean_std <= 0:
        return QualityPart("stability", weight, 0.0, "the rewards within a batch never differed")
    cv = float(std.std() / mean_std)
    score = 100.0 * _clip01(1.0 - cv)
    verdict = "steady" if score >= 70 else "changing a lot between steps"
    return QualityPart("stability", weight, score,
                       f"the spread of rewards within a batch varies by {cv:.0%} of its average ({mean_std:.3g}) "
                       f"across the run: {verdict}")


def _coverage(data: RunData) -> QualityPart:
    weight = QUALITY_WEIGHTS["coverage"]
    steps_lo, lo = data.series("rewards/total/min")
    steps_hi, hi = data.series("rewards/total/max")
    if len(lo) < MIN_POINTS or len(lo) != len(hi) or not np.array_equal(steps_lo, steps_hi):
        return QualityPart("coverage", weight, None,
                           f"needs rewards/total/min and /max over at least {MIN_POINTS} logged steps")
    # Percentiles, so one outlier batch does not define the range for the whole run.
    low, high = float(np.percentile(lo, 2)), float(np.percentile(hi, 98))
    if high <= low:
        return QualityPart("coverage", weight, 0.0, "every completion of the run got the same reward")
    share = float(np.clip((hi - lo) / (high - low), 0.0, 1.0).mean())
    return QualityPart("coverage", weight, 100.0 * share,
                       f"a typical batch spans {share:.0%} of the run's reward range ({low:.3g} to {high:.3g})")


def analyze_quality(metrics: "Records | RunData", samples: Records = ()) -> QualityReport:
    """The quality score and its parts (issues and recommendations are added by analyze_run)."""
    data = _data(metrics, samples)
    disc, _, _ = discriminability(data)
    parts = [_consistency(data), disc, _stability(data), _coverage(data)]
    scored = [p for p in parts if p.score is not None]
    score = None
    if scored:
        total_weight = sum(p.weight for p in scored)
        score = sum(p.weight * p.score for p in scored) / total_weight  # type: ignore[operator]
    return QualityReport(score=score, parts=parts)
