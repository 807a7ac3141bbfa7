"""The Sink seam: small event types, and a sink as `handle(event)` plus `close(status)`. Imports nothing.

Everything a run sends out is one of the events below; a sink acts on the ones it wants and ignores the
rest (TensorBoard draws scalars, samples and alerts; Trackio only scalars and the final metrics; the
run directory's writer everything it stores). Adding a thing to log is one event type and the `handle`
branches of the sinks that want it.

- `Start(info, run_dir)`: the run begins (`info` is the RunInfo of run.json).
- `Scalars(step, values, histograms, rewards, time)`: one logged step; `values` maps canonical names to
  floats, `histograms` names to arrays, `rewards` "total" and each reward function's name to the step's
  scores per completion [N] (prompt-major), for the W&B 3D views.
- `Samples(step, rows, time)`: the step's sample completions (samples.jsonl, TensorBoard's text, W&B's table).
- `Completions(step, rows)`: every completion of the step (completions/).
- `AlertEvent(record)`: an alert that fired, as its JSON record.
- `Final(metrics)`: the end-of-run summary metrics.
- `Artifact(kind, step, path, name, splits, metadata)`: a committed checkpoint, the run's dataset rows or
  the final model's directory.
- `Flush()`: put what was written so far on disk (before a checkpoint records that it was).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class Start:
    info: Any  # the RunInfo of run.json (rundir/writer.py)
    run_dir: Path


@dataclass(frozen=True)
class Scalars:
    step: int
    values: Mapping[str, float]
    histograms: Mapping[str, np.ndarray] = field(default_factory=dict)
    rewards: Mapping[str, np.ndarray] | None = None
    time: float | None = None


@dataclass(frozen=True)
class Samples:
    step: int
    rows: Sequence[Mapping[str, Any]]
    time: float | None = None


@dataclass(frozen=True)
class Completions:
    step: int
    rows: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class AlertEvent:
    record: Mapping[str, Any]

    @classmethod
    def of(cls, alert: Any) -> "AlertEvent":
        """An Alert (anything with `to_dict()`) or a mapping, as its record."""
        return cls(alert.to_dict() if hasattr(alert, "to_dict") else dict(alert))


@dataclass(frozen=True)
class Final:
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Artifact:
    kind: str  # "checkpoint" | "dataset" | "model"
    step: int | None = None
    path: str | Path | None = None  # a checkpoint's or the model's directory
    name: str | None = None  # the dataset's name
    splits: Mapping[str, Sequence[Mapping[str, Any]]] | None = None  # the dataset's rows by split
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Flush:
    pass


class Sink:
    """Where a run's records go; a sink acts on the events it wants and ignores the others."""

    name = "sink"

    def handle(self, event: Any) -> None:
        """One event of the run."""

    def close(self, status: str) -> None:
        """The run ended (`finished`, `interrupted` or `failed`): flush and close."""
