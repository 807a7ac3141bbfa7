"""The Sink seam, and the text helpers every sink shares.

`Sink`: the interface every optional sink implements (each method defaults to doing nothing):
`start(info, run_dir)`, `write(step, scalars, histograms, rewards)`, `write_samples(step, samples)`,
`write_alert(alert)`, `write_final(metrics)`, `log_checkpoint(path, step)`,
`log_dataset(name, splits, metadata)`, `log_model(path, step)`, `close(status)`.
`info` is the `RunInfo` written to run.json, `run_dir` the run directory; `scalars` maps canonical
names to floats; `histograms` maps names to arrays; `rewards` maps "total" and each reward function's
name to the step's scores per completion [N] (prompt-major), for the W&B 3D views.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..rundir.writer import RunInfo, json_safe


# Sample columns shown in text and tables; long texts are cut so a step's table stays readable.
TEXT_LIMIT = 600


class Sink:
    """Where a run's records go besides the run directory; every method may be left as it is."""

    name = "sink"

    def start(self, info: RunInfo, run_dir: Path) -> None:
        """The run begins: open whatever the sink writes to."""

    def write(self, step: int, scalars: Mapping[str, float], histograms: Mapping[str, np.ndarray],
              rewards: Mapping[str, np.ndarray] | None) -> None:
        """One logged step: its scalars, histograms and the per-function reward arrays."""

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """One step's sample completions."""

    def write_alert(self, alert: Mapping[str, Any]) -> None:
        """An alert that fired."""

    def write_final(self, metrics: Mapping[str, float]) -> None:
        """The end-of-run summary metrics."""

    def log_checkpoint(self, path: str | Path, step: int) -> None:
        """A checkpoint was committed at `path`."""

    def log_dataset(self, name: str, splits: Mapping[str, Sequence[Mapping[str, Any]]],
                    metadata: Mapping[str, Any]) -> None:
        """The run's train and held-out rows."""

    def log_model(self, path: str | Path, step: int) -> None:
        """The final model's directory."""

    def flush(self) -> None:
        """Put what was written so far on disk (before a checkpoint records that it was)."""

    def close(self, status: str) -> None:
        """The run ended: flush and close."""


def _clip(text: Any, limit: int = TEXT_LIMIT) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:limit] + " [...]"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "null" if not math.isfinite(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def _md_cell(value: Any) -> str:
    return _clip(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """Sample completions as a markdown table (TensorBoard's text view)."""
    fns = list(dict.fromkeys(k for s in samples for k in (s.get("rewards") or {})))
    header = ["prompt", "completion", "answer", *fns, "total", "advantage", "length", "truncated", "correct"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in samples:
        rewards = s.get("rewards") or {}
        row = [_md_cell(s.get("prompt")), _md_cell(s.get("completion")), _md_cell(s.get("answer")),
               *(_fmt(rewards.get(fn)) for fn in fns), _fmt(s.get("total")), _fmt(s.get("advantage")),
               _fmt(s.get("length")), _fmt(s.get("truncated")), _fmt(s.get("correct"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """Nested config as `a.b` keys with plain values (lists as JSON text); None values are dropped."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif value is not None:
            out[name] = json.dumps(json_safe(value))
    return out


def tracker_config(info: RunInfo) -> dict[str, Any]:
    """What an external tracker records as the run's config: the config, plus where and with what it ran."""
    return {**info.config, "run_id": info.run_id, "versions": info.versions, "device": info.device}
