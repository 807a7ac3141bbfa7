"""A run's metrics and samples as columns, and the small statistics the analysis takes of them."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..metrics.other_names import canonical_record
from ..rundir.metric_table import table_from_records


def series(metrics: Iterable[Mapping[str, Any]], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric over the records that hold a finite value of it."""
    steps, values = [], []
    for i, record in enumerate(metrics):
        value = record.get(name)
        if value is None or isinstance(value, (str, bool)):
            continue
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            step = record.get("step")
            steps.append(float(step) if isinstance(step, (int, float)) else float(i))
            values.append(value)
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def _finite(value: Any) -> float:
    """A sample field as a float; NaN when missing or not a finite number."""
    if type(value) is float:
        return value if value - value == 0.0 else math.nan
    if value is None or isinstance(value, (str, bool)):
        return math.nan
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


class RunData:
    """A run's records parsed once: metric columns (the dashboard's MetricTable, so a
    resumed run counts each step once), reward function names, per-completion columns."""

    def __init__(self, metrics: Sequence[Mapping[str, Any]], samples: Sequence[Mapping[str, Any]] = ()) -> None:
        self.records = [canonical_record(r) for r in metrics]
        self.table, _ = table_from_records(self.records)
        self.samples = list(samples)
        self.functions = self._function_names()
        self.cols = self._sample_columns()
        self._series: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, finite values) of one metric."""
        cached = self._series.get(name)
        if cached is None:
            column = self.table.column(name)
            if column is None:
                cached = (np.empty(0), np.empty(0))
            else:
                keep = np.isfinite(column)
                cached = (self.table.steps[keep], column[keep])
            self._series[name] = cached
        return cached

    def _function_names(self) -> list[str]:
        """Reward function names in order of first appearance (metrics first, then samples)."""
        names: dict[str, None] = {}
        for key in self.table.names:
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "rewards" and parts[2] == "mean" and parts[1] != "total":
                names.setdefault(parts[1])
        for sample in self.samples:
            rewards = sample.get("rewards")
            if isinstance(rewards, dict):
                names.update(dict.fromkeys(str(fn) for fn in rewards))
        return list(names)

    def _sample_columns(self) -> dict[str, np.ndarray]:
        """Per completion: each function's reward, `_total`, `_correct` (0/1), `_length`; NaN where unknown."""
        empty: dict = {}
        rewards = [s.get("rewards") if isinstance(s.get("rewards"), dict) else empty for s in self.samples]
        cols = {fn: np.array([_finite(r.get(fn)) for r in rewards], dtype=float) for fn in self.functions}
        cols["_total"] = np.array([_finite(s.get("total")) for s in self.samples], dtype=float)
        cols["_correct"] = np.array([float(c) if isinstance(c := s.get("correct"), bool) else math.nan
                                     for s in self.samples], dtype=float)
        cols["_length"] = np.array([_finite(s.get("length")) for s in self.samples], dtype=float)
        return cols


Records = Sequence[Mapping[str, Any]]


def _data(metrics: "Records | RunData", samples: Records = ()) -> RunData:
    return metrics if isinstance(metrics, RunData) else RunData(metrics, samples)


def _corr(a: np.ndarray, b: np.ndarray, min_n: int = 5) -> float | None:
    """Pearson correlation over the rows where both are known; None when undefined."""
    keep = ~(np.isnan(a) | np.isnan(b))
    if keep.sum() < min_n:
        return None
    a, b = a[keep], b[keep]
    if a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def _auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(a random positive scores above a random negative), ties counting half."""
    values = np.concatenate([positive, negative])
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]
    n_pos, n_neg = len(positive), len(negative)
    u = ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))
