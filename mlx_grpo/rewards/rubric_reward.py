"""A rubric used as a reward function, and what the trainer logs about it.

The trainer registers `RubricReward(rubric)` as the reward function named "rubric" (weighted by
`--rubric-weight`), merges `step_metrics(step)` into each step's metric record, writes the
bodies from `take_alerts()` to alerts.jsonl (adding step and time), adds `end_epoch()` to the
epoch record, and at the end writes `summary` to the run directory, merges
`summary.final_metrics()` into the final metrics and sends `summary.to_rows()` /
`summary.to_markdown()` to a W&B table / TensorBoard text.
Scoring happens once per batch; every metric here is computed from those scores, so the judge
is never asked twice for the same completion. `state_dict()` / `load_state_dict()` carry the
accumulated statistics through a checkpoint (plain JSON), so a resumed run's epoch and final
numbers cover the whole run.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..telemetry.metrics.reward_stats import RunningStats
from ..telemetry.rundir.layout import RunPaths
from ..telemetry.rundir.writer import atomic_write_text
from .judge import JudgeError
from .rubric import Rubric, RubricScores
from .scoring import RewardHooks

REWARD_NAME = "rubric"
SUMMARY_COLUMNS = ("criterion", "mean", "std", "min", "max", "samples")


class RubricReward(RewardHooks):
    """Callable with the reward-function signature; remembers scores until the trainer logs them."""

    def __init__(self, rubric: Rubric, criteria_every: int = 10):
        if criteria_every < 1:
            raise ValueError(f"criteria_every must be >= 1, got {criteria_every}")
        self.__name__ = REWARD_NAME
        self.rubric = rubric
        self.criteria_every = criteria_every
        self.summary = RubricSummary(rubric)
        self._pending: list[RubricScores] = []
        self._errors: list[JudgeError] = []
        self._failures: dict[str, str] = {}  # python criteria that raised and are not yet reported
        self._reported_failures: set[str] = set()
        self._epoch_tokens = 0
        self._logged_once = False

    def __call__(self, prompts: list[str], completions: list[str], answers: list[str],
                 **columns) -> list[float | None]:
        scores = self.rubric.score(prompts, completions, answers, **columns)
        self._pending.append(scores)
        self._errors.extend(scores.errors)
        for criterion, message in scores.failures.items():
            if criterion not in self._reported_failures:
                self._failures.setdefault(criterion, message)
        self._epoch_tokens += scores.api_tokens
        self.summary.add(scores)
        return scores.total

    def step_metrics(self, step: int) -> dict[str, float | None]:
        """Metrics of every batch scored since the previous call.

        Criterion means and scoring weights come on the first call and on steps divisible by
        `criteria_every`; judge metrics only when the rubric has a judge criterion.
        """
        pending, self._pending = self._pending, []
        include = not self._logged_once or step % self.criteria_every == 0
        self._logged_once = True
        metrics = rubric_metrics(self.rubric, pending, include_criteria=include)
        if self.rubric.judge is not None:
            metrics["judge/api_tokens"] = sum(s.api_tokens for s in pending)
            metrics["judge/api_tokens_total"] = self.summary.api_tokens
            metrics["judge/failed_requests"] = sum(len(s.errors) for s in pending)
        return metrics

    def take_alerts(self) -> list[dict]:
        """Alert bodies for failures since the previous call.

        Judge failures: one alert per criterion and call. A python criterion that raised: one
        alert the first time only (it usually fails every batch in the same way), as for reward
        functions.
        """
        errors, self._errors = self._errors, []
        failures, self._failures = self._failures, {}
        self._reported_failures.update(failures)
        alerts = judge_alerts(errors)
        for criterion, message in failures.items():
            alerts.append({
                "level": "warning",
                "rule": "rubric_criterion_failed",
                "metric": f"criteria/{self.rubric.name}/{criterion}/mean",
                "value": None,
                "message": f"rubric criterion '{criterion}' failed: {message}; its scores are missing "
                           "(further failures are not reported)",
            })
        return alerts

    def describe(self) -> str:
        return self.rubric.describe()

    def final_metrics(self, run_dir: Path | None) -> dict[str, float | int | None]:
        """The per-criterion summary of the run, written to the run directory on rank 0."""
        if run_dir is not None:
            self.summary.write(run_dir)
        return self.summary.final_metrics()

    def end_epoch(self) -> dict[str, int]:
        """Judge tokens spent since the previous epoch ended (the seed's Epoch/APITokens)."""
        tokens, self._epoch_tokens = self._epoch_tokens, 0
        return {"epoch/api_tokens": tokens}

    def state_dict(self) -> dict:
        """What a checkpoint keeps. The trainer drains scores and alerts every step (step_metrics,
        take_alerts) before it checkpoints, so nothing pending needs saving."""
        if self._pending or self._errors or self._failures:
            raise RuntimeError("rubric reward state saved with undrained scores or alerts")
        return {"reported_failures": sorted(self._reported_failures), "epoch_tokens": self._epoch_tokens,
                "logged_once": self._logged_once, "summary": self.summary.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self._reported_failures = set(state["reported_failures"])
        self._epoch_tokens = int(state["epoch_tokens"])
        self._logged_once = bool(state["logged_once"])
        self.summary.load_state_dict(state["summary"])


def rubric_metrics(rubric: Rubric, batches: list[RubricScores], include_criteria: bool) -> dict[str, float | None]:
    """rewards/rubric/{mean,min,max}, and optionally per-criterion means and scoring weights.

    A value nothing could be computed for is None (null in metrics.jsonl), never NaN.
    """
    totals = np.array([t for s in batches for t in s.total if t is not None], dtype=float)
    metrics: dict[str, float | None] = {
        f"rewards/{REWARD_NAME}/mean": float(totals.mean()) if totals.size else None,
        f"rewards/{REWARD_NAME}/min": float(totals.min()) if totals.size else None,
        f"rewards/{REWARD_NAME}/max": float(totals.max()) if totals.size else None,
    }
    if include_criteria:
        matrix = np.concatenate([s.matrix for s in batches]) if batches else np.empty((0, len(rubric.criteria)))
        for j, criterion in enumerate(rubric.criteria):
            column = matrix[:, j][~np.isnan(matrix[:, j])]
            metrics[f"criteria/{rubric.name}/{criterion.name}/mean"] = float(column.mean()) if column.size else None
            metrics[f"scoring/{criterion.name}/weight"] = criterion.weight
    return metrics


def judge_alerts(errors: list[JudgeError]) -> list[dict]:
    """One alert body per criterion that had failures; the trainer adds step and time."""
    by_criterion: dict[str, list[JudgeError]] = defaultdict(list)
    for error in errors:
        by_criterion[error.criterion].append(error)
    alerts = []
    for criterion, failed in by_criterion.items():
        alerts.append({
            "level": "warning",
            "rule": "judge_failed",
            "metric": "judge/failed_requests",
            "value": len(failed),
            "message": f"judge could not score {len(failed)} completion(s) for criterion '{criterion}' "
                       f"(scored as missing): {failed[0].message}",
        })
    return alerts


def _summary_row(stats: RunningStats, label: str) -> dict:
    if stats.count == 0:
        return {"criterion": label, "mean": None, "std": None, "min": None, "max": None, "samples": 0}
    return {"criterion": label, "mean": stats.mean, "std": math.sqrt(stats.variance),
            "min": stats.min, "max": stats.max, "samples": stats.count}


class RubricSummary:
    """Whole-run statistics per criterion, plus the weighted rubric score in a last row named after the rubric."""

    def __init__(self, rubric: Rubric):
        self.rubric = rubric
        self._criteria = {c.name: RunningStats() for c in rubric.criteria}
        self._total = RunningStats()
        self.api_tokens = 0
        self.failed_requests = 0

    def add(self, scores: RubricScores) -> None:
        for j, name in enumerate(scores.criteria):
            self._criteria[name].add(scores.matrix[:, j])
        self._total.add(np.array([np.nan if t is None else t for t in scores.total], dtype=float))
        self.api_tokens += scores.api_tokens
        self.failed_requests += len(scores.errors)

    def state_dict(self) -> dict:
        return {"criteria": {name: stats.state_dict() for name, stats in self._criteria.items()},
                "total": self._total.state_dict(), "api_tokens": self.api_tokens,
                "failed_requests": self.failed_requests}

    def load_state_dict(self, state: dict) -> None:
        if set(state["criteria"]) != set(self._criteria):
            raise ValueError(f"rubric criteria {sorted(state['criteria'])} in the saved state, "
                             f"{sorted(self._criteria)} now")
        for name, stats in state["criteria"].items():
            self._criteria[name].load_state_dict(stats)
        self._total.load_state_dict(state["total"])
        self.api_tokens = int(state["api_tokens"])
        self.failed_requests = int(state["failed_requests"])

    def to_rows(self) -> list[dict]:
        """Rows with SUMMARY_COLUMNS; criteria are named `<rubric>/<criterion>`; std is the population std."""
        rows = [_summary_row(stats, f"{self.rubric.name}/{name}") for name, stats in self._criteria.items()]
        rows.append(_summary_row(self._total, self.rubric.name))
        return rows

    def final_metrics(self) -> dict[str, float | int | None]:
        """final/criteria/<rubric>/<criterion>/{mean,std,min,max,total_samples} for final_metrics.json."""
        metrics: dict[str, float | int | None] = {}
        for name, stats in self._criteria.items():
            row = _summary_row(stats, name)
            prefix = f"final/criteria/{self.rubric.name}/{name}"
            for stat in ("mean", "std", "min", "max"):
                metrics[f"{prefix}/{stat}"] = row[stat]
            metrics[f"{prefix}/total_samples"] = row["samples"]
        return metrics

    def to_markdown(self) -> str:
        lines = [f"Rubric '{self.rubric.name}'", "",
                 "| " + " | ".join(SUMMARY_COLUMNS) + " |",
                 "|" + "---|" * len(SUMMARY_COLUMNS)]
        for row in self.to_rows():
            cells = [row["criterion"]] + [_cell(row[c]) for c in SUMMARY_COLUMNS[1:-1]] + [str(row["samples"])]
            lines.append("| " + " | ".join(cells) + " |")
        if self.rubric.judge is not None:
            lines += ["", f"Judge: {self.api_tokens} API tokens, {self.failed_requests} failed request(s)."]
        return "\n".join(lines) + "\n"

    def write(self, run_dir: str | os.PathLike) -> tuple[Path, Path]:
        """Write rubric_summary.json and rubric_summary.md into the run directory (atomic replace)."""
        run_dir = Path(run_dir)
        document = {
            "rubric": self.rubric.name,
            "rubric_file": str(self.rubric.path),
            "weights": self.rubric.weights,
            "columns": list(SUMMARY_COLUMNS),
            "rows": self.to_rows(),
        }
        if self.rubric.judge is not None:
            document["judge"] = {"api_tokens_total": self.api_tokens, "failed_requests_total": self.failed_requests}
        paths = RunPaths(run_dir)
        json_path = _atomic_write(paths.rubric_summary_json, json.dumps(document, indent=2) + "\n")
        markdown_path = _atomic_write(paths.rubric_summary_md, self.to_markdown())
        return json_path, markdown_path


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _atomic_write(path: Path, text: str) -> Path:
    atomic_write_text(path, text)
    return path
